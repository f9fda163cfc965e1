"""Output files: no command writes over one of its own inputs, and a destination that cannot
be written (full or read-only disk, a file where a folder should be) is a one-line error
naming it, with nothing left behind."""

from __future__ import annotations

import errno
import io
import os
import signal
from importlib import resources

import numpy as np
import onnx
import pytest
from helpers import run_cli

import graphopt
import graphopt.atomic as atomic
from graphopt.cli import main
from graphopt.errors import OptionError, OutputError


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny model, its .om, inputs for it, and the files optimize's other options read."""
    root = tmp_path_factory.mktemp("outputs")
    model, om, inputs = root / "m.onnx", root / "m.om", root / "x.npz"
    assert main(["zoo", "build", "tiny", "-o", str(model)]) == 0
    graphopt.save(graphopt.optimize(str(model)), str(om))
    feeds = {e["name"]: np.zeros([d if isinstance(d, int) else 1 for d in e["shape"]],
                                 dtype=np.float32) for e in graphopt.load(str(om)).inputs}
    np.savez(inputs, **feeds)
    # What optimize's other options read, each named as an output would be by mistake.
    (root / "switches.onnx").write_text("FuseGelu: off\n")
    (root / "aipp.onnx").write_text("aipp_op {\n  aipp_mode: static\n  input_format: "
                                    "RGB888_U8\n}\n")
    (root / "keep.onnx").write_text("OpType::Gemm\n")
    (root / "target.onnx").write_bytes(
        (resources.files("graphopt.partition") / "targets" / "cpu.json").read_bytes())
    (root / "kb.om").write_bytes(b"")  # an SQLite database with nothing in it yet
    return {"model": str(model), "om": str(om), "inputs": str(inputs), "root": str(root)}


def _overwrites(f):
    """(argv, the path the output option names, what the message calls it) per command."""
    m, om, x = f["model"], f["om"], f["inputs"]
    cases = {
        "run --outputs the .om": (["run", om, "--outputs", om], om, "the model"),
        "run --outputs its --inputs": (["run", om, "--inputs", x, "--outputs", x], x, "--inputs"),
        "compare --csv the reference": (["compare", m, om, "--csv", m], m, "the reference"),
        "compare --csv the candidate": (["compare", m, om, "--csv", om], om, "the candidate"),
        "report -o the .om": (["report", om, "-o", om], om, "the .om itself"),
        "report -o its --reference": (["report", om, "--reference", m, "-o", m], m,
                                      "--reference"),
        "profile --trace the model": (["profile", om, "--repeat", "1", "--trace", om], om,
                                      "the model"),
        "optimize -o its --inputs": (["optimize", m, "-o", x, "--verify", "--inputs", x], x,
                                     "--inputs"),
        "optimize --memory-plot the model": (["optimize", m, "-o", os.path.join(f["root"], "o.om"),
                                              "--memory-plot", m], m, "the model"),
    }
    read = {"--switch-file": "switches.onnx", "--fusion-switch-file": "switches.onnx",
            "--insert-op-conf": "aipp.onnx", "--target": "target.onnx",
            "--keep-dtype": "keep.onnx"}
    for option, name in read.items():
        path = os.path.join(f["root"], name)
        extra = ["--precision", "fp16"] if option == "--keep-dtype" else []
        cases[f"optimize -o its {option}"] = (["optimize", m, "-o", path, option, path, *extra],
                                              path, option)
    kb = os.path.join(f["root"], "kb.om")  # by its URL
    cases["optimize -o its --tuning-db"] = (["optimize", m, "-o", kb, "--tuning-db",
                                             f"sqlite:///{kb}"], kb, "--tuning-db")
    return cases


def _error_status(argv: list) -> int:
    """compare exits 1 when outputs differ, so its errors exit 2; other commands' exit 1."""
    return 2 if argv[0] in ("compare", "bisect") else 1


@pytest.mark.parametrize("case", list(_overwrites({"model": "", "om": "", "inputs": "",
                                                    "root": ""})))
