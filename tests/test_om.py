"""The .om container (write, load, verify), its atomic writing and the OmSession runtime."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import stat
import time
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from helpers import IR_VERSION

import graphopt
from graphopt import numerics, zoo
from graphopt.atomic import atomic_write, atomic_write_bytes
from graphopt.codegen import OmPartition, OmSession, load_om, om_read, write_om
from graphopt.codegen.om import DETAILS_SCHEMA, MANIFEST_SCHEMA, is_om
from graphopt.errors import ArtifactError, GraphoptError, OptionError

RNG = np.random.default_rng(0)
W = RNG.standard_normal((4, 3)).astype(np.float32)
W_SQUARE = RNG.standard_normal((4, 4)).astype(np.float32)


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    # IR 9 / opset 17: well inside what the pinned onnxruntime accepts.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    return model


def _tensor(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def matmul_relu() -> onnx.ModelProto:
    """Y = Relu(X @ W), X: float32[N, 4]."""
    return _model(
        [helper.make_node("MatMul", ["X", "W"], ["H"]), helper.make_node("Relu", ["H"], ["Y"])],
        [_tensor("X", ["N", 4])],
        [_tensor("Y", ["N", 3])],
        [numpy_helper.from_array(W, "W")],
    )


def split_matmul_relu() -> list[OmPartition]:
    """matmul_relu cut by hand between its two nodes; H crosses the cut."""
    p0 = _model(
        [helper.make_node("MatMul", ["X", "W"], ["H"])],
        [_tensor("X", ["N", 4])],
        [_tensor("H", ["N", 3])],
        [numpy_helper.from_array(W, "W")],
    )
    p1 = _model(
        [helper.make_node("Relu", ["H"], ["Y"])], [_tensor("H", ["N", 3])], [_tensor("Y", ["N", 3])]
    )
    return [OmPartition("p0", "cpu", p0), OmPartition("p1", "cpu", p1)]


def reference(model: onnx.ModelProto, feeds: dict) -> dict:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def x_batch(n: int = 2) -> np.ndarray:
    return RNG.standard_normal((n, 4)).astype(np.float32)


@pytest.fixture
def om_path(tmp_path):
    path = tmp_path / "model.om"
    write_om(path, [OmPartition("p0", "cpu", matmul_relu())], source_path="/somewhere/model.onnx",
             source_bytes_sha256="ab" * 32, pass_log=[{"pass": "fold", "changed": 1}])
    return path


# --- round trips ---------------------------------------------------------------------------


def test_round_trip_runs_like_onnxruntime(om_path):
    x = x_batch(3)
    session = OmSession(om_path)
    got = session.run({"X": x})
    want = reference(matmul_relu(), {"X": x})
    assert list(got) == ["Y"]
    np.testing.assert_allclose(got["Y"], want["Y"], rtol=1e-6)
    assert session.inputs == [{"name": "X", "dtype": "float32", "shape": ["N", 4]}]
    assert session.outputs == [{"name": "Y", "dtype": "float32", "shape": ["N", 3]}]


def test_manifest_contents(om_path):
    artifact = load_om(om_path)
    m = artifact.manifest
    assert m["format"] == "graphopt-om" and m["format_version"] == 1
    assert m["created_by"] == "graphopt" and m["target"] == "cpu"
    assert m["source"] == {"path": "model.onnx", "sha256": "ab" * 32}  # basename only
    assert m["partitions"] == [
        {"name": "p0", "device": "cpu", "member": "partitions/p0.onnx",
         "inputs": ["X"], "outputs": ["Y"]}
    ]
    assert m["execution_order"] == ["p0"]
    assert artifact.pass_log == [{"pass": "fold", "changed": 1}]
    # The log lives in the details member; the manifest keeps empty ones for older readers.
    assert m["details"] == "details.json" and m["pass_log"] == [] and m["extra"] == {}
    data = artifact.member("partitions/p0.onnx")
    assert m["members"]["partitions/p0.onnx"] == {
        "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)
    }
    assert set(m) == set(MANIFEST_SCHEMA["required"]) | {"details"}
    assert set(artifact.details) == set(DETAILS_SCHEMA["required"])
    assert artifact.partitions[0].model.graph.node[0].op_type == "MatMul"


def test_an_artifact_using_a_feature_older_readers_ignore_is_format_3(tmp_path):
    # Releases before a feature ignore keys they do not know: a partition whose session must
    # not run MatmulTransposeFusion ran with it there, 1.7 off. Such an artifact is version 3,
    # which they refuse, and names what it requires.
    parts = split_matmul_relu()
    parts[1].disabled_optimizers = ["MatmulTransposeFusion"]
    write_om(tmp_path / "a.om", parts)
    manifest = load_om(tmp_path / "a.om").manifest
    assert manifest["format_version"] == 3 and manifest["requires"] == ["disabled_optimizers"]
    x = x_batch()
    want = reference(matmul_relu(), {"X": x})["Y"]
    np.testing.assert_allclose(OmSession(tmp_path / "a.om").run({"X": x})["Y"], want, rtol=1e-6)
    write_om(tmp_path / "b.om", split_matmul_relu())
    assert load_om(tmp_path / "b.om").manifest["format_version"] == 1  # as before
    assert "requires" not in load_om(tmp_path / "b.om").manifest


def test_source_sha256_is_computed_from_the_file(tmp_path):
    source = tmp_path / "src.onnx"
    source.write_bytes(matmul_relu().SerializeToString())
    write_om(tmp_path / "a.om", [OmPartition("p0", "cpu", matmul_relu())], source_path=source)
    assert load_om(tmp_path / "a.om").manifest["source"] == {
        "path": "src.onnx", "sha256": hashlib.sha256(source.read_bytes()).hexdigest()
    }


def test_two_chained_partitions_route_by_name(tmp_path):
    path = tmp_path / "two.om"
    write_om(path, split_matmul_relu())
    artifact = load_om(path)
    assert [i["name"] for i in artifact.inputs] == ["X"]
    assert [o["name"] for o in artifact.outputs] == ["Y"]
    assert artifact.routing == [
        {"tensor": "X", "from": None, "to": "p0"},
        {"tensor": "H", "from": "p0", "to": "p1"},
        {"tensor": "Y", "from": "p1", "to": None},
    ]
    x = x_batch(5)
    session = OmSession(artifact)
    want = reference(matmul_relu(), {"X": x})["Y"]
    np.testing.assert_allclose(session.run({"X": x})["Y"], want, rtol=1e-6)
    # Intermediate tensors can be asked for by name; only the partitions they need run.
    np.testing.assert_allclose(session.run({"X": x}, ["H"])["H"], x @ W, rtol=1e-5)


def test_top_level_input_feeding_two_partitions(tmp_path):
    x_info, h_info, y_info = _tensor("X", ["N", 4]), _tensor("H", ["N", 4]), _tensor("Y", ["N", 4])
    p0 = _model([helper.make_node("MatMul", ["X", "W"], ["H"])], [x_info], [h_info],
                [numpy_helper.from_array(W_SQUARE, "W")])
    p1 = _model([helper.make_node("Add", ["H", "X"], ["Y"])], [h_info, x_info], [y_info])
    path = tmp_path / "fan.om"
    write_om(path, [OmPartition("p0", "cpu", p0), OmPartition("p1", "cpu", p1)])
    artifact = load_om(path)
    assert [i["name"] for i in artifact.inputs] == ["X"]  # fed once, routed to both
    assert {"tensor": "X", "from": None, "to": "p1"} in artifact.routing
    x = x_batch(2)
    np.testing.assert_allclose(OmSession(artifact).run({"X": x})["Y"], x @ W_SQUARE + x, rtol=1e-5)


def test_out_of_order_partitions_are_refused(tmp_path):
    with pytest.raises(ValueError, match="execution order"):
        write_om(tmp_path / "bad.om", list(reversed(split_matmul_relu())))
    assert not (tmp_path / "bad.om").exists()


def test_extra_members_round_trip(tmp_path):
    path = tmp_path / "x.om"
    write_om(path, [OmPartition("p0", "cpu", matmul_relu())],
             extra_members={"tuning/records.json": b"[]"}, extra={"note": "hi"})
    artifact = load_om(path)
    assert artifact.member("tuning/records.json") == b"[]"
    assert artifact.extra == {"note": "hi"}
    with pytest.raises(ValueError, match="unsafe member name"):
        write_om(tmp_path / "y.om", [OmPartition("p0", "cpu", matmul_relu())],
                 extra_members={"../x": b""})
    # inspect lists them in natural order: p2 before p10 (it put p10 between p0 and p2).
    from graphopt.codegen.inspect_om import format_om

    write_om(path, [OmPartition("p0", "cpu", matmul_relu())],
             extra_members={f"data/p{i}.bin": b"" for i in (0, 10, 2)})
    text = format_om(load_om(path))
    assert text.index("data/p2.bin") < text.index("data/p10.bin"), text


def test_same_input_gives_identical_bytes(tmp_path):
    for name in ("a.om", "b.om"):
        write_om(tmp_path / name, split_matmul_relu(), source_path="m.onnx",
                 source_bytes_sha256="0" * 64, pass_log=[{"pass": "fuse"}], extra={"b": 1, "a": 2})
    assert (tmp_path / "a.om").read_bytes() == (tmp_path / "b.om").read_bytes()
    with zipfile.ZipFile(tmp_path / "a.om") as zf:
        names = zf.namelist()
        assert names[0] == "manifest.json" and names[1:] == sorted(names[1:])
        assert {info.date_time for info in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        # Every member is stored, so a load inflates nothing.
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}


def test_stored_member_with_a_corrupt_local_header_is_refused(om_path, tmp_path):
    data = bytearray(om_path.read_bytes())
    with zipfile.ZipFile(om_path) as zf:
        offset = zf.getinfo("partitions/p0.onnx").header_offset
    data[offset:offset + 4] = b"XXXX"
    bad = tmp_path / "bad.om"
    bad.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="partitions/p0.onnx.*corrupt"):
        load_om(bad)


def _flip_byte_of(path, needle: bytes, out):
    data = bytearray(path.read_bytes())
    data[bytes(data).index(needle)] ^= 0x01
    out.write_bytes(bytes(data))
    return out


def test_small_weights_stay_in_the_model_and_are_checked_at_load(om_path, tmp_path):
    weights = numpy_helper.to_array(matmul_relu().graph.initializer[0]).tobytes()
    bad = _flip_byte_of(om_path, weights[:16], tmp_path / "bad.om")
    with pytest.raises(ArtifactError, match="partitions/p0.onnx' fails its sha256 check"):
        OmSession(bad)


def big_matmul() -> onnx.ModelProto:
    """Y = X @ W with a 1 MiB W: large enough for the artifact to keep it in a weights blob."""
    w = np.arange(512 * 512, dtype=np.float32).reshape(512, 512) / 1e5
    return _model([helper.make_node("MatMul", ["X", "W"], ["Y"])], [_tensor("X", ["N", 512])],
                  [_tensor("Y", ["N", 512])], [numpy_helper.from_array(w, "W")])


def test_large_weights_are_a_blob_onnxruntime_maps(tmp_path):
    path = tmp_path / "big.om"
    write_om(path, [OmPartition("p0", "cpu", big_matmul())])
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("weights/p0.bin")
        assert info.compress_type == zipfile.ZIP_STORED and info.file_size == 512 * 512 * 4
        model = onnx.load_from_string(zf.read("partitions/p0.onnx"))
    (w,) = model.graph.initializer
    assert w.data_location == onnx.TensorProto.EXTERNAL and not w.raw_data
    artifact = load_om(path)
    offset, size = artifact.spans["weights/p0.bin"]
    assert offset % 4096 == 0 and size == 512 * 512 * 4  # page aligned: mapped as is
    full = artifact.partition_model("p0")
    np.testing.assert_array_equal(numpy_helper.to_array(full.graph.initializer[0]),
                                  numpy_helper.to_array(big_matmul().graph.initializer[0]))
    x = np.ones((2, 512), np.float32)
    expected = x @ numpy_helper.to_array(big_matmul().graph.initializer[0])
    np.testing.assert_allclose(OmSession(path).run({"X": x})["Y"], expected, rtol=1e-5)


def test_small_weights_stay_in_one_protobuf(om_path):
    with zipfile.ZipFile(om_path) as zf:
        assert not [n for n in zf.namelist() if n.startswith("weights/")]


def test_runtime_without_the_folder_setting_copies_the_weights_in(tmp_path, monkeypatch):
    # An onnxruntime that does not know where bytes-loaded models keep external data cannot
    # map the blob; the runtime then hands it the weights inside the model instead.
    import graphopt.codegen.partition_sessions as partition_sessions
    import graphopt.codegen.runtime as runtime

    monkeypatch.setattr(partition_sessions, "_EXTERNAL_FOLDER", "session.graphopt_test_unknown_entry")
    monkeypatch.chdir(tmp_path)  # nothing named like the artifact where onnxruntime would look
    path = tmp_path / "sub" / "big.om"
    path.parent.mkdir()
    write_om(path, [OmPartition("p0", "cpu", big_matmul())])
    copied = []
    original = runtime.OmArtifact.partition_model
    monkeypatch.setattr(runtime.OmArtifact, "partition_model",
                        lambda self, name: copied.append(name) or original(self, name))
    x = np.ones((1, 512), np.float32)
    expected = x @ numpy_helper.to_array(big_matmul().graph.initializer[0])
    np.testing.assert_allclose(OmSession(path).run({"X": x})["Y"], expected, rtol=1e-5)
    assert copied == ["p0"]


def test_large_blobs_are_checked_chunk_by_chunk(tmp_path, monkeypatch):
    w = np.random.default_rng(0).standard_normal((1536, 1536)).astype(np.float32)  # 9 MiB
    model = _model([helper.make_node("MatMul", ["X", "W"], ["Y"])], [_tensor("X", ["N", 1536])],
                   [_tensor("Y", ["N", 1536])], [numpy_helper.from_array(w, "W")])
    path = tmp_path / "chunks.om"
    write_om(path, [OmPartition("p0", "cpu", model)])
    entry = load_om(path).manifest["members"]["weights/p0.bin"]
    assert entry["chunk_bytes"] == 4 << 20 and len(entry["chunk_sha256"]) == 3
    x = np.ones((1, 1536), np.float32)
    np.testing.assert_allclose(OmSession(path).run({"X": x})["Y"], x @ w, rtol=1e-4, atol=1e-3)
    bad = _flip_byte_of(path, w.tobytes()[-4096:-4080], tmp_path / "bad.om")  # in chunk 2
    with pytest.raises(ArtifactError, match="weights/p0.bin' fails its sha256 check"):
        load_om(bad)

    def shorten(manifest, members):
        manifest["members"]["weights/p0.bin"]["chunk_sha256"].pop()

    with pytest.raises(ArtifactError, match="malformed chunk checksums"):
        load_om(rewrite(path, tmp_path / "short.om", shorten))

    def wrong_whole_sum(manifest, members):  # the chunks' sums right, the blob's not
        manifest["members"]["weights/p0.bin"]["sha256"] = "0" * 64

    # A full check (inspect, the tools) refuses it on any number of cores.
    edited = rewrite(path, tmp_path / "whole.om", wrong_whole_sum)
    for cores in (1, 2, 8):
        monkeypatch.setattr(om_read, "cpu_count", lambda cores=cores: cores)
        with pytest.raises(ArtifactError, match="weights/p0.bin' fails its sha256 check"):
            load_om(edited)


def test_tampered_weights_blob_fails_the_first_run(tmp_path, reference_reader):
    path = tmp_path / "big.om"
    write_om(path, [OmPartition("p0", "cpu", big_matmul())])
    w = numpy_helper.to_array(big_matmul().graph.initializer[0]).tobytes()
    bad = _flip_byte_of(path, w[400:416], tmp_path / "bad.om")
    with pytest.raises(ArtifactError, match="weights/p0.bin' fails its sha256 check"):
        load_om(bad)
    # The session maps the weights while they are hashed; no result leaves it unverified.
    session = OmSession(bad)
    for _ in range(2):
        with pytest.raises(ArtifactError, match="weights/p0.bin' fails its sha256 check"):
            session.run({"X": np.ones((1, 512), np.float32)})


@pytest.mark.parametrize("reference, message", [
    ({"location": "../../etc/passwd", "offset": "0", "length": "4"}, "not a weights member"),
    ({"location": "weights/p0.bin", "offset": str(512 * 512 * 4 - 4), "length": "8"},
     "past the end"),
    ({"location": "weights/p0.bin", "offset": "0", "length": "4", "checksum": "x"},
     "graphopt does not write"),
])
def test_external_references_outside_the_weights_are_refused(tmp_path, reference, message,
                                                             reference_reader):
    path = tmp_path / "big.om"
    write_om(path, [OmPartition("p0", "cpu", big_matmul())])

    def point_elsewhere(manifest, members):
        model = onnx.load_from_string(members["partitions/p0.onnx"])
        tensor = model.graph.initializer[0]
        del tensor.external_data[:]
        for key, value in reference.items():
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        members["partitions/p0.onnx"] = model.SerializeToString()
        _resum(manifest, members)

    bad = rewrite(path, tmp_path / "bad.om", point_elsewhere)
    with pytest.raises(ArtifactError, match=message):
        load_om(bad)
    with pytest.raises(ArtifactError, match=message):
        OmSession(bad)


def _escaping_tensor(name="T"):
    tensor = numpy_helper.from_array(np.zeros(1, np.float32), name)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "../../etc/passwd"), ("offset", "0"), ("length", "4")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def _in_constant(model):
    model.graph.node.insert(0, helper.make_node("Constant", [], ["C"], value=_escaping_tensor()))


def _in_tensors_attr(model):
    node = model.graph.node[0]
    node.attribute.append(helper.make_attribute("extra", [_escaping_tensor()]))


def _in_sparse_initializer(model):
    sparse = model.graph.sparse_initializer.add()
    sparse.values.CopyFrom(_escaping_tensor("S"))
    sparse.indices.CopyFrom(numpy_helper.from_array(np.zeros(1, np.int64), "S_i"))
    sparse.dims.append(4)


def _in_subgraph(model):
    branch = helper.make_graph([helper.make_node("Constant", [], ["B"], value=_escaping_tensor())],
                               "branch", [], [_tensor("B", [1])])
    cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
    model.graph.initializer.append(cond)
    model.graph.node.append(helper.make_node("If", ["cond"], ["unused"], then_branch=branch,
                                             else_branch=branch))


def _in_function(model):
    # A model-local function's Constant: onnxruntime read the file from the caller's working
    # folder (an artifact without weights) or the artifact's own.
    body = [helper.make_node("Constant", [], ["out"], value=_escaping_tensor())]
    model.functions.append(helper.make_function("evil.dom", "Leak", [], ["out"], body,
                                                [helper.make_opsetid("", 17)]))
    model.opset_import.append(helper.make_opsetid("evil.dom", 1))
    model.graph.node.insert(0, helper.make_node("Leak", [], ["leaked"], domain="evil.dom"))


@pytest.mark.parametrize("hide", [_in_constant, _in_tensors_attr, _in_sparse_initializer,
                                  _in_subgraph, _in_function])
def test_external_references_in_nodes_and_subgraphs_are_refused(om_path, tmp_path, hide,
                                                                 reference_reader):
    model = matmul_relu()
    hide(model)
    bad = rewrite(om_path, tmp_path / "bad.om", swap_partition(model))
    with pytest.raises(ArtifactError, match=r"references '\.\./\.\./etc/passwd', which is not"):
        load_om(bad)
    with pytest.raises(ArtifactError, match=r"references '\.\./\.\./etc/passwd', which is not"):
        OmSession(bad)


def test_session_leaves_the_artifacts_kept_models_as_they_are(tmp_path, reference_reader):
    path = tmp_path / "big.om"
    write_om(path, [OmPartition("p0", "cpu", big_matmul())])
    artifact = load_om(path)  # parses and keeps every partition model
    before = artifact.models["p0"].SerializeToString()
    x = np.ones((1, 512), np.float32)
    expected = x @ numpy_helper.to_array(big_matmul().graph.initializer[0])
    np.testing.assert_allclose(OmSession(artifact).run({"X": x})["Y"], expected, rtol=1e-5)
    assert artifact.models["p0"].SerializeToString() == before
    np.testing.assert_allclose(reference(artifact.partition_model("p0"), {"X": x})["Y"], expected,
                               rtol=1e-5)


def test_is_om(om_path, tmp_path):
    assert is_om(om_path)
    plain = tmp_path / "plain.zip"
    with zipfile.ZipFile(plain, "w") as zf:
        zf.writestr("a.txt", "x")
    text = tmp_path / "t.txt"
    text.write_text("hello")
    assert not is_om(plain) and not is_om(text) and not is_om(tmp_path / "missing.om")


# --- malformed artifacts -------------------------------------------------------------------


def rewrite(src, dst, mutate):
    """Copy an .om, letting `mutate(manifest, members)` edit it; checksums are not refreshed."""
    with zipfile.ZipFile(src) as zf:
        members = {name: zf.read(name) for name in zf.namelist()}
    manifest = json.loads(members.pop("manifest.json"))
    mutate(manifest, members)
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zf:
        if manifest is not None:
            zf.writestr("manifest.json", json.dumps(manifest))
        for name, data in members.items():
            stored = name.startswith("weights/")  # graphopt never compresses weights
            zf.writestr(name, data, zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED)
    return dst


def _resum(manifest, members):
    """Refresh every member's checksum, as a forger would."""
    for name, data in members.items():
        manifest["members"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def add_listed_member(name):
    def mutate(manifest, members):
        members[name] = b"payload"
        manifest["members"][name] = {"sha256": hashlib.sha256(b"payload").hexdigest(), "size": 7}
    return mutate


def set_field(key, value):
    def mutate(manifest, members):
        manifest[key] = value
    return mutate


def tamper(manifest, members):
    data = bytearray(members["partitions/p0.onnx"])
    data[-1] ^= 0xFF
    members["partitions/p0.onnx"] = bytes(data)


def drop_member(manifest, members):
    del members["partitions/p0.onnx"]


def drop_manifest(manifest, members):
    manifest.clear()
    members["other.txt"] = b"x"


def forge_routing(manifest, members):
    manifest["routing"][0]["from"] = "p9"


def bad_disabled_optimizers(manifest, members):
    manifest["partitions"][0]["disabled_optimizers"] = "WeightBiasQuantization"


def bad_prepack_weights(manifest, members):
    manifest["partitions"][0]["prepack_weights"] = "no"


def bad_index_rows(manifest, members):
    manifest["inputs"][0]["index_rows"] = 0


def index_rows_on_floats(manifest, members):
    manifest["inputs"][0]["index_rows"] = 8  # X is float32: no table takes it as ids


def bad_index_dims(manifest, members):
    manifest["inputs"][0]["index_dims"] = [[5, 8]]  # X has rank 2


def negative_dim(manifest, members):
    manifest["inputs"][0]["shape"] = ["N", -5]


def tamper_details(manifest, members):
    members["details.json"] = members["details.json"].replace(b"fold", b"FOLD")


def details_elsewhere(manifest, members):
    manifest["details"] = "partitions/p0.onnx"


BAD_CASES = {
    "future_version": (set_field("format_version", 4), r"format_version 4 is newer .* upgrade graphopt"),
    # A feature this reader does not know: ignoring it (as releases before version 3 ignored
    # disabled_optimizers) would compute other results.
    "unknown_feature": (lambda manifest, members: manifest.update(
        format_version=3, requires=["fancy_rounding"]),
        r"requires 'fancy_rounding', which this graphopt does not know; upgrade graphopt"),
    "requires_in_v1": (set_field("requires", ["disabled_optimizers"]),
                       "manifest lists requires, which need format_version 3"),
    "zero_version": (set_field("format_version", 0), "unsupported format_version 0"),
    "wrong_format": (set_field("format", "tflite"), r"not a graphopt \.om .*'tflite'"),
    "checksum": (tamper, r"member 'partitions/p0.onnx' fails its sha256 check"),
    "path_escape": (add_listed_member("../evil.onnx"), r"unsafe member name '\.\./evil\.onnx'"),
    "absolute": (add_listed_member("/etc/evil.onnx"), "unsafe member name '/etc/evil.onnx'"),
    "line_break": (add_listed_member("evil\nname.txt"),  # it reached inspect's listing
                   r"unsafe member name 'evil\\nname.txt' \(holds control characters\)"),
    "missing_member": (drop_member, r"member 'partitions/p0\.onnx' listed in the manifest is missing"),
    "unlisted_member": (lambda m, mem: mem.update({"x.bin": b"1"}), "'x.bin' is not listed"),
    "forged_routing": (forge_routing, "routing does not match"),
    "no_partitions": (set_field("partitions", []), "manifest lists no partitions"),
    "disabled_optimizers": (bad_disabled_optimizers, "disabled_optimizers"),
    "prepack_weights": (bad_prepack_weights, "prepack_weights"),
    "index_rows": (bad_index_rows, "manifest inputs entry 'X' has a bad index_rows 0"),
    "index_rows_dtype": (index_rows_on_floats, r"bad index_rows 8 \(for ids of dtype float32\)"),
    "index_dims": (bad_index_dims, r"bad index_dims entry \[5, 8\]"),
    "negative_dim": (negative_dim, "manifest inputs entry 'X' has a bad dim -5"),
    "tampered_details": (tamper_details, "member 'details.json' fails its sha256 check"),
    "details_elsewhere": (details_elsewhere, "details must name the listed member 'details.json'"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_artifacts_raise_artifact_error(om_path, tmp_path, case):
    mutate, message = BAD_CASES[case]
    bad = rewrite(om_path, tmp_path / "bad.om", mutate)
    with pytest.raises(ArtifactError, match=message) as info:
        load_om(bad)
    text = str(info.value)
    assert text.startswith(str(bad)) and "\n" not in text


def test_malformed_details_are_refused_when_read(om_path, tmp_path):
    def not_json(manifest, members):
        members["details.json"] = b"{not json"
        _resum(manifest, members)

    artifact = load_om(rewrite(om_path, tmp_path / "bad.om", not_json))  # the sum holds
    with pytest.raises(ArtifactError, match=r"bad\.om: details\.json is not valid JSON"):
        artifact.pass_log

    def no_log(manifest, members):
        members["details.json"] = b'{"extra": {}}'
        _resum(manifest, members)

    artifact = load_om(rewrite(om_path, tmp_path / "bad2.om", no_log))
    with pytest.raises(ArtifactError, match=r"details\.json has no 'pass_log'"):
        artifact.extra


def test_artifact_with_the_log_in_its_manifest_still_loads(om_path, tmp_path):
    # As written before the details member existed: the pass log and extras in the manifest.
    def inline_details(manifest, members):
        manifest.update(json.loads(members.pop("details.json")))
        del manifest["details"], manifest["members"]["details.json"]

    old = load_om(rewrite(om_path, tmp_path / "old.om", inline_details))
    assert old.pass_log == [{"pass": "fold", "changed": 1}] and old.extra == {}
    x = x_batch(2)
    np.testing.assert_array_equal(OmSession(old.path).run({"X": x})["Y"],
                                  OmSession(om_path).run({"X": x})["Y"])


def swap_partition(model):
    """A mutate that puts `model` in place of partition p0, its checksum refreshed."""
    def mutate(manifest, members):
        members["partitions/p0.onnx"] = model.SerializeToString()
        _resum(manifest, members)
    return mutate


def renamed(model, old, new):
    for node in model.graph.node:
        node.input[:] = [new if name == old else name for name in node.input]
        node.output[:] = [new if name == old else name for name in node.output]
    for info in [*model.graph.input, *model.graph.output]:
        if info.name == old:
            info.name = new
    return model


@pytest.mark.parametrize("old, new, message", [
    ("X", "X2", r"partition 'p0' input 'X' is not one of its model's"),
    ("Y", "Y2", r"partition 'p0' output 'Y' is not one of its model's"),
])
def test_partition_model_that_does_not_match_the_manifest_is_refused(om_path, tmp_path, old, new,
                                                                     message):
    bad = rewrite(om_path, tmp_path / "bad.om", swap_partition(renamed(matmul_relu(), old, new)))
    with pytest.raises(ArtifactError, match=message):
        OmSession(bad)


def _declare(key, **entry):
    def mutate(manifest, members):
        manifest[key][0].update(entry)
    return mutate


@pytest.mark.parametrize("mutate, message", [
    (_declare("outputs", dtype="int64"), r"declares output 'Y' as int64\['N', 3\], but "
                                         r"partition 'p0' returns float32\[N,3\]"),
    (_declare("outputs", shape=["N", 3, 3]), r"declares output 'Y' as float32\['N', 3, 3\]"),
    (_declare("outputs", shape=["N", 5]), r"declares output 'Y' as float32\['N', 5\]"),
    (_declare("inputs", dtype="float16"), r"declares input 'X' as float16\['N', 4\], but "
                                          r"partition 'p0' takes float32\[N,4\]"),
])
def test_a_signature_the_partition_models_do_not_have_is_refused(om_path, tmp_path, mutate,
                                                                  message):
    # The manifest holds no checksum of its own: what it declares is checked against what
    # onnxruntime loads, so inputs and outputs never say other than what run returns.
    bad = rewrite(om_path, tmp_path / "bad.om", mutate)
    with pytest.raises(ArtifactError, match=message):
        OmSession(bad)
    OmSession(rewrite(om_path, tmp_path / "named.om", _declare("outputs", shape=["M", 3])))


def test_a_profile_signature_the_artifact_does_not_admit_is_refused(tmp_path):
    path = tmp_path / "profiles.om"
    graphopt.save(graphopt.optimize(matmul_relu(), dynamic_dims="N:1,4"), path)

    def retyped(manifest, members):
        manifest["profiles"][1]["outputs"][0]["dtype"] = "int64"

    with pytest.raises(ArtifactError, match=r"profile 'profile1' output 'Y' is int64\[4, 3\], "
                                            r"which the artifact's float32\['N', 3\] does not"):
        load_om(rewrite(path, tmp_path / "bad.om", retyped))


def test_partition_input_nothing_routes_to_is_refused(om_path, tmp_path):
    model = matmul_relu()
    model.graph.node[1].op_type = "Add"
    model.graph.node[1].input.append("B")
    model.graph.input.append(_tensor("B", ["N", 3]))
    bad = rewrite(om_path, tmp_path / "bad.om", swap_partition(model))
    with pytest.raises(ArtifactError, match=r"partition 'p0' needs input 'B', which nothing routes"):
        OmSession(bad)


def test_corrupt_stored_manifest_is_refused(om_path, tmp_path):
    data = bytearray(om_path.read_bytes())
    at = data.index(b'"format":"graphopt-om"')
    data[at + 11] ^= 0x01  # no sha256 covers the manifest: the zip's CRC-32 catches this
    bad = tmp_path / "bad.om"
    bad.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="manifest.json is corrupt .*CRC"):
        load_om(bad)


def test_missing_manifest(om_path, tmp_path):
    bad = tmp_path / "bad.om"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("partitions/p0.onnx", b"")
    with pytest.raises(ArtifactError, match="no manifest.json"):
        load_om(bad)


def test_not_a_zip(tmp_path):
    bad = tmp_path / "model.om"
    bad.write_bytes(matmul_relu().SerializeToString())  # an .onnx renamed to .om
    with pytest.raises(ArtifactError, match=r"model\.om: not an \.om artifact \(not a zip archive\)"):
        load_om(bad)


def test_truncated_zip(om_path, tmp_path):
    data = om_path.read_bytes()
    bad = tmp_path / "cut.om"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match="truncated or corrupt zip"):
        load_om(bad)


@pytest.mark.parametrize("kind", ["truncated", "a directory"])
def test_a_failed_load_closes_the_file_at_once(om_path, tmp_path, kind):
    # A caller that keeps the errors (a list of failures, a future) held one descriptor each.
    bad = tmp_path / "bad.om"
    if kind == "truncated":
        data = om_path.read_bytes()
        bad.write_bytes(data[: len(data) // 2])
    else:
        bad.mkdir()
    errors = []
    for _ in range(20):
        with pytest.raises(ArtifactError) as caught:
            load_om(bad)
        errors.append(caught.value)
    open_on_it = [fd for fd in os.listdir("/proc/self/fd")
                  if os.path.realpath(f"/proc/self/fd/{fd}") == str(bad.resolve())]
    assert open_on_it == [], f"{len(open_on_it)} descriptors left open on {bad}"


def test_a_pipe_is_refused_at_once_as_no_regular_file(om_path, tmp_path):
    # The failed read of a FIFO was followed by a sniff of its contents, which opened it again
    # and waited for a writer that never came.
    fifo = tmp_path / "piped.om"
    os.mkfifo(fifo)
    writer = concurrent.futures.ThreadPoolExecutor(1).submit(fifo.write_bytes,
                                                             om_path.read_bytes())
    with pytest.raises(graphopt.errors.InputError, match="not a regular file"):
        graphopt.load(fifo)
    # The load opened the pipe without waiting and read none of it: a writer not yet past its
    # own open waits for a reader, which this drain is.
    drain = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        deadline = time.monotonic() + 10
        while not writer.done() and time.monotonic() < deadline:
            try:
                os.read(drain, 1 << 20)
            except BlockingIOError:
                time.sleep(0.01)
    finally:
        os.close(drain)
    # The writer ends either way: done, or its pipe broken by a reader's close.
    assert writer.exception(timeout=10) is None or isinstance(writer.exception(), BrokenPipeError)


def test_a_pipe_without_a_writer_is_refused_without_waiting_for_one(tmp_path):
    # Opening a FIFO for reading waited for a writer that never came: load hung.
    fifo = tmp_path / "idle.om"
    os.mkfifo(fifo)
    with pytest.raises(graphopt.errors.InputError, match="not a regular file"):
        graphopt.load(fifo)


@pytest.mark.skipif(os.geteuid() == 0, reason="root searches any folder")
def test_a_folder_without_search_permission_is_not_a_missing_file(om_path, tmp_path):
    folder = tmp_path / "closed"
    folder.mkdir()
    (folder / "m.om").write_bytes(om_path.read_bytes())
    folder.chmod(0o600)
    try:
        with pytest.raises(ArtifactError, match="cannot read .Permission denied"):
            graphopt.load(folder / "m.om")
    finally:
        folder.chmod(0o700)


def test_missing_file(tmp_path):
    with pytest.raises(ArtifactError, match="cannot read"):
        load_om(tmp_path / "nope.om")


def test_external_data_is_refused(tmp_path):
    model = matmul_relu()
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value="/etc/passwd")
    with pytest.raises(ValueError, match="external data"):
        write_om(tmp_path / "w.om", [OmPartition("p0", "cpu", model)])

    def smuggle(manifest, members):
        data = model.SerializeToString()
        members["partitions/p0.onnx"] = data
        manifest["members"]["partitions/p0.onnx"] = {
            "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)
        }

    write_om(tmp_path / "ok.om", [OmPartition("p0", "cpu", matmul_relu())])
    bad = rewrite(tmp_path / "ok.om", tmp_path / "bad.om", smuggle)
    with pytest.raises(ArtifactError, match="tensor 'W' has a malformed external reference"):
        load_om(bad)


# --- atomic writing ------------------------------------------------------------------------


def leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_failed_write_leaves_no_file(tmp_path, monkeypatch):
    calls = []
    original = zipfile.ZipFile.writestr

    def fail_on_second(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk on fire")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "writestr", fail_on_second)
    with pytest.raises(RuntimeError, match="disk on fire"):
        write_om(tmp_path / "out.om", split_matmul_relu())
    assert len(calls) == 2  # it did fail midway, after the manifest went out
    assert not (tmp_path / "out.om").exists() and leftovers(tmp_path) == []


def test_failed_write_keeps_existing_destination(om_path, monkeypatch):
    before = om_path.read_bytes()

    def boom(self, *args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(zipfile.ZipFile, "writestr", boom)
    with pytest.raises(RuntimeError):
        write_om(om_path, split_matmul_relu())
    assert om_path.read_bytes() == before and leftovers(om_path.parent) == []


def test_unserializable_partition(tmp_path, om_path):
    class TooBig:
        """Stands in for a >2 GiB model, which protobuf refuses to serialize."""

        graph = matmul_relu().graph

        def SerializeToString(self):
            raise ValueError("Message onnx.ModelProto exceeds maximum protobuf size of 2GB")

    part = OmPartition("p0", "cpu", matmul_relu())
    part.model = TooBig()
    before = om_path.read_bytes()
    with pytest.raises(ArtifactError, match=r"partition 'p0' does not serialize .*2GB"):
        write_om(om_path, [part])
    assert om_path.read_bytes() == before and leftovers(om_path.parent) == []


def test_unwritable_destination_is_a_graphopt_error(tmp_path):
    with pytest.raises(GraphoptError, match="cannot write"):
        write_om(tmp_path / "no" / "such" / "dir" / "m.om", split_matmul_relu())


def test_atomic_write_basics(tmp_path):
    target = tmp_path / "f.bin"
    atomic_write_bytes(target, b"one")
    assert target.read_bytes() == b"one"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600
    with pytest.raises(KeyError):
        with atomic_write(target) as f:
            f.write(b"half")
            raise KeyError("interrupted")
    assert target.read_bytes() == b"one" and leftovers(tmp_path) == []


# --- runtime -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "feeds, message",
    [
        ({}, r"missing input 'X' \(float32\[N,4\]\)"),
        ({"X": x_batch(), "Z": x_batch()}, "unknown input 'Z'; the model's inputs are: X"),
        ({"X": x_batch().astype(np.float64)}, "input 'X' has dtype float64, expected float32"),
        ({"X": np.zeros((2, 4, 1), np.float32)}, "input 'X' has rank 3"),
        ({"X": np.zeros((2, 5), np.float32)}, r"input 'X' has shape \[2, 5\].*dim 1 must be 4"),
        ({"X": None}, "input 'X' is None; it takes a tensor"),  # not "has dtype object"
    ],
)
def test_bad_feeds_name_the_input(om_path, feeds, message):
    with pytest.raises(GraphoptError, match=message):
        OmSession(om_path).run(feeds)


def test_a_symbolic_dim_two_inputs_share_takes_one_size(tmp_path):
    # onnxruntime would broadcast the [N, 1] feed over the [N, 4] one: the model says both
    # are [N, L], and a compile may have relied on that.
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", "L"])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", "L"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "L"])
    model = helper.make_model(helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])],
                                                "g", [a, b], [y]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    path = str(tmp_path / "add.om")
    write_om(path, [OmPartition("p0", "cpu", model)])
    session = OmSession(path)
    x = np.ones((2, 4), np.float32)
    assert session.run({"a": x, "b": x})["y"].shape == (2, 4)
    with pytest.raises(GraphoptError, match=r"input 'b' has shape \[2, 1\]: its dim 1 is 'L', "
                                            r"which input 'a' gives as 4"):
        session.run({"a": x, "b": x[:, :1]})


