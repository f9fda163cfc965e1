"""The runtime's deferred checks: what load_om(defer_checks=True) leaves out for start-up (the
partitions' and weights' sha256 sums, the partition parse) is still checked before a result."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphopt
import graphopt.codegen.deferred_check as deferred_check
import graphopt.codegen.runtime as runtime
from graphopt.codegen import OmPartition, OmSession, load_om, write_om
from graphopt.codegen.om_file import ReplacedWhileLoading
from graphopt.errors import ArtifactError

RNG = np.random.default_rng(3)
W = RNG.standard_normal((64, 64)).astype(np.float32)  # 16 KiB: stays inside the partition


def matmul_model(w: np.ndarray = W) -> onnx.ModelProto:
    """Y = X @ W, X: float32[N, rows of W]."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", w.shape[0]])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", w.shape[1]])],
        [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    return model


@pytest.fixture
def om_path(tmp_path):
    path = tmp_path / "model.om"
    write_om(path, [OmPartition("p0", "cpu", matmul_model())])
    return path


def flip_byte_of(path, needle: bytes, out):
    data = bytearray(path.read_bytes())
    data[bytes(data).index(needle)] ^= 0x01
    out.write_bytes(bytes(data))
    return out


def forge_partition(src, dst, model: onnx.ModelProto | bytes):
    """Copy an .om with partition p0 replaced and every checksum refreshed, as a forger would."""
    with zipfile.ZipFile(src) as zf:
        members = {name: zf.read(name) for name in zf.namelist()}
    manifest = json.loads(members.pop("manifest.json"))
    members["partitions/p0.onnx"] = model if isinstance(model, bytes) else \
        model.SerializeToString()
    for name, data in members.items():
        manifest["members"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    with zipfile.ZipFile(dst, "w") as zf:
        zf.writestr("manifest.json", json.dumps(manifest), zipfile.ZIP_DEFLATED)
        for name, data in members.items():
            zf.writestr(name, data, zipfile.ZIP_STORED)
    return dst


@pytest.fixture
def threaded(monkeypatch):
    """Every deferred check on the second thread, however small the artifact."""
    monkeypatch.setattr(deferred_check, "_INLINE_CHECK_BYTES", 0)


def test_deferred_load_checks_the_rest_and_leaves_the_partition_sums(om_path, tmp_path):
    bad = flip_byte_of(om_path, W.tobytes()[:16], tmp_path / "bad.om")
    with pytest.raises(ArtifactError, match="partitions/p0.onnx' fails its sha256 check"):
        load_om(bad)
    artifact = load_om(bad, defer_checks=True)
    assert not artifact.verified and artifact.partition_members == ["partitions/p0.onnx"]
    with pytest.raises(ArtifactError, match="partitions/p0.onnx' fails its sha256 check"):
        artifact.verify_checksums()
    assert load_om(om_path).verified
    load_om(om_path, defer_checks=True).verify_checksums()
    # Everything but those sums is still checked at once: a path-escaping name, for one.
    with zipfile.ZipFile(om_path, "a") as zf:
        zf.writestr("../evil.onnx", b"x")
    with pytest.raises(ArtifactError, match="unsafe member name"):
        load_om(om_path, defer_checks=True)


def test_details_are_checked_when_first_read(tmp_path):
    path = tmp_path / "model.om"
    write_om(path, [OmPartition("p0", "cpu", matmul_model())],
             pass_log=[{"pass": "FuseEverything", "rewrites": 3}])
    bad = flip_byte_of(path, b"FuseEverything", tmp_path / "bad.om")
    with pytest.raises(ArtifactError, match="details.json' fails its sha256 check"):
        load_om(bad)
    # A run never reads them: the load and the run go ahead, and the first read refuses them.
    session = graphopt.load(bad)
    x = np.ones((2, 64), np.float32)
    np.testing.assert_allclose(session.run({"X": x})["Y"], x @ W, rtol=1e-5)
    with pytest.raises(ArtifactError, match="details.json' fails its sha256 check"):
        session.artifact.pass_log  # noqa: B018
    assert graphopt.load(path).artifact.pass_log == [{"pass": "FuseEverything", "rewrites": 3}]


def test_partition_onnxruntime_refuses_is_named_once_and_quietly(om_path, tmp_path, capsys):
    # MatMul's input W renamed to a byte that is not UTF-8: onnxruntime's error quotes it and
    # its Python binding cannot decode that, which its wrapper would answer by printing four
    # lines and trying the CPU provider again.
    with zipfile.ZipFile(om_path) as zf:
        partition = zf.read("partitions/p0.onnx")
    assert partition.count(b"\x0a\x01W") == 1  # the node's input field
    bad = forge_partition(om_path, tmp_path / "bad.om", partition.replace(b"\x0a\x01W",
                                                                          b"\x0a\x01\xff"))
    with pytest.raises(ArtifactError, match="cannot load partition 'p0': a name or string in "
                                            "the model is not valid UTF-8"):
        graphopt.load(bad)
    assert capsys.readouterr().out == ""


def test_deferred_models_are_parsed_when_asked_for(om_path, tmp_path):
    models = load_om(om_path, defer_checks=True).models
    assert list(models) == ["p0"] and len(models) == 1
    parsed = models.parse("p0")
    assert parsed is not models.parse("p0")  # not kept: the runtime's copy dies with its use
    assert models["p0"] is models["p0"]      # kept for the caller who asks by name
    assert models.parse("p0") is models["p0"]
    np.testing.assert_array_equal(numpy_helper.to_array(parsed.graph.initializer[0]), W)
    # A forged partition that is no ONNX model: refused when it is parsed, naming the file.
    bad = forge_partition(om_path, tmp_path / "bad.om", matmul_model())
    with zipfile.ZipFile(bad) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        details = zf.read("details.json")
    manifest["members"]["partitions/p0.onnx"] = {"sha256": hashlib.sha256(b"\xff" * 9).hexdigest(),
                                                 "size": 9}
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("manifest.json", json.dumps(manifest))
        zf.writestr("details.json", details)
        zf.writestr("partitions/p0.onnx", b"\xff" * 9)
    models = load_om(bad, defer_checks=True).models
    with pytest.raises(ArtifactError, match=r"bad\.om: partition 'p0' is not a valid ONNX model"):
        models["p0"]
    with pytest.raises(ArtifactError, match="is not a valid ONNX model"):
        OmSession(bad)


def test_tampered_partition_is_refused_at_the_first_run(om_path, tmp_path, threaded):
    bad = flip_byte_of(om_path, W.tobytes()[:16], tmp_path / "bad.om")
    session = OmSession(bad)  # the sessions are built while the partition is hashed
    x = RNG.standard_normal((2, 64)).astype(np.float32)
    for _ in range(2):  # refused on every call, not only the first
        with pytest.raises(ArtifactError, match="partitions/p0.onnx' fails its sha256 check"):
            session.run({"X": x})
    with pytest.raises(ArtifactError, match="partitions/p0.onnx' fails its sha256 check"):
        session.artifact  # noqa: B018 - the unverified bytes are not handed out either
    good = OmSession(om_path)
    np.testing.assert_allclose(good.run({"X": x})["Y"], x @ W, rtol=1e-5, atol=1e-5)
    assert good.artifact.path == str(om_path)


def test_small_tampered_partition_is_refused_at_load(om_path, tmp_path):
    # Below the inline bound the sums are computed before any session is built.
    bad = flip_byte_of(om_path, W.tobytes()[:16], tmp_path / "bad.om")
    with pytest.raises(ArtifactError, match="partitions/p0.onnx' fails its sha256 check"):
        graphopt.load(bad)
    with pytest.raises(ArtifactError, match="partitions/p0.onnx' fails its sha256 check"):
        OmSession(load_om(bad, defer_checks=True))


@pytest.mark.parametrize("inline", [True, False])
def test_forged_reference_never_reaches_onnxruntime(om_path, tmp_path, monkeypatch, inline,
                                                    reference_reader):
    # Checksums forged: only the runtime's own parse stands between the reference and
    # onnxruntime, which would read the file the reference names.
    if not inline:
        monkeypatch.setattr(deferred_check, "_INLINE_CHECK_BYTES", 0)
    model = matmul_model()
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "../../etc/passwd"), ("offset", "0"), ("length", "16384")):
        weight.external_data.add(key=key, value=value)
    bad = forge_partition(om_path, tmp_path / "bad.om", model)
    sessions = []
    monkeypatch.setattr(runtime.ort, "InferenceSession",
                        lambda *args, **kwargs: sessions.append(args) or pytest.fail("reached"))
    with pytest.raises(ArtifactError, match="tensor 'W' references '../../etc/passwd', which is "
                                            "not a weights member of the artifact"):
        OmSession(bad)
    assert sessions == []