def test_no_command_writes_over_its_own_input(files, capsys, case):
    argv, victim, what = _overwrites(files)[case]
    before = open(victim, "rb").read()
    rc, out, err = run_cli(capsys, *argv)
    assert rc == _error_status(argv) and "Traceback" not in err, err
    assert err.startswith("graphopt: error:") and err.count("\n") == 1, err
    assert f"would overwrite {what}" in err, err
    assert open(victim, "rb").read() == before


def test_the_same_file_by_another_name_is_still_the_input(files, capsys, tmp_path):
    link = tmp_path / "link.om"
    os.symlink(files["om"], link)
    before = open(files["om"], "rb").read()
    rc, _, err = run_cli(capsys, "run", files["om"], "--outputs", link)
    assert rc == 1 and "would overwrite the model" in err, err
    assert open(files["om"], "rb").read() == before


EMPTY_PATHS = [  # (argv before the empty value, the option): "m" the model, "om" the .om
    (["run", "om", "--outputs"], "--outputs"), (["run", "om", "--inputs"], "--inputs"),
    (["compare", "m", "om", "--csv"], "--csv"), (["compare", "m", "om", "--inputs"], "--inputs"),
    (["profile", "om", "--trace"], "--trace"), (["profile", "om", "--inputs"], "--inputs"),
    (["profile", "om", "--calibration"], "--calibration"),
    (["report", "om", "-o"], "-o/--output"), (["report", "om", "--reference"], "--reference"),
    (["report", "om", "--reference", "m", "--inputs"], "--inputs"),
    (["bisect", "m", "--inputs"], "--inputs"),
    (["optimize", "m", "-o", "o.om", "--verify", "--inputs"], "--inputs"),
    (["optimize", "m", "-o", "o.om", "--tuning-db"], "--tuning-db"),
    (["optimize", "m", "-o", "o.om", "--storage"], "--storage"),
    (["optimize", "m", "-o", "o.onnx", "--precision", "fp16", "--calibration"], "--calibration"),
]


@pytest.mark.parametrize("argv, option", EMPTY_PATHS, ids=[" ".join(a) for a, _ in EMPTY_PATHS])
def test_an_empty_path_is_refused_not_read_as_the_option_left_out(files, capsys, tmp_path,
                                                                 argv, option):
    # An unset shell variable (--outputs "$OUT"): run wrote no outputs, report wrote the
    # default page, run and compare ran on random inputs, all with exit status 0.
    named = {"m": files["model"], "om": files["om"], "o.om": str(tmp_path / "o.om"),
             "o.onnx": str(tmp_path / "o.onnx")}
    rc, out, err = run_cli(capsys, *[named.get(a, a) for a in argv], "")
    assert rc == 2 and f"argument {option}: an empty path" in err, err
    assert not out and not os.listdir(tmp_path)
    assert not os.path.exists(os.path.splitext(files["om"])[0] + ".html")


def test_calibrate_checks_its_output_before_measuring(files, capsys, monkeypatch):
    import graphopt.tuner.calibrate as calibrate

    def measured(**_):
        raise AssertionError("the benchmarks ran before the output was checked")

    monkeypatch.setattr(calibrate, "calibrate", measured)
    rc, _, err = run_cli(capsys, "calibrate", "--quick", "-o", files["model"] + "/c.json")
    assert rc == 1 and "is a file, not a folder" in err, err
    rc, _, err = run_cli(capsys, "calibrate", "--quick", "-o", files["root"])
    assert rc == 1 and "is a directory" in err, err
    before = open(files["model"], "rb").read()  # a model named by mistake is left whole
    rc, _, err = run_cli(capsys, "calibrate", "--quick", "-o", files["model"])
    assert rc == 2 and "calibrate writes JSON (name it .json)" in err, err
    assert open(files["model"], "rb").read() == before
    # An empty -o (an unset shell variable) read as no -o: the default file was replaced.
    rc, _, err = run_cli(capsys, "calibrate", "--quick", "-o", "")
    assert rc == 2 and "argument -o/--output: an empty path" in err, err