def test_unknown_output_and_bad_options(om_path):
    with pytest.raises(GraphoptError, match="unknown output 'Q'"):
        OmSession(om_path).run({"X": x_batch()}, ["Q"])
    with pytest.raises(OptionError, match="optimization_level 'max'"):
        OmSession(om_path, optimization_level="max")
    with pytest.raises(OptionError, match="intra_op_num_threads"):
        OmSession(om_path, intra_op_num_threads=-1)
    with pytest.raises(OptionError, match="intra_op_num_threads .* not 1000000000000"):
        OmSession(om_path, intra_op_num_threads=10 ** 12)  # past onnxruntime's C int
    # Bounded as --threads is: 3000 started 3000 threads, a 1 ms BERT run then took 2 s.
    with pytest.raises(OptionError, match=r"^intra_op_num_threads must be an integer from 0 to "
                                          r"1024 \(onnxruntime starts every thread it is asked "
                                          r"for\), not 3000$"):
        graphopt.load(om_path, intra_op_num_threads=3000)
    with pytest.raises(OptionError, match="inter_op_num_threads .* not 1025"):
        OmSession(om_path, inter_op_num_threads=1025)
    with pytest.raises(OptionError, match="inter_op_num_threads .* not -3"):
        OmSession(om_path, inter_op_num_threads=-3)
    with pytest.raises(OptionError, match="session_config must map .* not str"):
        OmSession(om_path, session_config="abc")
    # True became "True", which onnxruntime does not read as on: the setting was ignored.
    with pytest.raises(OptionError, match=r"session_config\['session.disable_prepacking'\] = "
                                          r"True: onnxruntime's config values are strings"):
        OmSession(om_path, session_config={"session.disable_prepacking": True})
    assert OmSession(om_path, session_config={"session.disable_prepacking": np.int64(1)})
    session = OmSession(om_path, intra_op_num_threads=1, optimization_level="disable")
    assert session.run({"X": x_batch()})["Y"].shape == (2, 3)