def test_tampered_partition_of_a_mapped_weights_artifact_fails_the_first_run(tmp_path):
    # 1 MiB of weights: a blob, and the partition and blob sums go to the second thread.
    w = np.arange(512 * 512, dtype=np.float32).reshape(512, 512) / 1e5
    path = tmp_path / "big.om"
    write_om(path, [OmPartition("p0", "cpu", matmul_model(w))])
    with zipfile.ZipFile(path) as zf:
        assert "weights/p0.bin" in zf.namelist()
        stored = zf.read("partitions/p0.onnx")
    model = onnx.load_from_string(stored)
    assert model.graph.output[0].name == "Y"
    # A bit flipped in the output's declared dim name: still a valid model that runs.
    data = bytearray(path.read_bytes())
    at = bytes(data).index(stored) + stored.index(b"\x12\x01N")  # dim_param "N" of X
    data[at + 2] ^= 0x01
    bad = tmp_path / "bad.om"
    bad.write_bytes(bytes(data))
    session = OmSession(bad)
    x = np.ones((1, 512), np.float32)
    with pytest.raises(ArtifactError, match="partitions/p0.onnx' fails its sha256 check"):
        session.run({"X": x})
    np.testing.assert_allclose(OmSession(path).run({"X": x})["Y"], x @ w, rtol=1e-5)