def test_run_and_report_write_only_files_named_for_what_they_write(files, capsys, tmp_path):
    # Another file named by mistake (a model, a script) would have been replaced whole.
    victim = tmp_path / "notes.txt"
    victim.write_text("keep me")
    for argv, message in ((["run", files["om"], "--outputs", victim],
                           "run writes an .npz (name it .npz)"),
                          (["report", files["om"], "-o", victim],
                           "report writes an HTML page (name it .html)")):
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 2 and message in err, err
        assert victim.read_text() == "keep me"


def test_text_outputs_named_as_a_model_or_a_dash_are_refused(files, capsys, tmp_path):
    # inspect -o, compare --csv and profile --trace replaced a model named so with text, and
    # wrote a file named "-" where a pipeline meant standard output.
    victim = tmp_path / "other.om"
    victim.write_bytes(b"keep me")
    for argv, message in (
            (["inspect", files["om"], "-o", victim], "inspect writes text or JSON, not a model"),
            (["compare", files["model"], files["om"], "--csv", victim],
             "compare writes CSV, not a model"),
            (["profile", files["om"], "--inputs", files["inputs"], "--trace", victim],
             "profile writes a JSON trace, not a model"),
            (["compare", files["model"], files["om"], "--csv", "-"],
             "--csv -: compare writes CSV to a file; for standard output give /dev/stdout")):
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 2 and message in err, err
        assert victim.read_bytes() == b"keep me" and not os.path.exists("-")


def test_a_broken_entry_in_a_calibration_folder_is_named(files, capsys, tmp_path):
    folder = tmp_path / "cal"
    folder.mkdir()
    (folder / "gone.npz").symlink_to(tmp_path / "missing.npz")
    rc, _, err = run_cli(capsys, "optimize", files["model"], "-o", tmp_path / "q.onnx",
                         "--quantize", "int8", "--calibration", folder)
    assert rc == 1 and "gone.npz: cannot read it (No such file or directory)" in err, err


# --- destinations that refuse the write ------------------------------------------------------


@pytest.mark.parametrize("failing", ["mkstemp", "write", "flush", "replace"])
def test_an_unwritable_destination_is_an_output_error(tmp_path, monkeypatch, failing):
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")
    full = OSError(errno.ENOSPC, "No space left on device")

    def fail(*_, **__):
        raise full

    class FullDisk(io.FileIO):
        def write(self, data):
            raise full

    if failing == "mkstemp":
        monkeypatch.setattr(atomic.tempfile, "mkstemp", fail)
    elif failing == "flush":  # a write small enough to sit in the buffer until the flush
        monkeypatch.setattr(atomic.os, "fdopen",
                            lambda fd, mode: io.BufferedWriter(FullDisk(fd, "wb")))
    elif failing == "replace":
        monkeypatch.setattr(atomic.os, "replace", fail)
    with pytest.raises(OutputError, match=f"cannot write {path}: No space left on device"):
        with atomic.atomic_write(path) as f:
            f.write(b"new")
            if failing == "write":
                raise full
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["out.bin"]  # no temporary file left


def test_an_error_of_the_callers_own_passes_through(tmp_path):
    # Only what a write into the destination fails with becomes an OutputError.
    with pytest.raises(FileNotFoundError):
        with atomic.atomic_write(tmp_path / "out.bin"):
            open(tmp_path / "missing.txt", "rb")
    assert os.listdir(tmp_path) == []


def test_a_failed_write_of_optimize_is_a_one_line_error(files, capsys, monkeypatch, tmp_path):
    def read_only(*_, **__):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(atomic.tempfile, "mkstemp", read_only)
    # The folder passes the check before the compile (the disk fails only afterwards).
    monkeypatch.setattr("graphopt.cli_paths._check_writable", lambda *_: None)
    for output in ("o.onnx", "o.om"):
        rc, _, err = run_cli(capsys, "optimize", files["model"], "-o", tmp_path / output, "-q")
        assert rc == 1, err
        assert err == f"graphopt: error: cannot write {tmp_path / output}: Read-only file system\n"
    assert os.listdir(tmp_path) == []