def test_a_models_own_4bit_weights_keep_float_activations_in_the_om(tmp_path):
    # onnxruntime fuses an int4 DequantizeLinear -> MatMul (opset 21) into MatMulNBits at
    # accuracy level 4 unless told, rounding the activations to int8: 2% off the model.
    rng = np.random.default_rng(0)
    weight = helper.make_tensor("w", TensorProto.INT4, [32, 8],
                                rng.integers(-8, 8, (32, 8)).flatten().tolist())
    scale = numpy_helper.from_array((rng.random((2, 8)) * 0.1 + 0.01).astype(np.float32), "s")
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["w", "s"], ["wf"], axis=0, block_size=16),
         helper.make_node("MatMul", ["x", "wf"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [weight, scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    feeds = {"x": rng.standard_normal((4, 32)).astype(np.float32)}
    expected = numerics.run(model, feeds)["y"]  # ORT_DISABLE_ALL
    path = tmp_path / "int4.om"
    graphopt.save(graphopt.optimize(model, verify=True, inputs=feeds), path)
    np.testing.assert_allclose(graphopt.load(path).run(feeds)["y"], expected, rtol=1e-5, atol=1e-5)
    # A caller's own setting still goes to onnxruntime
    fast = graphopt.load(path, session_config={"session.qdq_matmulnbits_accuracy_level": "4"})
    assert np.abs(fast.run(feeds)["y"] - expected).max() > 1e-3
    # A portable .onnx cannot carry the setting: a note says what its session needs.
    result = graphopt.optimize(model)
    graphopt.save(result, tmp_path / "int4.onnx")
    (note,) = [n for n in result.notes if n.startswith(f"{tmp_path / 'int4.onnx'}: run it")]
    assert 'add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")' in note
    plain = graphopt.optimize(zoo.build("tiny"))
    graphopt.save(plain, tmp_path / "tiny.onnx")
    assert not any("run it with" in n for n in plain.notes)


@pytest.mark.skipif("CANNExecutionProvider" in ort.get_available_providers(),
                    reason="CANN is present, so nothing falls back")
def test_npu_partition_falls_back_to_cpu_with_one_notice(tmp_path):
    parts = split_matmul_relu()
    parts[1].device = "npu"
    path = tmp_path / "npu.om"
    write_om(path, parts, target="ascend")
    notice = r"CANNExecutionProvider not installed: p1 \(npu\) run on the CPU provider"
    with pytest.warns(RuntimeWarning, match=notice) as record:
        session = OmSession(path)
    assert len(record) == 1
    assert session.providers["p1"] == ["CPUExecutionProvider"]
    x = x_batch()
    np.testing.assert_allclose(session.run({"X": x})["Y"], np.maximum(x @ W, 0), rtol=1e-5)


def test_run_is_thread_safe(tmp_path):
    path = tmp_path / "two.om"
    write_om(path, split_matmul_relu())
    session = OmSession(path)
    batches = [x_batch(n) for n in range(1, 33)]

    def run(x):
        return session.run({"X": x})["Y"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, batches))
    for x, y in zip(batches, results):
        np.testing.assert_allclose(y, np.maximum(x @ W, 0), rtol=1e-5)


def test_mapped_weights_serve_eight_threads_from_the_first_run(tmp_path):
    # 8 threads × 100 runs on an artifact whose weights onnxruntime maps from the file; the
    # first runs of every thread wait together for the weights' checksum.
    path = tmp_path / "big.om"
    write_om(path, [OmPartition("p0", "cpu", big_matmul())])
    session = OmSession(path, intra_op_num_threads=1)
    w = numpy_helper.to_array(big_matmul().graph.initializer[0])
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal((1 + n % 4, 512)).astype(np.float32) for n in range(800)]

    def run(x):
        return session.run({"X": x})["Y"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, batches))
    for x, y in zip(batches, results):
        np.testing.assert_allclose(y, x @ w, rtol=1e-4, atol=1e-4)