def test_a_run_failing_on_a_tampered_artifact_reports_the_checksum(om_path, tmp_path, threaded,
                                                                   monkeypatch):
    # The first run overlaps the deferred sums; when it fails, the failed sum explains it best.
    bad = flip_byte_of(om_path, W.tobytes()[:16], tmp_path / "bad.om")
    session = OmSession(bad)

    def broken(step, feeds):
        raise runtime.GraphoptError(f"partition {step.name!r} failed in onnxruntime: boom")

    monkeypatch.setattr(runtime, "_call", broken)
    with pytest.raises(ArtifactError, match="partitions/p0.onnx' fails its sha256 check"):
        session.run({"X": np.ones((1, 64), np.float32)})


@pytest.mark.parametrize("workers", [1, 3])
def test_weights_blob_sums_on_any_number_of_threads(tmp_path, monkeypatch, workers):
    # One thread hashes the whole blob in one call; several hash its chunks side by side.
    monkeypatch.setattr("graphopt.codegen.om_write.CHUNK_BYTES", 256 << 10)
    w = np.arange(512 * 512, dtype=np.float32).reshape(512, 512) / 1e5  # 1 MiB: 4 chunks
    path = tmp_path / "big.om"
    write_om(path, [OmPartition("p0", "cpu", matmul_model(w))])
    entry = load_om(path).manifest["members"]["weights/p0.bin"]
    assert len(entry["chunk_sha256"]) == 4
    load_om(path, defer_checks=True).verify_weights(workers)
    data = bytearray(path.read_bytes())
    data[bytes(data).index(w.tobytes()[-4096:]) + 100] ^= 0x01  # in the last chunk
    bad = tmp_path / "bad.om"
    bad.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="weights/p0.bin' fails its sha256 check"):
        load_om(bad, defer_checks=True).verify_weights(workers)


def test_a_mapped_artifact_rewritten_in_place_is_refused_and_a_renamed_one_is_not(tmp_path):
    big = RNG.standard_normal((512, 1024)).astype(np.float32)  # 2 MiB: a mapped weights blob
    live, new = tmp_path / "live.om", tmp_path / "new.om"
    write_om(live, [OmPartition("p0", "cpu", matmul_model(big))])
    write_om(new, [OmPartition("p0", "cpu", matmul_model(big * 2))])
    assert load_om(live).spans
    x = RNG.standard_normal((2, 512)).astype(np.float32)
    session = graphopt.load(live)
    before = session.run({"X": x})["Y"]
    os.replace(new, live)  # a new file renamed over the path: the session keeps the old one
    np.testing.assert_array_equal(session.run({"X": x})["Y"], before)
    rewritten = graphopt.load(live)
    rewritten.run({"X": x})  # its checksums done: later runs take the plain-feeds shortcut
    assert rewritten._direct is not None and rewritten._pending is None
    write_om(new, [OmPartition("p0", "cpu", matmul_model(big * 3))])
    with open(live, "r+b") as f:  # what `cp new.om live.om` does
        f.write(new.read_bytes())
        f.truncate()
    with pytest.raises(ArtifactError, match="rewritten in place after it was loaded"):
        rewritten.run({"X": x})