def test_an_error_after_the_om_is_in_place_says_it_was_written(files, capsys, monkeypatch,
                                                                tmp_path):
    # A full disk under the memory plot, after the .om had landed: the message named the plot
    # alone, and a user could not tell whether the .om was good.
    import graphopt.passes.memory as memory

    def disk_full(plan, path, **_):
        raise OutputError(f"cannot write {path}: No space left on device")

    monkeypatch.setattr(memory, "draw_plan", disk_full)
    om, plot = tmp_path / "o.om", tmp_path / "p.svg"
    rc, _, err = run_cli(capsys, "optimize", files["model"], "-o", om, "--target", "cpu",
                         "--memory-plot", plot, "-q")
    assert rc == 1 and err == (f"graphopt: error: cannot write {plot}: No space left on device "
                               f"(after writing {om})\n"), err
    assert graphopt.load(str(om))


# --- a model and its external data: replaced together or not at all ---------------------------


def _matmul_model(seed: int):
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(seed).standard_normal((64, 64)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        [numpy_helper.from_array(weight, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), weight


def _run(path, x):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_a_failed_model_write_keeps_the_old_pair_of_files(tmp_path, monkeypatch):
    out = tmp_path / "m.onnx"
    first, w1 = _matmul_model(1)
    graphopt.save(graphopt.optimize(first), out, external_data=True)
    x = np.ones((2, 64), np.float32)
    np.testing.assert_allclose(_run(out, x), x @ w1, rtol=1e-5)
    second, _ = _matmul_model(2)
    result = graphopt.optimize(second)
    replace = atomic.os.replace

    def full_at_the_model(src, dst):
        if os.path.basename(dst) == "m.onnx":  # the data file went in, the model does not
            raise OSError(errno.ENOSPC, "No space left on device")
        return replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", full_at_the_model)
    with pytest.raises(OutputError, match="No space left on device"):
        graphopt.save(result, out, external_data=True)
    monkeypatch.setattr(atomic.os, "replace", replace)
    np.testing.assert_allclose(_run(out, x), x @ w1, rtol=1e-5)  # the old weights, not w2
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]


def test_a_model_path_that_cannot_be_written_leaves_no_data_file(tmp_path):
    (tmp_path / "m.onnx").mkdir()
    with pytest.raises(OutputError, match="it is a directory"):
        graphopt.save(graphopt.optimize(_matmul_model(1)[0]), tmp_path / "m.onnx",
                      external_data=True)
    assert os.listdir(tmp_path) == ["m.onnx"]


def test_saving_over_the_models_own_data_keeps_the_result_usable(tmp_path):
    import onnx

    proto, weight = _matmul_model(1)
    source = tmp_path / "m.onnx"
    onnx.save(proto, source, save_as_external_data=True, location="m.onnx.data",
              size_threshold=0)
    result = graphopt.optimize(source)
    graphopt.save(result, source, external_data=True)  # in place: its weights' own file
    graphopt.save(result, tmp_path / "m.om")           # reads them again, from the new file
    graphopt.save(result, tmp_path / "copy.onnx", external_data=True)
    x = np.ones((2, 64), np.float32)
    np.testing.assert_allclose(_run(tmp_path / "copy.onnx", x), x @ weight, rtol=1e-5)
    np.testing.assert_allclose(graphopt.load(tmp_path / "m.om").run({"x": x})["y"], x @ weight,
                               rtol=1e-5)


@pytest.mark.parametrize("location, threshold", [("m.onnx.data", None), ("weights.bin", "0")])
def test_optimize_in_place_names_the_weights_file_it_left_unread(tmp_path, capsys, monkeypatch,
                                                                location, threshold):
    # Written inline (small weights), or to m.onnx.data beside it, the output no longer reads
    # the input's weights file: it stayed behind unsaid. It is named, not deleted (another
    # model may read it too).
    import onnx

    proto, weight = _matmul_model(1)
    source = tmp_path / "m.onnx"
    onnx.save(proto, source, save_as_external_data=True, location=location, size_threshold=0)
    if threshold is not None:
        monkeypatch.setenv("GRAPHOPT_EXTERNAL_DATA_THRESHOLD", threshold)
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_cli(capsys, "optimize", "m.onnx", "-o", "m.onnx")
    assert rc == 0, err
    assert f"note: {location}: the weights file of the model -o replaced, which m.onnx no " \
        "longer reads: delete it if no other model does" in out
    assert (tmp_path / location).exists()
    x = np.ones((2, 64), np.float32)
    np.testing.assert_allclose(_run(source, x), x @ weight, rtol=1e-5)
    # Written again in place, with its weights where they are: nothing to say.
    rc, out, err = run_cli(capsys, "optimize", "m.onnx", "-o", "m.onnx")
    assert rc == 0 and "weights file" not in out, err


def test_a_result_saved_over_its_own_data_saves_again_for_a_target(tmp_path):
    # For a target the partition models hold tensors of their own, reading the model's data
    # lazily: the in-place save replaced that file under them.
    import onnx

    from graphopt import zoo

    source = tmp_path / "m.onnx"
    onnx.save(zoo.build("tiny"), source, save_as_external_data=True, location="m.onnx.data",
              size_threshold=0)
    import onnxruntime as ort

    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    expected = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(
        None, {"input": x})[0]
    result = graphopt.optimize(source, target="cpu")
    graphopt.save(result, source, external_data=True)
    graphopt.save(result, tmp_path / "m.om")
    got = graphopt.load(tmp_path / "m.om").run({"input": x})
    np.testing.assert_allclose(next(iter(got.values())), expected, rtol=1e-4, atol=1e-5)


def test_saving_over_another_models_data_file_is_refused(tmp_path):
    # in.onnx keeps its weights in out.onnx.data (a model renamed since it was saved): writing
    # out.onnx with external data would replace them, and in.onnx would no longer load.
    import onnx

    proto, weight = _matmul_model(1)
    source = tmp_path / "in.onnx"
    onnx.save(proto, source, save_as_external_data=True, location="out.onnx.data",
              size_threshold=0)
    before = (tmp_path / "out.onnx.data").read_bytes()
    result = graphopt.optimize(source)
    with pytest.raises(OptionError, match=r"out\.onnx: saving here replaces .*out\.onnx\.data, "
                                          r"which holds the weights of .*in\.onnx"):
        graphopt.save(result, tmp_path / "out.onnx", external_data=True)
    assert (tmp_path / "out.onnx.data").read_bytes() == before
    assert not (tmp_path / "out.onnx").exists()
    x = np.ones((2, 64), np.float32)
    np.testing.assert_allclose(_run(source, x), x @ weight, rtol=1e-5)
    graphopt.save(result, tmp_path / "elsewhere.onnx", external_data=True)
    np.testing.assert_allclose(_run(tmp_path / "elsewhere.onnx", x), x @ weight, rtol=1e-5)


@pytest.mark.parametrize("signum, message", [
    (signal.SIGTERM, "graphopt: terminated\n"),
    (signal.SIGHUP, "graphopt: terminated (SIGHUP)\n"),
    (signal.SIGQUIT, "graphopt: terminated (SIGQUIT)\n")])
def test_a_kill_mid_write_leaves_no_partial_file(tmp_path, capsys, monkeypatch, signum, message):
    # kill, docker stop and Kubernetes send SIGTERM, a closed terminal or a dropped SSH session
    # SIGHUP: each is raised where the command is, as Ctrl-C is, so the atomic write removes
    # its temporary file.
    import time

    import onnx

    import graphopt.compile_save

    before = signal.getsignal(signum)
    source = tmp_path / "m.onnx"
    onnx.save(graphopt.zoo.build("tiny"), source)

    def killed_mid_write(result, path, *args, **kwargs):
        with atomic.atomic_write(path) as f:
            f.write(b"partial")
            os.kill(os.getpid(), signum)
            time.sleep(10)

    monkeypatch.setattr(graphopt.compile_save, "save", killed_mid_write)
    started = time.monotonic()
    rc = main(["optimize", str(source), "-o", str(tmp_path / "m.om")])
    assert rc == 128 + signum and capsys.readouterr().err.endswith(message)
    assert time.monotonic() - started < 10
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]
    assert signal.getsignal(signum) is before