def test_graph_input_passed_through_as_output(tmp_path):
    # ONNX lets a graph output name a graph input directly; the artifact returns the feed's
    # values, in an array of its own as onnxruntime does (writing to it leaves the feed alone).
    model = _model([helper.make_node("Relu", ["X"], ["Y"])], [_tensor("X", ["N", 4])],
                   [_tensor("Y", ["N", 4]), _tensor("X", ["N", 4])])
    path = tmp_path / "pass.om"
    write_om(path, [OmPartition("p0", "cpu", model)])
    artifact = load_om(path)
    assert [o["name"] for o in artifact.outputs] == ["Y", "X"]
    assert {"tensor": "X", "from": None, "to": None} in artifact.routing
    x = x_batch()
    session = OmSession(artifact)
    got = session.run({"X": x})
    np.testing.assert_array_equal(got["X"], x)
    np.testing.assert_array_equal(got["Y"], np.maximum(x, 0))
    for result in (got["X"], session.run({"X": x}, output_names=["X"])["X"]):
        assert not np.shares_memory(result, x)


def test_a_failing_run_names_its_partition_on_the_single_partition_path_too(tmp_path):
    # One partition that takes exactly the feeds and returns exactly the outputs runs on the
    # runtime's shortcut; an onnxruntime failure there is still a GraphoptError naming it.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "g",
                              [x, shape], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    path = tmp_path / "reshape.om"
    write_om(path, [OmPartition("p0", "cpu", model)])
    session = OmSession(path)
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = session.run({"x": data, "shape": np.array([3, 2], np.int64)})
    np.testing.assert_array_equal(got["y"], data.reshape(3, 2))
    with pytest.raises(GraphoptError, match="partition 'p0' failed in onnxruntime"):
        session.run({"x": data, "shape": np.array([4, 2], np.int64)})
    # Asked for by name, the same output takes the general path.
    assert session.run({"x": data, "shape": np.array([6, 1], np.int64)}, ["y"])["y"].shape == (6, 1)


