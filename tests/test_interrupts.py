"""interrupts_deferred: a signal that lands inside the block reaches its handler once the block
has ended, and an error of the block's own wins."""

from __future__ import annotations

import os
import signal

import pytest

from graphopt.interrupts import interrupts_deferred


class Stopped(Exception):
    pass


@pytest.fixture
def sigterm_raises():
    def stop(signum, frame):
        raise Stopped(signum)
    previous = signal.signal(signal.SIGTERM, stop)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_inside_the_block_is_taken_after_it(signum, sigterm_raises):
    expected = KeyboardInterrupt if signum == signal.SIGINT else Stopped
    done = []
    with pytest.raises(expected):
        with interrupts_deferred():
            os.kill(os.getpid(), signum)
            done.append("the rest of the block")  # a commit's result noted, say
    assert done == ["the rest of the block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_blocks_own_error_wins_and_nothing_is_held_after(sigterm_raises):
    with pytest.raises(ValueError):
        with interrupts_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            raise ValueError("the block's own")
    with interrupts_deferred():
        pass  # no signal: nothing raised
    with pytest.raises(Stopped):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler is back


def _interrupt_after(monkeypatch, owner, name):
    """`owner.name` made to deliver a Ctrl-C as it returns, as a signal landing right after
    it would."""
    real = getattr(owner, name)

    def interrupted(*args, **kwargs):
        result = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        return result

    monkeypatch.setattr(owner, name, interrupted)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_a_ctrl_c_right_after_the_temporary_file_is_made_leaves_nothing(tmp_path, monkeypatch):
    # It had landed between mkstemp and the handler that removes the file: a service catching
    # KeyboardInterrupt around graphopt.save kept the descriptor and a stray .tmp file.
    import tempfile

    from graphopt.atomic import atomic_write

    _interrupt_after(monkeypatch, tempfile, "mkstemp")
    before = _open_fds()
    with pytest.raises(KeyboardInterrupt):
        with atomic_write(tmp_path / "model.om") as f:
            f.write(b"bytes")
    assert os.listdir(tmp_path) == [] and _open_fds() == before


def test_a_ctrl_c_between_a_collections_freeze_and_unfreeze_leaves_the_heap_unfrozen(
        monkeypatch):
    # The heap had stayed frozen for the rest of the process: garbage the caller dropped was
    # never collected again.
    import gc

    from graphopt.ir import collector

    assert gc.get_freeze_count() == 0
    _interrupt_after(monkeypatch, gc, "freeze")
    with pytest.raises(KeyboardInterrupt):
        collector._collect_all()
    assert gc.get_freeze_count() == 0


def test_a_ctrl_c_right_after_an_om_is_renamed_into_place_names_it(tmp_path, monkeypatch):
    # It had landed between the rename and the note of it: the command said "interrupted"
    # alone, over a new, complete artifact.
    from graphopt import atomic

    _interrupt_after(monkeypatch, atomic.os, "replace")
    with atomic.noting_written() as written:
        with pytest.raises(KeyboardInterrupt):
            with atomic.atomic_write(tmp_path / "model.om") as f:
                f.write(b"new")
    assert written == [str(tmp_path / "model.om")]
    assert os.listdir(tmp_path) == ["model.om"]


def test_a_ctrl_c_between_a_model_and_its_weights_renames_leaves_the_new_pair(tmp_path,
                                                                            monkeypatch):
    # It had landed right after the first rename: the new model stayed beside the old
    # weights, which onnxruntime refuses, with the old files' hard links left in the folder.
    from graphopt import atomic

    for name in ("m.onnx", "m.onnx.data"):
        (tmp_path / name).write_bytes(b"old")
    _interrupt_after(monkeypatch, atomic.os, "replace")
    paths = [str(tmp_path / "m.onnx"), str(tmp_path / "m.onnx.data")]
    with atomic.noting_written() as written:
        with pytest.raises(KeyboardInterrupt):
            with atomic.atomic_files(paths) as files:
                for f in files:
                    f.write(b"new")
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
    assert (tmp_path / "m.onnx").read_bytes() == (tmp_path / "m.onnx.data").read_bytes() == b"new"
    assert written == paths