def test_an_ignored_hangup_stays_ignored(tmp_path, monkeypatch):
    # `nohup graphopt tune …` ignores SIGHUP so that the job outlives its terminal.
    import onnx

    import graphopt.compile_save

    source = tmp_path / "m.onnx"
    onnx.save(graphopt.zoo.build("tiny"), source)
    seen = []
    real_save = graphopt.compile_save.save

    def save(*args, **kwargs):
        seen.append(signal.getsignal(signal.SIGHUP))
        os.kill(os.getpid(), signal.SIGHUP)  # ignored: the compile goes on
        return real_save(*args, **kwargs)

    monkeypatch.setattr(graphopt.compile_save, "save", save)
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        assert main(["optimize", str(source), "-o", str(tmp_path / "m.om"), "-q"]) == 0
        assert seen == [signal.SIG_IGN] and (tmp_path / "m.om").is_file()
    finally:
        signal.signal(signal.SIGHUP, previous)


# --- destinations that are not plain files -----------------------------------------------------


def test_a_fifo_or_device_output_is_written_in_place(tmp_path):
    # A rename over it would put a regular file where the pipe or /dev/null was.
    fifo = tmp_path / "out.npz"
    os.mkfifo(fifo)
    received = {}

    def read():
        received["data"] = fifo.read_bytes()

    import threading

    reader = threading.Thread(target=read, daemon=True)  # a rename would leave it waiting
    reader.start()
    atomic.atomic_write_bytes(fifo, b"through the pipe")
    reader.join(10)
    assert received["data"] == b"through the pipe"
    assert not fifo.is_file() and atomic.is_special_file(str(fifo))