def test_a_pickled_session_reopens_the_artifact(om_path):
    import pickle

    session = OmSession(om_path, intra_op_num_threads=1)
    copy = pickle.loads(pickle.dumps(session))
    x = x_batch(2)
    np.testing.assert_array_equal(copy.run({"X": x})["Y"], session.run({"X": x})["Y"])
    assert copy._reopen == session._reopen and copy._reopen["intra_op_num_threads"] == 1
    session.close()  # its copy came back open, which the closed session could not run
    with pytest.raises(GraphoptError, match="the session was closed"):
        pickle.dumps(session)


def test_output_names_must_be_a_list(om_path):
    with pytest.raises(GraphoptError, match=r"output_names must be a list of names, not the "
                                            r"string 'Y' \(write \['Y'\]\)"):
        OmSession(om_path).run({"X": x_batch(2)}, "Y")


def test_an_empty_output_list_asks_for_every_output_as_onnxruntimes_does(om_path):
    # A pipeline's list built empty had returned {} without a word.
    session, feeds = OmSession(om_path), {"X": x_batch(2)}
    every = session.run(feeds)
    for empty in ([], ()):
        got = session.run(feeds, empty)
        assert got.keys() == every.keys()
        for name in every:
            np.testing.assert_array_equal(got[name], every[name])