def test_weights_are_read_and_checked_through_the_file_opened_at_load(tmp_path, monkeypatch):
    # What the path names after load_om returns does not matter: a new file renamed over it,
    # the file deleted, the working directory changed under a relative path.
    big = RNG.standard_normal((512, 1024)).astype(np.float32)
    live, other = tmp_path / "live.om", tmp_path / "other.om"
    write_om(live, [OmPartition("p0", "cpu", matmul_model(big))])
    write_om(other, [OmPartition("p0", "cpu", matmul_model(big * 2))])
    monkeypatch.chdir(tmp_path)
    replaced = load_om("live.om", defer_checks=True)
    removed = load_om("other.om", defer_checks=True)
    os.replace("other.om", "live.om")
    monkeypatch.chdir("/")
    replaced.verify_weights()
    removed.verify_weights()
    stored = onnx.load_from_string(replaced.partition_model("p0").SerializeToString())
    np.testing.assert_array_equal(numpy_helper.to_array(stored.graph.initializer[0]), big)
    assert replaced.location == str(live)


def test_a_session_over_a_file_replaced_since_load_om_is_refused(tmp_path):
    # onnxruntime maps the weights by path: had the path changed, it would map another file's
    # weights than the ones load_om checked.
    big = RNG.standard_normal((512, 1024)).astype(np.float32)
    live, new = tmp_path / "live.om", tmp_path / "new.om"
    write_om(live, [OmPartition("p0", "cpu", matmul_model(big))])
    write_om(new, [OmPartition("p0", "cpu", matmul_model(big * 2))])
    artifact = load_om(live, defer_checks=True)
    os.replace(new, live)
    with pytest.raises(ArtifactError, match="live.om was replaced or removed while it was being "
                                            "loaded: load it again"):
        OmSession(artifact)
    x = RNG.standard_normal((2, 512)).astype(np.float32)
    np.testing.assert_allclose(OmSession(live).run({"X": x})["Y"], x @ (big * 2), rtol=1e-4)


def test_load_reads_again_an_artifact_a_save_renamed_over_it_mid_load(tmp_path, monkeypatch):
    # A pipeline reloading while another process saves: a third of the loads had failed with
    # "replaced or removed while it was being loaded: load it again".
    from graphopt.codegen.om_file import OpenedFile

    big = RNG.standard_normal((512, 1024)).astype(np.float32)
    live, new = tmp_path / "live.om", tmp_path / "new.om"
    write_om(live, [OmPartition("p0", "cpu", matmul_model(big))])
    write_om(new, [OmPartition("p0", "cpu", matmul_model(big * 2))])
    checked = OpenedFile.check_still_at_path
    renames = []

    def renamed_once(self):
        if not renames:  # the save lands between the load's read and its sessions
            renames.append(os.replace(new, live))
        checked(self)

    monkeypatch.setattr(OpenedFile, "check_still_at_path", renamed_once)
    x = RNG.standard_normal((2, 512)).astype(np.float32)
    np.testing.assert_allclose(graphopt.load(live).run({"X": x})["Y"], x @ (big * 2), rtol=1e-4)
    assert renames == [None]

    def always_replaced(self):
        raise ReplacedWhileLoading(f"{self.label} was replaced or removed while it was being "
                                   "loaded: load it again")

    monkeypatch.setattr(OpenedFile, "check_still_at_path", always_replaced)
    with pytest.raises(ArtifactError, match="was replaced or removed while it was being loaded"):
        graphopt.load(live)


def test_a_pickled_session_refuses_an_artifact_replaced_since(om_path, tmp_path):
    # A worker that unpickles a session after a deploy renamed another model over the path
    # would run that model under the old one's name.
    import pickle

    session = graphopt.load(om_path)
    blob = pickle.dumps(session)
    x = RNG.standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_array_equal(pickle.loads(blob).run({"X": x})["Y"],
                                  session.run({"X": x})["Y"])
    other = tmp_path / "other.om"
    write_om(other, [OmPartition("p0", "cpu", matmul_model(W * 2))])
    os.replace(other, om_path)
    with pytest.raises(ArtifactError, match="holds another artifact than the session that was "
                                            "pickled or copied"):
        pickle.loads(blob)


def test_a_session_loaded_by_relative_path_pickles_after_a_chdir(om_path, monkeypatch):
    import pickle

    monkeypatch.chdir(om_path.parent)
    session = graphopt.load(om_path.name)
    monkeypatch.chdir("/")
    x = RNG.standard_normal((2, 64)).astype(np.float32)
    copy = pickle.loads(pickle.dumps(session))
    np.testing.assert_array_equal(copy.run({"X": x})["Y"], session.run({"X": x})["Y"])