def test_a_symlinked_output_is_written_through_to_its_target(tmp_path):
    (tmp_path / "shared").mkdir()
    target = tmp_path / "shared" / "model.om"
    target.write_bytes(b"old")
    link = tmp_path / "deploy.om"
    link.symlink_to(target)
    atomic.atomic_write_bytes(link, b"new")
    assert link.is_symlink() and target.read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path / "shared")) == ["model.om"]  # no temporary left


def test_a_name_near_the_filesystems_limit_is_written(tmp_path, capsys):
    # The hidden temporary beside it would pass 255 bytes with the name in it.
    long = tmp_path / ("m" * 250 + ".om")
    rc, _, err = run_cli(capsys, "zoo", "build", "tiny", "-o", tmp_path / "t.onnx")
    assert rc == 0, err
    rc, _, err = run_cli(capsys, "optimize", tmp_path / "t.onnx", "-o", long, "-q")
    assert rc == 0, err
    assert long.is_file() and sorted(os.listdir(tmp_path)) == sorted(["t.onnx", long.name])


def test_an_output_onto_the_models_own_weights_file_is_refused(tmp_path):
    import onnx

    proto, weight = _matmul_model(1)
    source = tmp_path / "m.onnx"
    onnx.save(proto, source, save_as_external_data=True, location="data.om", size_threshold=0)
    before = (tmp_path / "data.om").read_bytes()
    result = graphopt.optimize(source)
    for out in ("data.om", "data.om.onnx"):
        target = tmp_path / "data.om"
        if out.endswith(".onnx"):  # the same file reached through a link named .onnx
            (tmp_path / out).symlink_to(target)
        with pytest.raises(OptionError, match=r"holds the weights of .*m\.onnx \(initializer 'W', at least\)"):
            graphopt.save(result, tmp_path / out)
    assert (tmp_path / "data.om").read_bytes() == before
    x = np.ones((2, 64), np.float32)
    np.testing.assert_allclose(_run(source, x), x @ weight, rtol=1e-5)


@pytest.mark.parametrize("option", ["compare --csv", "report -o", "profile --trace",
                                    "optimize --memory-plot"])
def test_no_other_output_lands_on_the_models_weights_file(tmp_path, capsys, option):
    import onnx

    proto, _ = _matmul_model(2)
    source, data = tmp_path / "m.onnx", tmp_path / "m.data"
    onnx.save(proto, source, save_as_external_data=True, location="m.data", size_threshold=0)
    om = tmp_path / "m.om"
    graphopt.save(graphopt.optimize(source), om)
    before = data.read_bytes()
    argv = {"compare --csv": ["compare", source, om, "--csv", data],
            "report -o": ["report", om, "--reference", source, "-o", data],
            "profile --trace": ["profile", source, "--repeat", "1", "--trace", data],
            "optimize --memory-plot": ["optimize", source, "-o", tmp_path / "o.om",
                                       "--memory-plot", data]}[option]
    rc, _, err = run_cli(capsys, *argv)
    assert rc == _error_status(argv) and err.count("\n") == 1, err
    assert f"{option.split()[1]} {data}: holds the weights of " in err and "m.onnx" in err, err
    assert data.read_bytes() == before