def test_an_unknown_rank_and_an_unknown_dim_read_apart_and_made_up_dims_stay_unknown(tmp_path):
    # Both printed float32[?]; the output's unnamed dim came back as inference's unk__0.
    graph = helper.make_graph(
        [helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Relu", ["c"], ["z"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [None]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    graphopt.save(graphopt.optimize(model, target="cpu"), tmp_path / "m.om")
    session = graphopt.load(tmp_path / "m.om")
    assert "(a: float32[?], c: float32 of any shape) -> (y: float32[?], z: float32 of any " \
        "shape)" in repr(session)
    assert session.outputs[0]["shape"] == [None]
    with pytest.raises(graphopt.errors.InputError, match=r"input 'a' has rank 2 \(shape \[2, 2\]"
                                                         r"\), expected rank 1: float32\[\?\]"):
        session.run({"a": np.ones((2, 2), np.float32), "c": np.ones(2, np.float32)})


@pytest.mark.parametrize("command", ["inspect", "report"])
def test_extras_of_the_wrong_type_are_an_artifact_error(tmp_path, capsys, command):
    # The extras are covered by their checksum only: a hand-edited artifact whose sums were
    # refreshed ended `inspect` and `report` in an internal error (a memory plan's size "x").
    from helpers import run_cli

    from graphopt import zoo

    source = tmp_path / "tiny.onnx"
    onnx.save(zoo.build("tiny"), source)
    path = tmp_path / "tiny.om"
    graphopt.save(graphopt.optimize(str(source), target="ascend310"), str(path))

    def malformed(manifest, members):
        details = json.loads(members["details.json"])
        (plan,) = details["extra"]["memory_plan"].values()
        plan["arena_bytes"] = "x"
        members["details.json"] = json.dumps(details).encode()
        _resum(manifest, members)

    bad = rewrite(path, tmp_path / "bad.om", malformed)
    code, out, err = run_cli(capsys, command, str(bad), *(["-o", str(tmp_path / "r.html")]
                                                           if command == "report" else []))
    assert code == 1 and "internal error" not in err
    assert "details.json holds an entry graphopt cannot read" in err