@pytest.mark.parametrize("blob", [False, True])
def test_close_releases_the_sessions_and_the_file_and_run_then_refuses(tmp_path, blob):
    # A small artifact (checked at once, no file kept open) and a mapped weights blob (the
    # file held open, sums on a second thread that close must let finish).
    w = (np.arange(512 * 512, dtype=np.float32).reshape(512, 512) / 1e5 if blob
         else np.ones((4, 4), np.float32))
    path = tmp_path / "m.om"
    write_om(path, [OmPartition("p0", "cpu", matmul_model(w))])
    x = np.ones((1, w.shape[0]), np.float32)
    fds = len(os.listdir("/proc/self/fd"))
    with OmSession(path) as session:
        np.testing.assert_allclose(session.run({"X": x})["Y"], x @ w, rtol=1e-5)
        assert len(os.listdir("/proc/self/fd")) == fds + (1 if blob else 0)
    assert len(os.listdir("/proc/self/fd")) == fds  # closed on leaving the block, not at gc
    with pytest.raises(runtime.GraphoptError, match="the session was closed; load the "
                                                    "artifact again"):
        session.run({"X": x})
    session.close()  # again: nothing to do
    assert session.inputs[0]["name"] == "X"  # the signature stays readable


def test_a_run_that_a_close_overtakes_says_the_session_was_closed(tmp_path):
    # run() on one thread, close() on another: a run past its first checks found the
    # artifact's file closed under it, and raised OSError (EBADF) from its in-place check.
    w = np.arange(512 * 512, dtype=np.float32).reshape(512, 512) / 1e5  # mapped: a blob
    path = tmp_path / "m.om"
    write_om(path, [OmPartition("p0", "cpu", matmul_model(w))])
    x = {"X": np.ones((1, 512), np.float32)}
    session = OmSession(path)
    session.run(x)
    direct, mapped = session._direct, session._mapped  # as a racing run holds them
    assert direct is not None and mapped is not None
    session.close()
    with pytest.raises(runtime.GraphoptError, match="the session was closed"):
        direct(x)
    session._mapped = mapped  # read by run() before close() cleared it
    with pytest.raises(runtime.GraphoptError, match="the session was closed"):
        session.run(x)


def test_a_process_forked_before_the_sums_are_done_checks_them_itself(tmp_path, monkeypatch):
    # A pre-fork server loads in its master and forks: the checking thread does not come
    # along, and the child used to take its join for a pass and return results computed from
    # tampered weights.
    import threading

    w = np.arange(512 * 512, dtype=np.float32).reshape(512, 512) / 1e5  # 1 MiB: a blob
    path = tmp_path / "big.om"
    write_om(path, [OmPartition("p0", "cpu", matmul_model(w))])
    bad = flip_byte_of(path, w.tobytes()[4096:4112], tmp_path / "bad.om")  # a weight's bits
    started, release = threading.Event(), threading.Event()
    verify = runtime.OmArtifact.verify_weights

    parent = os.getpid()

    def held(self, *args, **kwargs):  # the parent's check still running when it forks
        if os.getpid() == parent:
            started.set()
            release.wait(30)
        return verify(self, *args, **kwargs)

    monkeypatch.setattr(runtime.OmArtifact, "verify_weights", held)
    session = OmSession(bad)
    assert started.wait(30)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what its run did, then leave at once
        try:
            session.run({"X": np.ones((1, 512), np.float32)})
            verdict = b"returned"
        except ArtifactError as exc:
            verdict = b"refused" if b"sha256" in str(exc).encode() else b"other"
        except BaseException:  # noqa: BLE001
            verdict = b"other"
        os.write(write, verdict)
        os._exit(0)
    os.close(write)
    release.set()
    _, status = os.waitpid(pid, 0)
    verdict = os.read(read, 64)
    os.close(read)
    assert status == 0 and verdict == b"refused", verdict
    with pytest.raises(ArtifactError, match="fails its sha256 check"):
        session.run({"X": np.ones((1, 512), np.float32)})


def test_an_opened_file_closes_quietly_once_its_modules_globals_are_gone(tmp_path, monkeypatch):
    # At interpreter exit a module's globals become None before the objects that use them go:
    # an artifact still loaded then had printed "Exception ignored in OpenedFile.__del__".
    import graphopt.codegen.om_file as om_file

    path = tmp_path / "blob"
    path.write_bytes(b"x" * 16)
    opened = om_file.OpenedFile(os.open(path, os.O_RDONLY), str(path))
    for name in [n for n in vars(om_file) if not n.startswith("__")]:
        monkeypatch.setattr(om_file, name, None)
    opened.__del__()  # no exception
    monkeypatch.undo()
    opened.close()
    assert opened.closed