def test_weights_found_as_the_loader_finds_them_are_protected_too(tmp_path, capsys):
    # Beside a link to the model (not its target), and held by a Constant node.
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["w"], value=weight),
         helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    onnx.save(proto, tmp_path / "a" / "m.onnx", save_as_external_data=True, location="m.data",
              size_threshold=0, convert_attribute=True)
    (tmp_path / "a" / "m.onnx").rename(tmp_path / "b" / "m.onnx")
    (tmp_path / "a" / "m.onnx").symlink_to(tmp_path / "b" / "m.onnx")
    data = tmp_path / "a" / "m.data"
    before = data.read_bytes()
    rc, _, err = run_cli(capsys, "profile", tmp_path / "a" / "m.onnx", "--repeat", "1",
                         "--trace", data)
    assert rc == 1 and "holds the weights of the model" in err, err
    assert data.read_bytes() == before


def test_the_om_records_the_source_hash_only_while_the_path_holds_the_source(tmp_path):
    import hashlib
    import json
    import zipfile

    import onnx

    def recorded(om):
        return json.loads(zipfile.ZipFile(om).read("manifest.json"))["source"]["sha256"]

    source = tmp_path / "m.onnx"
    onnx.save(_matmul_model(1)[0], source)
    result = graphopt.optimize(source)
    graphopt.save(result, tmp_path / "a.om")
    assert recorded(tmp_path / "a.om") == hashlib.sha256(source.read_bytes()).hexdigest()
    graphopt.save(result, source)  # the optimized model in place: no longer what was compiled
    graphopt.save(result, tmp_path / "b.om")
    assert recorded(tmp_path / "b.om") is None


def test_a_set_of_files_moves_in_under_a_lock_on_its_folder(tmp_path, monkeypatch):
    # Two processes saving one model with external data at once must not leave one's model
    # beside the other's data: each set moves in while holding the folder's lock.
    import fcntl

    seen = []
    replace = os.replace

    def replace_while_probing(src, dst):
        probe = os.open(tmp_path, os.O_RDONLY)
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append("unlocked")
        except BlockingIOError:
            seen.append("locked")
        finally:
            os.close(probe)
        replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", replace_while_probing)
    with atomic.atomic_files([str(tmp_path / "m.onnx"), str(tmp_path / "m.onnx.data")]) as files:
        for f in files:
            f.write(b"new")
    assert seen == ["locked", "locked"]
    assert (tmp_path / "m.onnx").read_bytes() == (tmp_path / "m.onnx.data").read_bytes() == b"new"



