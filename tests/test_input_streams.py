"""Inputs read from pipes (`/dev/stdin`, a shell's `<(…)`): every command takes them, and its
messages name them as given."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest
from helpers import run_cli

import graphopt
from graphopt.cli import main


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("streams")
    model, om, inputs = root / "m.onnx", root / "m.om", root / "x.npz"
    assert main(["zoo", "build", "tiny", "-o", str(model)]) == 0
    graphopt.save(graphopt.optimize(str(model)), str(om))
    np.savez(inputs, input=np.random.default_rng(0).standard_normal((1, 3, 32, 32), np.float32))
    return {"model": model, "om": om, "inputs": inputs}


def _piped(data: bytes, *argv) -> subprocess.CompletedProcess:
    """`… | graphopt ARGV`, where /dev/stdin is a pipe (a redirected file would be a file)."""
    return subprocess.run([sys.executable, "-m", "graphopt", *map(os.fspath, argv)], input=data,
                          capture_output=True, timeout=120)


def _leftovers() -> set[str]:
    return {name for name in os.listdir(tempfile.gettempdir())
            if name.startswith("graphopt-stream-")}


@pytest.mark.parametrize(("argv", "shows"), [
    (("inspect", "/dev/stdin"), b"partitions (1, in execution order)"),
    (("run", "/dev/stdin"), b"logits"),
    (("profile", "/dev/stdin", "--repeat", "2"), b"advisor"),
    (("compare", "{model}", "/dev/stdin"), b"result: PASS"),
])
def test_an_om_from_a_pipe_is_read_once_and_named_as_given(files, argv, shows):
    before = _leftovers()
    done = _piped(files["om"].read_bytes(), *(a.format(**files) for a in argv))
    assert done.returncode == 0, done.stderr
    assert shows in done.stdout
    assert b"/dev/stdin" in done.stdout + done.stderr
    copies = os.path.join(tempfile.gettempdir(), "graphopt-stream-")
    assert os.fsencode(copies) not in done.stdout + done.stderr  # no temporary copy named
    assert _leftovers() <= before


@pytest.mark.parametrize("argv", [("inspect", "/dev/stdin"), ("profile", "/dev/stdin",
                                                               "--repeat", "2")])
def test_an_onnx_model_from_a_pipe_is_read_once(files, argv):
    # inspect and profile look at the first bytes to tell an .om from an .onnx, then parse.
    done = _piped(files["model"].read_bytes(), *argv)
    assert done.returncode == 0, done.stderr


def test_a_bad_stream_is_refused_naming_it():
    done = _piped(b"not a model", "inspect", "/dev/stdin")
    assert done.returncode == 1
    assert done.stderr.startswith(b"graphopt: error: /dev/stdin: neither an .om")


def test_inputs_from_a_fifo(files, tmp_path, capsys):
    fifo = tmp_path / "x.npz"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(files["inputs"].read_bytes()),
                              daemon=True)
    writer.start()
    rc, out, err = run_cli(capsys, "run", files["om"], "--inputs", fifo,
                           "--outputs", tmp_path / "y.npz")
    writer.join(10)
    assert rc == 0, err
    expected = graphopt.load(str(files["om"])).run(dict(np.load(files["inputs"])))
    np.testing.assert_array_equal(np.load(tmp_path / "y.npz")["logits"], expected["logits"])


def test_a_report_of_a_piped_model_asks_for_its_output_path(files):
    # By default the page goes beside the model: a pipe's copy sits in a folder removed after.
    done = _piped(files["om"].read_bytes(), "report", "/dev/stdin")
    assert done.returncode == 1
    assert b"needs -o FILE.html" in done.stderr


@pytest.mark.parametrize("argv", [
    ("optimize", "/dev/zero", "-o", "{tmp}/z.om"), ("inspect", "/dev/zero"),
    ("run", "{om}", "--inputs", "/dev/zero"), ("compare", "/dev/zero", "{model}"),
    ("kb", "import", "/dev/zero", "--tuning-db", "{tmp}/kb.db"),
    ("profile", "{om}", "--repeat", "1", "--calibration", "/dev/zero"),
    ("optimize", "{model}", "-o", "{tmp}/a.om", "--insert-op-conf", "/dev/zero"),
])
def test_a_device_is_refused_before_it_is_read(files, tmp_path, capsys, argv):
    # /dev/zero was read whole: 24 GB before the kernel ended the process.
    argv = [a.format(tmp=tmp_path, om=files["om"], model=files["model"]) for a in argv]
    rc, _, err = run_cli(capsys, *argv)
    assert rc in (1, 2) and "/dev/zero: a device, not a file (its bytes may never end)" in err, err
