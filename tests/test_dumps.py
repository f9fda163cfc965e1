"""--dump-dir dumps: text, ONNX and both; ONNX dumps load, pass the checker, run, and share one
weights file; numbering matches passes.json; option errors."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from helpers import parse_model, run_cli

import graphopt
from graphopt import numerics
from graphopt.errors import OptionError
from graphopt.ir import format_model, load_onnx, to_onnx
from graphopt.tools.dump_onnx import INLINE_LIMIT, WEIGHTS_FILE

RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture
def proto() -> onnx.ModelProto:
    """Conv + BatchNorm (fused at -O2), an Identity (removed), and a foldable Add of constants:
    the conv weight (1728 bytes) is above the inline limit, the BN vectors are below."""
    rng = np.random.default_rng(0)
    model = parse_model("""
        agraph (float[1,3,8,8] x) => (float[1,16,8,8] y) {
          c = Conv <pads=[1,1,1,1]> (x, w)
          b = BatchNormalization (c, scale, shift, mean, var)
          i = Identity (b)
          k = Add (bias, bias)
          y = Add (i, k)
        }""",
        w=rng.standard_normal((16, 3, 3, 3)).astype(np.float32),
        scale=rng.uniform(0.5, 1.5, 16).astype(np.float32),
        shift=rng.standard_normal(16).astype(np.float32),
        mean=rng.standard_normal(16).astype(np.float32),
        var=rng.uniform(0.5, 1.5, 16).astype(np.float32),
        bias=rng.standard_normal((16, 1, 1)).astype(np.float32))
    for node in model.graph.node:
        node.name = f"/{node.output[0]}/{node.op_type}"
    return model


def _dump(proto, tmp_path, fmt):
    directory = tmp_path / f"dump_{fmt}"
    result = graphopt.optimize(proto, dump_dir=os.fspath(directory), dump_format=fmt)
    log = json.loads((directory / "passes.json").read_text())
    return directory, result, log


def test_onnx_dumps_load_check_and_match_the_log(proto, tmp_path):
    directory, result, log = _dump(proto, tmp_path, "onnx")
    names = sorted(os.listdir(directory))
    dumps = [n for n in names if n.endswith(".onnx")]
    assert set(names) == set(dumps) | {"passes.json", WEIGHTS_FILE}
    assert log["dump_format"] == "onnx"
    assert log["import"]["dumps"] == ["000_import.onnx"]
    assert [e["dumps"] for e in log["passes"]] == [[d] for d in dumps[1:]]
    assert [d[4:-5] for d in dumps[1:]] == [e["pass"] for e in log["passes"]]
    assert len(log["passes"]) == len(result.log.records)
    assert any(e["changed"] for e in log["passes"]) and not all(e["changed"] for e in log["passes"])
    for name in dumps:
        path = os.fspath(directory / name)
        onnx.checker.check_model(path, full_check=True)
        loaded = onnx.load(path)  # external data resolved from the dump's directory
        assert loaded.graph.node or name == dumps[0]
    final = onnx.load(os.fspath(directory / dumps[-1]))
    assert [n.op_type for n in final.graph.node] == [n.op_type for n in result.model.graph]
    feeds = numerics.random_feeds(proto, seed=0)
    problems = numerics.compare(numerics.run(proto, feeds), numerics.run(final, feeds), RTOL, ATOL)
    assert not problems, problems


def test_weights_are_written_once_and_dumps_stay_small(proto, tmp_path):
    directory, _, log = _dump(proto, tmp_path, "onnx")
    distinct = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".onnx"):
            for value in load_onnx(os.fspath(directory / name)).graph.initializers.values():
                if value.const.nbytes >= INLINE_LIMIT:
                    distinct[value.const.digest()] = value.const.nbytes
            # every large weight is outside the dump: the file is far below one conv weight
            assert os.path.getsize(directory / name) < 1728
    # the original conv weight and the fused one, each once (64-byte alignment between them)
    assert sorted(distinct.values()) == [1728, 1728]
    size = os.path.getsize(directory / WEIGHTS_FILE)
    assert sum(distinct.values()) <= size < sum(distinct.values()) + 64 * len(distinct)
    assert len(log["passes"]) > 10  # many dumps share those two tensors


def test_dumping_leaves_the_compiled_model_intact(proto, tmp_path):
    _, dumped, _ = _dump(proto, tmp_path, "onnx")
    plain = graphopt.optimize(proto)
    assert format_model(dumped.model) == format_model(plain.model)
    for init in to_onnx(dumped.model).graph.initializer:
        assert init.data_location != onnx.TensorProto.EXTERNAL and not init.external_data


def test_both_writes_text_and_onnx_of_the_same_graph(proto, tmp_path):
    directory, _, log = _dump(proto, tmp_path, "both")
    entries = [log["import"]] + log["passes"]
    for entry in entries:
        text, model = entry["dumps"]
        assert text.endswith(".txt") and model == text[:-4] + ".onnx"
        # the ONNX dump holds exactly the graph the printed dump shows
        assert format_model(load_onnx(os.fspath(directory / model))) == \
            (directory / text).read_text()


def test_text_is_the_default_and_writes_no_weights(proto, tmp_path):
    directory = tmp_path / "dump"
    graphopt.optimize(proto, dump_dir=os.fspath(directory))
    names = os.listdir(directory)
    assert WEIGHTS_FILE not in names and not [n for n in names if n.endswith(".onnx")]
    log = json.loads((directory / "passes.json").read_text())
    assert log["dump_format"] == "text" and log["import"]["dumps"] == ["000_import.txt"]


def test_a_second_run_into_the_same_directory_starts_a_new_weights_file(proto, tmp_path):
    directory, _, _ = _dump(proto, tmp_path, "onnx")
    size = os.path.getsize(directory / WEIGHTS_FILE)
    _dump(proto, tmp_path, "onnx")
    assert os.path.getsize(directory / WEIGHTS_FILE) == size
    onnx.checker.check_model(os.fspath(directory / "000_import.onnx"), full_check=True)


def test_option_errors(proto, tmp_path):
    with pytest.raises(OptionError, match="dump_format='xml': unknown format"):
        graphopt.optimize(proto, dump_dir=os.fspath(tmp_path / "d"), dump_format="xml")
    with pytest.raises(OptionError, match="dump_format='onnx' needs dump_dir"):
        graphopt.optimize(proto, dump_format="onnx")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("argv, needle", [
    (["--dump-format", "onnx"], "--dump-format onnx needs --dump-dir"),
    (["--dump-format", "text"], "--dump-format text needs --dump-dir"),
    (["--dump-dir", "DIR", "--dump-format", "xml"], "--dump-format xml: unknown format"),
    (["--dump-dir", "OUT"], "the same path as -o; the dump is a folder of files"),
])
def test_cli_option_errors(proto, tmp_path, capsys, argv, needle):
    model = tmp_path / "m.onnx"
    onnx.save(proto, os.fspath(model))
    out = tmp_path / "out.onnx"
    argv = [os.fspath(tmp_path / "dump") if a == "DIR" else os.fspath(out) if a == "OUT" else a
            for a in argv]
    rc, _, err = run_cli(capsys, "optimize", model, "-o", out, *argv)
    # A format the option does not take is a usage error; the others, found after parsing.
    assert rc == (2 if "unknown format" in needle else 1) and needle in err \
        and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "dump").exists()


def test_cli_onnx_dumps(proto, tmp_path, capsys):
    model = tmp_path / "m.onnx"
    onnx.save(proto, os.fspath(model))
    dump = tmp_path / "dump"
    rc, _, err = run_cli(capsys, "optimize", model, "-o", tmp_path / "out.onnx",
                         "--dump-dir", dump, "--dump-format", "onnx", "-q")
    assert rc == 0, err
    log = json.loads((dump / "passes.json").read_text())
    assert all((dump / e["dumps"][0]).exists() for e in log["passes"])


def test_a_second_dump_into_the_same_directory_replaces_the_first(proto, tmp_path):
    directory = tmp_path / "dump"
    graphopt.optimize(proto, dump_dir=os.fspath(directory), dump_format="both")
    (directory / "notes.txt").write_text("mine")  # not the dump's: stays
    (directory / "099_Stale.txt").write_text("from the earlier dump")
    log = json.loads((directory / "passes.json").read_text())
    log["passes"][0]["dumps"].append("099_Stale.txt")
    (directory / "passes.json").write_text(json.dumps(log))
    graphopt.optimize(proto, level=0, dump_dir=os.fspath(directory), dump_format="text")
    log = json.loads((directory / "passes.json").read_text())
    listed = {name for entry in [log["import"], *log["passes"]] for name in entry["dumps"]}
    assert {p.name for p in directory.iterdir()} == listed | {"passes.json", "notes.txt"}


def test_a_profiled_dump_and_a_flat_one_replace_each_other(tmp_path):
    # A compile with shape profiles dumps into a folder per profile: the next dump into the
    # folder, with profiles or without, used to leave the other kind's files beside its own.
    dynamic = parse_model("agraph (float[N, 4] x) => (float[N, 4] y) { y = Relu(x) }")
    directory = tmp_path / "dump"
    graphopt.optimize(dynamic, dump_dir=directory, dynamic_dims={"N": [1, 2]},
                      dump_format="onnx")
    assert json.loads((directory / "passes.json").read_text())["profiles"] == \
        ["profile0", "profile1"]
    (directory / "profile1" / "notes.txt").write_text("mine")  # not the dump's: stays
    graphopt.optimize(dynamic, dump_dir=directory)
    log = json.loads((directory / "passes.json").read_text())
    listed = {name for entry in [log["import"], *log["passes"]] for name in entry["dumps"]}
    assert {p.name for p in directory.iterdir()} == listed | {"passes.json", "profile1"}
    assert [p.name for p in (directory / "profile1").iterdir()] == ["notes.txt"]
    graphopt.optimize(dynamic, dump_dir=directory, dynamic_dims={"N": [3]})
    assert {p.name for p in directory.iterdir()} == {"passes.json", "profile0", "profile1"}
    assert (directory / "profile0" / "passes.json").exists()


@pytest.mark.parametrize("name", ["weights.bin", "passes.json"])
def test_a_dump_refuses_a_folder_holding_files_it_did_not_write(proto, tmp_path, name):
    # A model's own weights.bin, or someone's passes.json: the dump would truncate or delete it.
    directory = tmp_path / "dump"
    directory.mkdir()
    (directory / name).write_bytes(b"precious")
    with pytest.raises(OptionError, match=f"holds a {name} that no graphopt dump wrote"):
        graphopt.optimize(proto, dump_dir=os.fspath(directory), dump_format="onnx")
    assert (directory / name).read_bytes() == b"precious"
    (directory / name).unlink()
    (directory / name).symlink_to(tmp_path / "elsewhere")  # a link is never the dump's
    with pytest.raises(OptionError, match=f"holds a {name} that no graphopt dump wrote"):
        graphopt.optimize(proto, dump_dir=os.fspath(directory), dump_format="onnx")


def test_a_folder_that_takes_no_file_is_refused_before_the_compile(proto, tmp_path,
                                                                  monkeypatch):
    # A read-only or immutable folder (root's permission bits say nothing of either) failed at
    # the first dump's write, with an error that named the file but not --dump-dir.
    from graphopt.passes import instruments

    def refused(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(instruments.tempfile, "mkstemp", refused)
    with pytest.raises(OptionError, match="dump_dir.*: cannot create a file in it: Operation "
                                          "not permitted"):
        graphopt.optimize(proto, dump_dir=os.fspath(tmp_path))
    assert not list(tmp_path.iterdir())


def test_a_dump_never_overwrites_the_model_or_the_weights_it_reads(proto, tmp_path):
    directory = tmp_path / "dump"
    directory.mkdir()
    model = directory / "000_import.onnx"  # the name the dump's first file takes
    onnx.save(proto, model)
    with pytest.raises(OptionError, match="the dump would overwrite the model"):
        graphopt.optimize(os.fspath(model), dump_dir=os.fspath(directory))
    assert onnx.load(model) == proto
    # An ONNX dump compiled again with the same --dump-dir reads its weights from there.
    first = tmp_path / "first"
    graphopt.optimize(proto, dump_dir=os.fspath(first), dump_format="onnx")
    (first / "model.onnx").write_bytes((first / "000_import.onnx").read_bytes())
    with pytest.raises(OptionError, match=r"reads its weights from .*weights\.bin"):
        graphopt.optimize(os.fspath(first / "model.onnx"), dump_dir=os.fspath(first),
                          dump_format="onnx")


def test_a_dump_cut_short_is_recognised_by_the_next(proto, tmp_path):
    # A compile that fails (or is interrupted) never reaches finish(): its index of the dumps
    # so far still marks the folder as a graphopt dump, which the next run replaces.
    from graphopt.passes.instruments import DumpIR

    directory = tmp_path / "dump"
    cut = DumpIR(os.fspath(directory), "onnx")
    cut.start(load_onnx(proto))
    assert (directory / WEIGHTS_FILE).exists()
    cut.close()  # what the pass manager does when a pass fails
    graphopt.optimize(proto, dump_dir=os.fspath(directory), dump_format="onnx")
    log = json.loads((directory / "passes.json").read_text())
    assert log["import"]["dumps"] == ["000_import.onnx"] and log["passes"]


def test_a_folder_another_compile_is_dumping_into_is_refused(proto, tmp_path, monkeypatch):
    # Two compiles of one process given one folder each rewrote the other's files and index.
    from graphopt.errors import OptionError
    from graphopt.passes import PASSES
    from graphopt.passes.instruments import DumpIR

    directory = tmp_path / "dump"
    other = DumpIR(os.fspath(directory), "text")  # another thread's compile, mid-dump
    other.start(load_onnx(proto))
    with pytest.raises(OptionError, match="another compile is dumping into that folder now"):
        graphopt.optimize(proto, dump_dir=os.fspath(tmp_path / "." / "dump"))
    other.close()
    # A compile that fails gives the folder back.
    def failing(self, model, ctx):
        raise RuntimeError("a pass fails")

    monkeypatch.setattr(PASSES["FoldConstants"], "run", failing)
    with pytest.raises(Exception, match="a pass fails"):
        graphopt.optimize(proto, dump_dir=os.fspath(directory))
    monkeypatch.undo()
    graphopt.optimize(proto, dump_dir=os.fspath(directory))
    assert json.loads((directory / "passes.json").read_text())["passes"]
    # So does one whose dump cannot start (the model's own file among the dump's names).
    model = directory / "000_import.onnx"
    onnx.save(proto, model)
    for _ in range(2):
        with pytest.raises(OptionError, match="the dump would overwrite the model"):
            graphopt.optimize(os.fspath(model), dump_dir=os.fspath(directory))


@pytest.mark.parametrize("failing_mode", ["wb", "ab"])
def test_a_weights_file_the_disk_refuses_is_a_one_line_error(proto, tmp_path, monkeypatch,
                                                             failing_mode):
    # The weights file grows pass by pass (no atomic rename): a full disk is named, and what
    # was appended in part is cut away again.
    import builtins

    import graphopt.tools.dump_onnx as dump_onnx
    from graphopt.errors import OutputError

    def full_disk(path, mode="r", *args, **kwargs):
        if mode == failing_mode and os.path.basename(path) == WEIGHTS_FILE:
            handle = builtins.open(path, mode, *args, **kwargs)
            handle.write(b"partial")  # what reached the disk before it filled up
            handle.close()
            raise OSError(28, "No space left on device")
        return builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(dump_onnx, "open", full_disk, raising=False)
    weights = tmp_path / "dump_onnx" / WEIGHTS_FILE
    with pytest.raises(OutputError, match=f"cannot write {weights}: No space left on device"):
        _dump(proto, tmp_path, "onnx")
    if failing_mode == "ab":
        assert weights.stat().st_size == 0  # the first weight failed: nothing points past 0