def test_verify_runs_the_om_as_written_before_it_replaces_the_output(tmp_path, capsys,
                                                                    monkeypatch):
    # The compiled model is verified, but not what only the artifact holds: an exporter's stale
    # output declaration once made a verified compile into an .om that did not load. The
    # artifact is now loaded and run before it lands; a failure leaves -o as it was.
    import onnx

    import graphopt.tools.compare as compare
    from graphopt.errors import ArtifactError
    from graphopt.tools.compare import CompareReport, Row

    source, out = tmp_path / "m.onnx", tmp_path / "m.om"
    onnx.save(graphopt.zoo.build("tiny"), source)
    real = compare.compare_models
    checked = []

    def unloadable(reference, candidate, *args, **kwargs):
        checked.append(candidate)
        raise ArtifactError(f"{candidate}: the manifest declares output 'y' otherwise")

    def differing(reference, candidate, *args, **kwargs):
        report = CompareReport(str(reference), str(candidate), "allclose", "seeded random")
        report.rows.append(Row("logits", "output", "f32", (1, 10), passed=False, max_abs=0.5,
                               mismatches=3))
        return report

    for fake, message in ((unloadable, "as written does not run: "),
                          (differing, "as written differs from the original: logits (max abs "
                                      "0.5, 3 element(s) beyond rtol/atol) (on seeded random "
                                      "inputs: standard normal values; give inputs like the "
                                      "deployment's with --inputs); nothing written")):
        out.write_bytes(b"the old artifact")
        monkeypatch.setattr(compare, "compare_models", fake)
        rc, _, err = run_cli(capsys, "optimize", source, "-o", out, "--verify")
        assert rc == 1 and f"--verify: {out} {message}" in err, err
        assert out.read_bytes() == b"the old artifact"
        assert sorted(os.listdir(tmp_path)) == ["m.om", "m.onnx"]  # no temporary file left
    assert os.path.dirname(checked[0]) == str(tmp_path)  # the file about to be renamed
    monkeypatch.setattr(compare, "compare_models", real)
    rc, text, err = run_cli(capsys, "optimize", source, "-o", out, "--verify")
    assert rc == 0, err
    assert graphopt.load(out).run({"input": np.zeros((1, 3, 32, 32), np.float32)})
    # The summary's error is the compiled model's on one thread; the file's is said apart.
    assert "(max abs error " in text and ", onnxruntime on one thread)" in text
    assert f"{out} as written: max abs error " in text and "run by graphopt's runtime" in text


def _mm(constant=False):
    from onnx import TensorProto, helper, numpy_helper
    weight = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    if constant:
        nodes = [helper.make_node("Constant", [], ["W"], value=numpy_helper.from_array(weight, "W")),
                 helper.make_node("MatMul", ["x", "W"], ["y"])]
        inits = []
    else:
        nodes, inits = [helper.make_node("MatMul", ["x", "W"], ["y"])], [numpy_helper.from_array(weight, "W")]
    graph = helper.make_graph(nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_in_place_note_names_the_weights_file_beside_a_model_in_another_folder(tmp_path, capsys,
                                                                             monkeypatch):
    # The weights file is found beside the model, not in the working folder.
    (tmp_path / "sub").mkdir()
    onnx.save(_mm(), tmp_path / "sub" / "m.onnx", save_as_external_data=True,
              location="m.onnx.data", size_threshold=0)
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_cli(capsys, "optimize", "sub/m.onnx", "-o", "sub/m.onnx")
    assert rc == 0, err
    assert f"note: {os.path.join('sub', 'm.onnx.data')}: the weights file" in out, out


def test_in_place_note_names_a_constants_external_weights_file(tmp_path, capsys, monkeypatch):
    # A Constant's tensor kept outside the file is a weight like an initializer.
    from onnx.external_data_helper import convert_model_to_external_data
    proto = _mm(constant=True)
    convert_model_to_external_data(proto, location="m.onnx.data", size_threshold=0,
                                   convert_attribute=True)
    onnx.save(proto, tmp_path / "m.onnx")
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_cli(capsys, "optimize", "m.onnx", "-o", "m.onnx")
    assert rc == 0, err
    assert "note: m.onnx.data: the weights file" in out, out


def test_a_compile_to_another_file_does_not_read_its_output_back(tmp_path, capsys, monkeypatch):
    # Only a compile over its own input can leave a weights file unread: reading the written
    # .om back as ONNX had cost its size in memory (a 2.6 GiB model: 3.3 GB peak, not 1.2).
    import onnx

    import graphopt.ir.data_files

    proto, _ = _matmul_model(1)
    onnx.save(proto, tmp_path / "m.onnx", save_as_external_data=True, location="m.onnx.data",
              size_threshold=0)
    read = []
    monkeypatch.setattr(graphopt.ir.data_files, "data_files",
                        lambda path: read.append(path) or set())
    rc, _, err = run_cli(capsys, "optimize", tmp_path / "m.onnx", "-o", tmp_path / "m.om")
    # The source's own data files are named (their hash is the manifest's source), never the
    # output's.
    assert rc == 0 and all(os.fspath(p) == os.fspath(tmp_path / "m.onnx") for p in read), \
        (err, read)
