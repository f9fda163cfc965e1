"""OmSession under close(), shared artifacts, files changed in place and unusual paths: a run
returns right outputs or raises a GraphoptError, never another exception, never outputs of
weights that fail their checksums."""

from __future__ import annotations

import os

import numpy as np
import pytest
from test_om_deferred import RNG, matmul_model

import graphopt
import graphopt.codegen.deferred_check as deferred_check
from graphopt.codegen import OmPartition, OmSession, load_om, write_om
from graphopt.codegen.runtime import OmSession as RuntimeSession
from graphopt.errors import ArtifactError, GraphoptError, OptionError

BIG = RNG.standard_normal((512, 1024)).astype(np.float32)  # 2 MiB: a mapped weights blob
X = RNG.standard_normal((2, 512)).astype(np.float32)


def _artifact(path, weight=BIG):
    write_om(path, [OmPartition("p0", "cpu", matmul_model(weight))])
    return path


def _tampered(path):
    data = bytearray(path.read_bytes())
    data[data.index(BIG.tobytes()[:64]) + 8] ^= 0x01  # in the weights blob
    path.write_bytes(bytes(data))
    return path


def test_a_close_during_the_first_run_never_lets_tampered_outputs_through(tmp_path,
                                                                          monkeypatch):
    # close() cleared the pending checksums before the run under way waited for them: it
    # returned outputs computed from the tampered weights (5 of 5 tries, closing 20 ms in).
    session = graphopt.load(_tampered(_artifact(tmp_path / "m.om")))
    assert session._pending is not None  # checked on the side: over 1 MiB
    real = RuntimeSession._run

    def closed_meanwhile(self, feeds, names):
        outputs = real(self, feeds, names)
        self.close()  # as another thread would, while onnxruntime ran
        return outputs

    monkeypatch.setattr(RuntimeSession, "_run", closed_meanwhile)
    with pytest.raises(ArtifactError, match="weights/p0.bin' fails its sha256 check"):
        session.run({"X": X})


def test_a_close_racing_a_run_is_said_to_have_closed_the_session(tmp_path, monkeypatch):
    # close() cleared the plan between run()'s open check and its use of it:
    # AttributeError: 'NoneType' object has no attribute 'single'.
    session = graphopt.load(_artifact(tmp_path / "m.om", BIG[:, :16]))
    real = RuntimeSession._check_feeds

    def closed_meanwhile(self, feeds):
        env = real(self, feeds)
        self.close()
        return env

    monkeypatch.setattr(RuntimeSession, "_check_feeds", closed_meanwhile)
    with pytest.raises(GraphoptError, match="the session was closed; load the artifact again"):
        session.run({"X": X}, ["Y"])


def test_a_partition_flipped_where_onnxruntime_decodes_text_is_a_failed_checksum(tmp_path,
                                                                                 monkeypatch):
    # A bit flipped in a partition's metadata value: onnxruntime's binding raised
    # UnicodeDecodeError while the checksums were still being computed on the side.
    monkeypatch.setattr(deferred_check, "_INLINE_CHECK_BYTES", 0)
    model = matmul_model(BIG[:, :16])
    model.metadata_props.add(key="note", value="1280")
    path = tmp_path / "m.om"
    write_om(path, [OmPartition("p0", "cpu", model)])
    data = bytearray(path.read_bytes())
    data[data.index(b"1280")] = 0xB2  # not UTF-8
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="partitions/p0.onnx' fails its sha256 check"):
        graphopt.load(path)


def test_closing_one_of_two_sessions_of_one_artifact_leaves_the_other_running(tmp_path):
    # Both shared the artifact's file, which the first close() closed: the other raised
    # OSError: Bad file descriptor, or said it was closed itself.
    artifact = load_om(_artifact(tmp_path / "m.om"))
    first, second = OmSession(artifact), OmSession(artifact)
    expected = first.run({"X": X})["Y"]
    first.close()
    np.testing.assert_array_equal(second.run({"X": X}, ["Y"])["Y"], expected)
    np.testing.assert_array_equal(second.run({"X": X})["Y"], expected)
    owner = graphopt.load(tmp_path / "m.om")
    owner.close()  # it loaded the artifact, so it closed the file
    with pytest.raises(ArtifactError, match="its file was closed with the session that loaded "
                                            "it: load the path again"):
        OmSession(owner.artifact)


def test_a_rewrite_in_place_that_keeps_size_and_mtime_is_refused_and_a_chmod_is_not(tmp_path):
    # `cp -p` or `rsync --inplace -t` over a loaded artifact: same size, mtime set back; the
    # next run mixed the new weights with the old plan's (max error 0.75).
    live = _artifact(tmp_path / "live.om")
    session = graphopt.load(live)
    expected = session.run({"X": X})["Y"]
    os.chmod(live, 0o600)  # the inode changed, the bytes did not: hashed again, and runs on
    np.testing.assert_array_equal(session.run({"X": X})["Y"], expected)
    stamp = os.stat(live)
    new = _artifact(tmp_path / "new.om", BIG[::-1].copy())
    assert new.stat().st_size == stamp.st_size
    with open(live, "r+b") as f:
        f.write(new.read_bytes())
    os.utime(live, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    with pytest.raises(ArtifactError, match="rewritten in place after it was loaded"):
        session.run({"X": X})


def test_a_path_through_a_linked_folder_and_dotdot_loads_the_file_the_kernel_opens(tmp_path,
                                                                                   monkeypatch):
    # here/linkdir -> ../elsewhere/sub: linkdir/../m.om is elsewhere/m.om, where abspath's
    # text rule made it here/m.om ("was replaced or removed while it was being loaded").
    (tmp_path / "here").mkdir()
    (tmp_path / "elsewhere" / "sub").mkdir(parents=True)
    os.symlink("../elsewhere/sub", tmp_path / "here" / "linkdir")
    _artifact(tmp_path / "elsewhere" / "m.om")
    monkeypatch.chdir(tmp_path / "here")
    session = graphopt.load(os.path.join("linkdir", "..", "m.om"))
    np.testing.assert_allclose(session.run({"X": X})["Y"], X @ BIG, rtol=1e-5, atol=1e-4)
    with pytest.raises(OptionError, match="load: the path is empty"):
        graphopt.load("")
