"""Subgraph tuning (graphopt.tuner.subgraph, `graphopt tune --job subgraph`): the default compile
is trial 0, the cost-model search finds a better set of fusion decisions, the choice keeps the
model's outputs, and `optimize --tuning-db` applies it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
import optuna
import pytest

from graphopt import optimize
from graphopt.errors import OptionError
from graphopt.ir import to_onnx
from graphopt.numerics import random_feeds, run
from graphopt.tuner.subgraph import tune_subgraph
from graphopt.tuner.subgraph_job import SubgraphJob
from graphopt.tuner.subgraph_lookup import best_decisions, decisions_for
from graphopt.tuner.subgraph_space import Recorder, build_space, gate_for
from tests.helpers import parse_model, run_cli

# A projection, its scale, bias and activations: on ascend310 at -O3 the Div either folds into
# the MatMul (FusedMatMul alpha) or, kept apart, joins the MatMul's elementwise epilogue.
BLOCK = """
agraph (float[1,64,256] x) => (float[1,64,256] y) {
    h = MatMul (x, w1)
    d = Div (h, eight)
    a = Add (d, b1)
    g = Relu (a)
    s = Sigmoid (g)
    y = Mul (s, x)
}
"""


@pytest.fixture(scope="module")
def block_path(tmp_path_factory):
    rng = np.random.default_rng(0)
    proto = parse_model(BLOCK, w1=(rng.standard_normal((256, 256)) * 0.1).astype(np.float32),
                        eight=np.array(8.0, np.float32),
                        b1=(rng.standard_normal(256) * 0.1).astype(np.float32))
    path = str(tmp_path_factory.mktemp("sg") / "block.onnx")
    onnx.save(proto, path)
    return path


def _job(path, **kw):
    return SubgraphJob(path, "ascend310", level=3, **kw)


def test_space_groups_alike_rewrites_and_the_gate_switches_them_off():
    layers = "\n".join(f"    e{i} = Erf (d{i})\n    p{i} = Add (e{i}, one)\n"
                       f"    m{i} = Mul (x{i}, p{i})\n    x{i + 1} = Mul (m{i}, half)\n"
                       f"    d{i + 1} = Div (x{i + 1}, sqrt2)" for i in range(3))
    proto = parse_model(f"""
agraph (float[2,8] x0) => (float[2,8] x3) {{
    d0 = Div (x0, sqrt2)
{layers}
}}
""", one=np.array(1.0, np.float32), half=np.array(0.5, np.float32),
        sqrt2=np.array(1.4142135, np.float32))
    recorder = Recorder()
    result = optimize(proto, rewrite_gate=recorder, target="cpu")
    space = build_space(recorder, result.partitioning, elementwise=False, npu=False)
    gelu = [g for g in space.groups if g.key.startswith("FuseGelu")]
    assert len(gelu) == 1 and len(gelu[0].anchors) == 3 and gelu[0].partition == "p0_cpu"
    assert space.size == 2 ** len(space.groups)
    params = {**space.default_params(), gelu[0].param: False}
    apart = optimize(proto, target="cpu", rewrite_gate=gate_for(params, space))
    assert [n.op_type for n in apart.model.graph].count("Erf") == 3
    feeds = random_feeds(proto, seed=2)
    np.testing.assert_allclose(run(to_onnx(apart.model), feeds)["x3"], run(proto, feeds)["x3"],
                               rtol=1e-5, atol=1e-6)
    fine = Recorder("shape")
    optimize(proto, rewrite_gate=fine, target="cpu")
    assert {key for key, _ in fine.seen} == {"FuseGelu:GeluErf@Mul[2,8]"}


def test_layout_records_no_decision_where_nothing_is_blocked():
    # LayoutNchwc asked the rewrite gate about every Transpose, Add and Mul, blocked input or
    # not: a transformer's subgraph study got decisions that changed nothing.
    proto = parse_model("""
agraph (float[1,4,8,16] x) => (float[1,8,4,16] y) {
    t = Transpose <perm = [0, 2, 1, 3]> (x)
    a = Add (t, t)
    y = Mul (a, t)
}
""")
    recorder = Recorder()
    optimize(proto, rewrite_gate=recorder, target="cpu")
    assert not [key for key, _ in recorder.seen if key.startswith("LayoutNchwc")]


def test_estimate_search_beats_the_default_and_keeps_outputs(block_path):
    storage = optuna.storages.InMemoryStorage()
    result = tune_subgraph(_job(block_path), trials=12, seed=0, storage=storage)
    study = optuna.load_study(study_name=result.study_name, storage=storage)
    first = min(study.trials, key=lambda t: t.number)
    assert first.user_attrs["default"] and first.params == result.default.params
    assert result.default.params == result.space.default_params()
    assert result.speedup > 1.05, result.default.seconds / result.best.seconds
    # What remains changed after simplification all pays: putting any one back costs time.
    assert result.changes()
    gate, options, _ = best_decisions(storage, _job(block_path), "ascend310")
    tuned = optimize(block_path, level=3, target="ascend310", rewrite_gate=gate,
                     pass_options=options)
    proto = onnx.load(block_path)
    out = to_onnx(tuned.model)
    onnx.checker.check_model(out)
    feeds = random_feeds(proto, seed=3)
    np.testing.assert_allclose(run(out, feeds)["y"], run(proto, feeds)["y"], rtol=1e-4, atol=1e-5)


def test_a_model_with_external_data_is_tuned_from_its_path(block_path, tmp_path):
    # Candidates compile from memory; a model whose weights sit beside it compiles from its path.
    path = tmp_path / "block.onnx"
    onnx.save(onnx.load(block_path), path, save_as_external_data=True, location="w.bin",
              size_threshold=0)
    for objective in ("estimate", "measured"):
        job = SubgraphJob(str(path), "cpu", level=3, objective=objective, repeat=2)
        result = tune_subgraph(job, trials=2, seed=0, storage=optuna.storages.InMemoryStorage())
        assert result.default.seconds > 0


def test_same_seed_same_choice(block_path):
    a = tune_subgraph(_job(block_path), trials=6, seed=3, storage=optuna.storages.InMemoryStorage())
    b = tune_subgraph(_job(block_path), trials=6, seed=3, storage=optuna.storages.InMemoryStorage())
    assert a.chosen == b.chosen and a.history == b.history


def test_measured_objective_times_a_cpu_compile_and_confirms_side_by_side(block_path, tmp_path):
    db = str(tmp_path / "m.db")
    job = SubgraphJob(block_path, "cpu", level=3, objective="measured", repeat=3, threads=1)
    result = tune_subgraph(job, trials=4, seed=0, storage=db, confirm_rounds=2)
    assert result.default.seconds > 0 and result.trials == 4  # the default is one of them
    if result.best.params != result.default.params:
        assert result.confirmed is not None and result.speedup >= 1.0
    else:
        assert result.speedup == 1.0
    # kb list shows the figures tune printed: the re-timing's, where there was one (it showed
    # the search's default beside that default over the re-timed ratio, a figure never timed).
    from graphopt.tuner.kb import list_subgraph_studies

    (row,) = list_subgraph_studies(db)
    default, chosen = result.confirmed or (result.default.seconds, result.default.seconds)
    assert row["default_seconds"] == default and row["confirmed"]
    assert row["best_seconds"] == pytest.approx(default / result.speedup)
    assert best_decisions(db, SubgraphJob(block_path, "cpu", level=3), "cpu") is not None
    # Another level is another study: nothing to apply.
    assert best_decisions(db, SubgraphJob(block_path, "cpu", level=2), "cpu") is None


def test_measured_accepts_rounding_and_refuses_a_wrong_default_leaving_no_study(
        tmp_path, monkeypatch):
    # YOLO's default compile moves its box decoding by 0.035 on 900-pixel coordinates, as
    # onnxruntime's own optimizer moves the original's: every trial, the default first, was
    # pruned, and the default's TrialPruned escaped as an internal error, leaving an empty
    # study. Here no tolerance at all makes the compile's rounding fail the plain check.
    import graphopt.tuner.subgraph as subgraph
    from graphopt.errors import VerificationError
    from graphopt.tuner.kb import list_subgraph_studies

    rng = np.random.default_rng(0)
    convs = str(tmp_path / "convs.onnx")  # NCHWc blocks sum in another order: 7e-6 off
    onnx.save(parse_model("""
        agraph (float[1,16,16,16] x) => (float[1,16,16,16] y) {
            c = Conv <pads = [1,1,1,1]> (x, w)
            r = Relu (c)
            y = Conv <pads = [1,1,1,1]> (r, w)
        }""", w=(rng.standard_normal((16, 16, 3, 3)) * 0.2).astype(np.float32)), convs)
    monkeypatch.setattr(subgraph, "CHECK_RTOL", 0.0)
    monkeypatch.setattr(subgraph, "CHECK_ATOL", 0.0)
    job = SubgraphJob(convs, "cpu", level=2, objective="measured", repeat=2, threads=1)
    db = str(tmp_path / "m.db")
    result = tune_subgraph(job, trials=2, seed=0, storage=db, confirm_rounds=0)
    assert result.default.seconds > 0
    # What rounding does not explain fails the default itself: said so, and no study is left.
    monkeypatch.setattr("graphopt.rounding.within_rounding", lambda *a, **k: None)
    other = str(tmp_path / "wrong.db")
    with pytest.raises(VerificationError, match=r"--objective measured: the default "
                                                r"compile's outputs differ from the original"):
        tune_subgraph(job, trials=2, seed=0, storage=other, confirm_rounds=0)
    assert list_subgraph_studies(other) == []


def test_measured_needs_a_cpu_target_and_one_local_worker(block_path):
    with pytest.raises(OptionError, match="needs a CPU target"):
        tune_subgraph(_job(block_path, objective="measured"), trials=1)
    with pytest.raises(OptionError, match="disturb each other"):
        tune_subgraph(SubgraphJob(block_path, "cpu", objective="measured"), trials=1, workers=2)
    with pytest.raises(OptionError, match="--granularity"):
        tune_subgraph(_job(block_path, granularity="node"), trials=1)


def test_the_cli_refuses_a_measured_npu_job_before_saying_it_starts(block_path, capsys):
    from helpers import run_cli

    rc, _, err = run_cli(capsys, "tune", block_path, "--target", "ascend310", "--job",
                         "subgraph", "--objective", "measured", "--trials", "1")
    assert rc == 1 and err.startswith("graphopt: error: --objective measured"), err


def test_a_model_the_subgraph_job_cannot_read_is_named(tmp_path, capsys):
    # The job read the file itself: a missing one was an internal error, a foreign one "<model>".
    from helpers import run_cli

    (tmp_path / "junk.onnx").write_bytes(b"junk")
    for model, message in (("missing.onnx", "missing.onnx: no such file"),
                           ("", f"{tmp_path}: is a directory"),
                           ("junk.onnx", "junk.onnx: not a valid ONNX model")):
        rc, _, err = run_cli(capsys, "tune", tmp_path / model, "--target", "cpu", "--job",
                             "subgraph", "--trials", "1", "--tuning-db", tmp_path / "kb.db")
        assert rc == 1 and message in err and "internal error" not in err, err


def test_two_workers_share_the_subgraph_study(block_path, tmp_path):
    db = str(tmp_path / "w.db")
    result = tune_subgraph(_job(block_path), trials=5, seed=0, storage=db, workers=2)
    study = optuna.load_study(study_name=result.study_name, storage=f"sqlite:///{db}")
    numbers = sorted(t.number for t in study.trials)
    assert numbers == list(range(5))  # the default, then four trials split over two workers
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)


def test_a_compile_with_other_pins_than_the_study_says_which_it_was_tuned_with(
        block_path, tmp_path, capsys):
    db = str(tmp_path / "kb.db")
    tune_subgraph(_job(block_path, input_shapes="x:1,64,256"), trials=2, seed=0, storage=db)
    om = str(tmp_path / "b.om")
    # The pin equals the model's own dims, but the study is keyed by it: said, not silent.
    rc, out, err = run_cli(capsys, "optimize", block_path, "-o", om, "-O3", "--target",
                           "ascend310", "--tuning-db", db)
    assert rc == 0, err
    assert "note: --tuning-db holds subgraph decisions for this model on ascend310 at -O3 " \
           "tuned with --input-shape x:1,64,256, where this compile has no --input-shape" \
        in out, out
    rc, out, err = run_cli(capsys, "optimize", block_path, "-o", om, "-O3", "--target",
                           "ascend310", "--tuning-db", db, "--input-shape", "x: 1,64,256")
    assert rc == 0, err
    assert "applying the subgraph decisions of subgraph/ascend310/" in out
    tune_subgraph(_job(block_path), trials=2, seed=0, storage=db)
    result = optimize(block_path, level=3, target="ascend310", tuning_db=db,
                      input_shapes="x:-1,64,256")
    assert any("tuned with no input_shapes / input_shapes='x:1,64,256', where this compile "
               "has input_shapes='x:-1,64,256'" in note for note in result.notes), result.notes
    # Another model's studies are no such hint.
    other = tmp_path / "other.onnx"
    proto = onnx.load(block_path)
    proto.graph.node[0].name = "renamed"
    onnx.save(proto, other)
    result = optimize(str(other), level=3, target="ascend310", tuning_db=db)
    assert not any("tuning_db" in note for note in result.notes), result.notes


def test_cli_tunes_then_optimize_applies_the_choice(block_path, tmp_path, capsys):
    db = str(tmp_path / "kb.db")
    rc, out, err = run_cli(capsys, "tune", block_path, "--target", "ascend310", "--job",
                           "subgraph", "-O3", "--trials", "12", "--tuning-db", db)
    assert rc == 0, err
    assert "subgraph tuning on ascend310 -O3" in out and "whole model (estimate)" in out
    assert "FuseMatMul:DividedMatMul@Div" in out and "subgraph trial 12/12" in err
    om = str(tmp_path / "b.om")
    rc, out, err = run_cli(capsys, "optimize", block_path, "-o", om, "-O3", "--target",
                           "ascend310", "--tuning-db", db)
    assert rc == 0, err
    assert "applying the subgraph decisions of subgraph/ascend310/" in out
    # A converting compile applies them too, saying they were priced on the float one.
    rc, out, err = run_cli(capsys, "optimize", block_path, "-o", om, "-O3", "--target",
                           "ascend310", "--tuning-db", db, "--precision", "fp16")
    assert rc == 0, err
    assert "which were tuned on the float compile: --precision fp16 changes what they were " \
           "priced on" in out
    # At another level they do not apply: said, rather than silently compiling without them.
    rc, out, err = run_cli(capsys, "optimize", block_path, "-o", om, "-O2", "--target",
                           "ascend310", "--tuning-db", db)
    assert rc == 0, err
    assert "note: --tuning-db holds subgraph decisions for this model on ascend310 at -O3, not " \
        "at -O2" in out
    rc, out, err = run_cli(capsys, "tune", block_path, "--target", "ascend310", "--objective",
                           "measured")
    assert rc == 1 and "--objective measured is for --job subgraph" in err


def test_the_library_applies_the_decisions_the_command_line_applies(block_path, tmp_path,
                                                                     capsys):
    import graphopt

    db = str(tmp_path / "kb.db")
    # A tuned choice that differs from the default compile: the default with FuseMatMul's
    # divided-MatMul rule switched off.
    result = tune_subgraph(_job(block_path), trials=12, seed=0, storage=db)
    assert result.chosen != result.default.params
    cli_om, api_om = str(tmp_path / "cli.om"), str(tmp_path / "api.om")
    rc, out, err = run_cli(capsys, "optimize", block_path, "-o", cli_om, "-O3", "--target",
                           "ascend310", "--tuning-db", db)
    assert rc == 0, err
    tuned = graphopt.optimize(block_path, level=3, target="ascend310", tuning_db=db)
    assert tuned.tuned_study == result.study_name
    assert tuned.notes[0] == f"applying the subgraph decisions of {result.study_name}"
    graphopt.save(tuned, api_om)  # the tilings of the same knowledge base, by default
    untuned = graphopt.optimize(block_path, level=3, target="ascend310")
    assert sorted(n.op_type for n in tuned.model.graph) == \
        sorted(n.op_type for n in graphopt.load_onnx(_partition_of(cli_om)).graph)
    assert [n.op_type for n in tuned.model.graph] != [n.op_type for n in untuned.model.graph]
    # A model given in memory is found by its serialized bytes.
    in_memory = graphopt.optimize(onnx.load(block_path), level=3, target="ascend310",
                                  tuning_db=db)
    assert in_memory.tuned_study == result.study_name
    with pytest.raises(OptionError, match="tuning_db applies what `graphopt tune` found for a "
                                          "target: give target="):
        graphopt.optimize(block_path, level=3, tuning_db=db)
    with pytest.raises(OptionError, match="give target="):  # it said "no such knowledge base"
        graphopt.optimize(block_path, level=3, tuning_db=str(tmp_path / "missing.db"))
    with pytest.raises(OptionError, match="no such knowledge base"):
        graphopt.optimize(block_path, level=3, target="ascend310",
                          tuning_db=str(tmp_path / "missing.db"))
    with pytest.raises(OptionError, match="save the result of optimize"):
        graphopt.save(graphopt.optimize(block_path), str(tmp_path / "x.om"), tuning_db=db)


def _partition_of(om_path: str) -> onnx.ModelProto:
    """The one NPU partition's model of a .om."""
    from graphopt.codegen import load_om

    artifact = load_om(om_path)
    (name,) = [p["name"] for p in artifact.manifest["partitions"] if p["device"] != "cpu"]
    return artifact.models.parse(name)


def test_a_measured_best_must_beat_the_default_by_more_than_noise():
    from graphopt.tuner.subgraph import MIN_MEASURED_GAIN, Scored, SubgraphResult
    from graphopt.tuner.subgraph_space import Space

    space = Space([], {}, "rule")
    default, best = Scored({"a": True}, 1.0, {}), Scored({"a": False}, 0.9, {})
    noise = SubgraphResult("s", space, default, best, 5, [], confirmed=(1.0, 0.995))
    assert noise.kept_default and noise.chosen == default.params and noise.speedup == 1.0
    gain = 1.0 / (1 + 2 * MIN_MEASURED_GAIN)
    real = SubgraphResult("s", space, default, best, 5, [], confirmed=(1.0, gain))
    assert not real.kept_default and real.chosen == best.params
    assert real.speedup == pytest.approx(1 + 2 * MIN_MEASURED_GAIN)


def test_the_plot_of_a_kept_default_says_so(block_path, tmp_path, monkeypatch, capsys):
    # Its legend showed the search's best as a 1.05x gain where the verdict, re-timed side by
    # side, kept the default.
    from helpers import run_cli

    import graphopt.cli_tune_subgraph as cli
    import graphopt.tuner.history_plot as plot
    from graphopt.tuner.subgraph import Scored, SubgraphResult
    from graphopt.tuner.subgraph_space import Space

    default, best = Scored({"a": True}, 1.0, {}), Scored({"a": False}, 0.95, {})
    kept = SubgraphResult("s", Space([], {}, "rule"), default, best, 5, [1.0, 0.95],
                          confirmed=(1.0, 0.995))
    monkeypatch.setattr("graphopt.tuner.subgraph.tune_subgraph", lambda *a, **k: kept)
    monkeypatch.setattr(cli, "_cost_rows", lambda *a: [])
    drawn = []
    monkeypatch.setattr(plot, "draw_histories", lambda series, *a, **k: drawn.extend(series))
    rc, out, err = run_cli(capsys, "tune", block_path, "--job", "subgraph", "--target", "cpu",
                           "--objective", "measured", "--tuning-db", tmp_path / "kb.db",
                           "--plot", tmp_path / "h.png")
    assert rc == 0, err
    assert "the default decisions are kept" in out
    assert drawn[0][0].endswith("(re-timed, its best 1.005x: default kept)")


def test_decisions_that_move_work_to_the_host_are_noted():
    from graphopt.cli_tune_subgraph import host_note
    from graphopt.tuner.subgraph import Scored, SubgraphResult
    from graphopt.tuner.subgraph_space import Space

    space = Space([], {}, "rule")
    default = Scored({"a": True}, 100e-6, {"npu": 80e-6, "cpu": 5e-6, "transfers": 15e-6})
    to_host = Scored({"a": False}, 60e-6, {"cpu": 60e-6})
    note = host_note(SubgraphResult("s", space, default, to_host, 5, []), "npu", "cpu")
    assert note.startswith("note: the tuned decisions move all of the work from npu to cpu "
                           "(npu 80.00 → 0.00 µs, cpu 5.00 → 60.00 µs)")
    # A win on the device itself, or the default kept, says nothing.
    on_device = Scored({"a": False}, 90e-6, {"npu": 70e-6, "cpu": 5e-6, "transfers": 15e-6})
    assert host_note(SubgraphResult("s", space, default, on_device, 5, []), "npu", "cpu") == ""
    kept = SubgraphResult("s", space, default, default, 5, [])
    assert host_note(kept, "npu", "cpu") == ""


def test_kb_list_shows_the_subgraph_studies(block_path, tmp_path, capsys):
    from helpers import run_cli

    db = str(tmp_path / "sg.db")
    tune_subgraph(SubgraphJob(block_path, "cpu"), trials=2, seed=0, storage=db)
    rc, out, err = run_cli(capsys, "kb", "list", "--tuning-db", db)
    assert rc == 0, err
    (row,) = [line for line in out.splitlines() if line.startswith("subgraph/cpu/")]
    assert row.split()[1] == "2"  # trials
    # No op study: no kernel table of headers alone, which reads as a failure.
    assert out.startswith("subgraph study") and "kernel signature" not in out


def test_kb_list_gives_the_cost_of_the_decisions_optimize_applies(block_path, tmp_path,
                                                                   monkeypatch):
    # simplify() may end on decisions cheaper than every trial (the zoo's GPT-2 at seed 3):
    # the listing shows theirs, not the best trial's.
    from dataclasses import replace

    from graphopt.tuner import subgraph
    from graphopt.tuner.kb import list_subgraph_studies

    monkeypatch.setattr(subgraph, "simplify",
                        lambda evaluator, space, best: replace(best, seconds=best.seconds / 2))
    db = str(tmp_path / "sg.db")
    result = tune_subgraph(_job(block_path), trials=6, seed=3, storage=db)
    (row,) = list_subgraph_studies(db)
    assert row["best_seconds"] == pytest.approx(result.default.seconds / result.speedup)


def test_resuming_an_estimate_priced_otherwise_now_is_refused(block_path, tmp_path,
                                                              monkeypatch):
    # Op tuning after the first run changes the knowledge base's tilings, so the cost model
    # now prices the default compile otherwise than the study's trial 0 did.
    from graphopt.tuner import subgraph

    db = str(tmp_path / "sg.db")
    tune_subgraph(_job(block_path), trials=2, seed=0, storage=db)
    tune_subgraph(_job(block_path), trials=1, seed=0, storage=db)  # unchanged: resumes
    priced = subgraph.Evaluator._estimate
    monkeypatch.setattr(subgraph.Evaluator, "_estimate",
                        lambda self, result: (priced(self, result)[0] * 0.9, {}))
    with pytest.raises(OptionError, match="priced the default compile at"):
        tune_subgraph(_job(block_path), trials=1, seed=0, storage=db)


def test_the_tuning_file_a_tune_leaves_stands_alone(block_path, tmp_path):
    # The job's results are in the .db itself, not in a -wal journal beside it that `cp` of the
    # .db would leave behind (the last connection, a read-only one, cannot checkpoint it).
    db = tmp_path / "kb.db"
    done = subprocess.run([sys.executable, "-m", "graphopt", "tune", block_path, "--target",
                           "ascend310", "--job", "subgraph", "-O3", "--trials", "3", "-q",
                           "--tuning-db", db], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(tmp_path)) == ["kb.db"]
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(db, copy / "kb.db")
    summaries = optuna.get_all_study_summaries(f"sqlite:///{copy / 'kb.db'}")
    assert [s.n_trials for s in summaries] == [3]


def test_the_same_pins_written_otherwise_name_the_same_study(block_path):
    from graphopt.tuner.subgraph_job import model_key, study_names

    spellings = ["x:1,8;mask:1,4", "mask:1,4; x:1,8", " x : 1,8 ;mask:1,4;",
                 {"mask": [1, 4], "x": [1, 8]}]
    keys = {model_key(SubgraphJob(block_path, "ascend310", 2, pins)) for pins in spellings}
    assert len(keys) == 1
    # A study an earlier graphopt named by the text as given is still found.
    job = SubgraphJob(block_path, "ascend310", 2, "x:1,8;mask:1,4")
    names = study_names(job, "ascend310")
    assert len(names) == 2 and model_key(job, legacy=True) in names[1]
    assert model_key(SubgraphJob(block_path, "ascend310", 2, None)) in study_names(
        SubgraphJob(block_path, "ascend310", 2, None), "ascend310")[0]


def test_a_model_without_decisions_is_priced_once_and_said_so(tmp_path, capsys):
    model = tmp_path / "relu.onnx"
    onnx.save(parse_model("g (float[4,64] x) => (float[4,64] y) { y = Relu (x) }"), model)
    db = tmp_path / "kb.db"
    for _ in range(2):  # the rerun adds nothing either
        rc, out, err = run_cli(capsys, "tune", model, "--target", "ascend310", "--job",
                               "subgraph", "--trials", "5", "--tuning-db", db)
        assert rc == 0, err
        assert "(estimate; 1 combination, 1 trial;" in out
        assert "nothing to tune: the compile on ascend310 at -O2 makes no decision" in out
        assert "decision  rewrites" not in out  # no table of headers alone
    # The op job says there is no cube kernel, not that dims need pinning: none are dynamic.
    rc, _, err = run_cli(capsys, "tune", model, "--target", "ascend310", "--tuning-db", db)
    assert rc == 1 and "its NPU ops run on the vector units" in err
    assert "pin dynamic dims" not in err
    # Compiled with that knowledge base, the note says why no tiling applies.
    rc, out, err = run_cli(capsys, "optimize", model, "-o", tmp_path / "r.om", "--target",
                           "ascend310", "--tuning-db", db)
    assert rc == 0 and "--tuning-db: no NPU cube kernel in this compile to apply tilings to" \
        in out


def test_a_model_that_compiles_to_nothing_tunes_and_reports_without_dividing_by_zero(
        tmp_path, capsys):
    # y = Shape(x) of a static x folds to a constant: the compile is priced at 0 s, and the
    # gain, the --plot and `report --tuning-db` divided by it (an internal error, exit 3).
    model = tmp_path / "shape.onnx"
    onnx.save(parse_model("g (float[2,3] x) => (int64[2] y) { y = Shape (x) }"), model)
    db, plot = tmp_path / "kb.db", tmp_path / "h.png"
    rc, out, err = run_cli(capsys, "tune", model, "--target", "cpu", "--job", "subgraph",
                           "--trials", "3", "--tuning-db", db, "--plot", plot)
    assert rc == 0, err
    assert "nothing to tune" in out and plot.exists()
    rc, _, err = run_cli(capsys, "optimize", model, "-o", tmp_path / "s.om", "--target", "cpu")
    assert rc == 0, err
    rc, _, err = run_cli(capsys, "report", tmp_path / "s.om", "-o", tmp_path / "r.html",
                         "--tuning-db", db)
    assert rc == 0, err


def test_a_dynamic_model_says_which_nodes_the_npu_cannot_take_and_the_pins(tmp_path, capsys):
    # It tuned a host-only compile saying only "nothing to tune", where the op job names the
    # dynamic input and the --input-shape that pins it.
    model = tmp_path / "relu.onnx"
    onnx.save(parse_model("g (float[N,64] x) => (float[N,64] y) { y = Relu (x) }"), model)
    for _ in range(2):  # the rerun, which reads the study, says it too
        rc, out, err = run_cli(capsys, "tune", model, "--target", "ascend310", "--job",
                               "subgraph", "--trials", "2", "--tuning-db", tmp_path / "kb.db")
        assert rc == 0, err
        assert "note: --target ascend310: 1 node(s) fell back to the cpu for dynamic shapes; " \
               "pin the dynamic input(s) 'x' [N,64] with --input-shape" in out, out


def test_a_named_study_is_found_and_a_foreign_one_refused(block_path, tmp_path, capsys):
    # A stale study's refusal says to name a new one: the knowledge base then has to find it.
    from graphopt.tuner.kb import list_subgraph_studies

    db = str(tmp_path / "named.db")
    named = tune_subgraph(_job(block_path), trials=6, seed=0, storage=db, study_name="after_op")
    assert [row["study"] for row in list_subgraph_studies(db)] == ["after_op"]
    rc, out, err = run_cli(capsys, "kb", "export", tmp_path / "kb.json", "--tuning-db", db)
    assert rc == 0 and out == (f"wrote {tmp_path / 'kb.json'}: 0 kernel(s) (not its 1 "
                               "subgraph study(ies): their decisions are keyed by the model "
                               "file and tuned again with it)\n"), err
    found = best_decisions(db, _job(block_path), "ascend310")
    assert found is not None and found[2] == "after_op" and named.changes()
    # Newer than the study under the job's own name: it is the one that applies.
    tune_subgraph(_job(block_path), trials=1, seed=0, storage=db)
    tune_subgraph(_job(block_path), trials=1, seed=0, storage=db, study_name="newest")
    assert best_decisions(db, _job(block_path), "ascend310")[2] == "newest"
    # Another job's study, an op study or another program's is not resumed under this one.
    tune_subgraph(_job(block_path, input_shapes="x:1,64,256"), trials=1, storage=db,
                  study_name="pinned")
    with pytest.raises(OptionError, match="--study pinned: that study tunes subgraph/ascend310/"
                                          ".*, not subgraph/ascend310/"):
        tune_subgraph(_job(block_path), trials=1, storage=db, study_name="pinned")
    optuna.create_study(storage=f"sqlite:///{db}", study_name="hpo").optimize(
        lambda trial: trial.suggest_float("x", 0, 1), n_trials=2)
    with pytest.raises(OptionError, match="--study hpo: that study holds trials graphopt's "
                                          "subgraph tuning did not make"):
        tune_subgraph(_job(block_path), trials=1, storage=db, study_name="hpo")
    op = optuna.create_study(storage=f"sqlite:///{db}", study_name="op")
    op.set_user_attr("shape", [1, 64, 256, 256, "float16"])
    with pytest.raises(OptionError, match="--study op: that is an op tuning study"):
        tune_subgraph(_job(block_path), trials=1, storage=db, study_name="op")
    # The command line says it records the default's decisions only when it does: not before
    # refusing a study, nor when it resumes one.
    for study, refused in (("op", True), ("newest", False)):
        rc, out, err = run_cli(capsys, "tune", block_path, "--target", "ascend310", "--job",
                               "subgraph", "-O3", "--trials", "1", "--tuning-db", db, "--study", study)
        assert rc == int(refused) and "recording the default" not in err, (study, err)
    rc, out, err = run_cli(capsys, "tune", block_path, "--target", "ascend310", "--job",
                           "subgraph", "-O3", "--trials", "1", "--tuning-db", db, "--study", "fresh")
    assert rc == 0 and "recording the default compile's decisions (estimate)…" in err, err


def test_an_unconfirmed_measured_study_is_not_applied(block_path, tmp_path, capsys):
    # A measured run stopped before its side-by-side re-timing left a best won by noise.
    db = str(tmp_path / "m.db")
    job = SubgraphJob(block_path, "cpu", level=3, objective="measured", repeat=2, threads=1)
    tune_subgraph(job, trials=2, seed=0, storage=db, confirm_rounds=1)
    assert best_decisions(db, SubgraphJob(block_path, "cpu", level=3), "cpu") is not None
    (summary,) = optuna.get_all_study_summaries(f"sqlite:///{db}")
    study = optuna.load_study(study_name=summary.study_name, storage=f"sqlite:///{db}")
    study._storage.set_study_user_attr(study._study_id, "chosen", None)  # as if interrupted
    assert best_decisions(db, SubgraphJob(block_path, "cpu", level=3), "cpu") is None
    # The compile's note says why, not that the study is at another level ("at -O3, not -O3").
    note = decisions_for(db, block_path, "cpu", 3, None).note
    assert f"subgraph study {summary.study_name} is not confirmed: its measured run stopped " \
        "before the side-by-side re-timing" in note and "not at -O3" not in note
    # kb list said nothing of it: its best read as any other.
    rc, out, err = run_cli(capsys, "kb", "list", "--tuning-db", db)
    assert rc == 0 and " (unconfirmed)" in out and "a compile does not apply it" in out, err


def test_a_default_compile_stopped_by_ctrl_c_is_scored_again(block_path, tmp_path,
                                                             monkeypatch):
    # Without it the next run passed its best trial off as the default (1.000x), `kb list`
    # had no default cost, and a measured best skipped its side-by-side re-timing.
    from graphopt.tuner import subgraph
    from graphopt.tuner.kb import list_subgraph_studies

    db = str(tmp_path / "sg.db")
    score = subgraph.Evaluator.score
    scored = []

    def interrupted(self, compiled):  # the default compile's scoring, after discovery's
        scored.append(compiled)
        if len(scored) == 2:
            raise KeyboardInterrupt
        return score(self, compiled)
    monkeypatch.setattr(subgraph.Evaluator, "score", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tune_subgraph(_job(block_path), trials=6, seed=0, storage=db)
    note = decisions_for(db, block_path, "ascend310", 3, None).note
    assert "has no completed trial" in note and "not at -O3" not in note
    monkeypatch.setattr(subgraph.Evaluator, "score", score)
    result = tune_subgraph(_job(block_path), trials=6, seed=0, storage=db)
    fresh = tune_subgraph(_job(block_path), trials=6, seed=0,
                          storage=optuna.storages.InMemoryStorage())
    assert result.default.params == result.space.default_params()
    assert result.default.seconds == pytest.approx(fresh.default.seconds)
    (row,) = list_subgraph_studies(db)
    assert row["default_seconds"] == pytest.approx(fresh.default.seconds)


def test_a_study_named_as_another_job_names_its_own_is_refused(block_path, tmp_path):
    # A subgraph study named by a kernel's signature was loaded by that kernel's op tuning,
    # which appended its tilings to the decisions; one named by another model's default name
    # would be resumed by that model's subgraph tuning.
    from graphopt.tuner.signature import is_subgraph_study_name

    db = tmp_path / "clash.db"
    sig = "ascend310/gemm/b1_m256_k256_n256/float16"
    with pytest.raises(OptionError, match=f"--study {sig}: that name is a kernel's signature"):
        tune_subgraph(_job(block_path), trials=1, storage=str(db), study_name=sig)
    other = "subgraph/ascend310/0123456789abcdef/O3/estimate"
    with pytest.raises(OptionError, match=f"--study {other}: that name is another subgraph "
                                          "job's study"):
        tune_subgraph(_job(block_path), trials=1, storage=str(db), study_name=other)
    assert not db.exists()
    own = tune_subgraph(_job(block_path), trials=1, storage=str(db))  # its default name
    assert is_subgraph_study_name(own.study_name)
    assert tune_subgraph(_job(block_path), trials=1, storage=str(db),
                         study_name=own.study_name).trials == 2


def test_the_default_is_scored_at_setup_not_queued_for_a_run_to_pick_up(block_path, tmp_path,
                                                                        monkeypatch):
    # Queued, two runs started together on one SQLite file could both take it, and one died
    # with "Cannot tell a COMPLETE trial" (exit 3). Scored under the setup lock, the default
    # is complete before any run samples a trial, and it counts as the run's first trial.
    from graphopt.tuner import subgraph

    db = str(tmp_path / "sg.db")
    run, seen = subgraph.optimize_failing_on_interrupt, []

    def look_first(study, objective, **options):
        seen.append([(t.state.name, t.user_attrs.get("default")) for t in study.trials])
        return run(study, objective, **options)
    monkeypatch.setattr(subgraph, "optimize_failing_on_interrupt", look_first)
    result = tune_subgraph(_job(block_path), trials=3, seed=0, storage=db)
    assert seen == [[("COMPLETE", True)]]
    assert result.trials == 3 and result.default.params == result.space.default_params()
    again = tune_subgraph(_job(block_path), trials=2, seed=0, storage=db)
    assert again.trials == 5 and again.default.seconds == result.default.seconds


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used")
def test_a_default_left_running_by_a_kill_is_named_as_a_possible_cause(block_path, tmp_path,
                                                                       monkeypatch):
    # An earlier release queued the default for a run to pick up. Within the heartbeat's
    # grace, a killed run's default looks like a live run's: it is not scored twice (workers
    # on other machines would each score it), and the refusal at the end names both causes.
    from graphopt.tuner import subgraph

    db = str(tmp_path / "sg.db")
    add_default = subgraph._add_default

    def queued_then_killed(study, evaluator, space):
        study.enqueue_trial(space.default_params(), user_attrs={"default": True})
        study.ask()  # the queued default, taken, then the process dies: no FAIL is written
        raise KeyboardInterrupt

    monkeypatch.setattr(subgraph, "_add_default", queued_then_killed)
    with pytest.raises(KeyboardInterrupt):
        tune_subgraph(_job(block_path), trials=3, seed=0, storage=db)
    monkeypatch.setattr(subgraph, "_add_default", add_default)
    with pytest.raises(OptionError, match=r"its default compile has not completed \(another "
                                          r"run .* or a run killed less than 30 s"):
        tune_subgraph(_job(block_path), trials=2, seed=0, storage=db)


def test_measured_times_print_at_one_precision():
    # 0.037 beside 0.03802 read as a less precise figure; 1234.5 ms must not end in a point.
    from graphopt.cli_tune_subgraph import _ms

    assert [_ms(s, "measured") for s in (0.000037, 0.00003802, 1.2345)] == \
        ["0.03700", "0.03802", "1234"]
    assert _ms(0.000037, "estimate") == "37.00"


def test_a_rewrite_on_a_model_of_one_partition_is_in_that_partition():
    # LayoutNchwc's rewrites of Clip and Add on a cpu model were listed under partition "-":
    # the nodes they make are named apart from any the partitioning holds.
    from types import SimpleNamespace

    from graphopt.tuner.subgraph_space import _partition_lookup

    node = SimpleNamespace(name="/conv/Conv", outputs=[SimpleNamespace(name="y")])
    one = SimpleNamespace(partitions=[SimpleNamespace(name="p0_cpu", nodes=[node])])
    assert _partition_lookup(one)("%made_by_a_pass") == "p0_cpu"
    two = SimpleNamespace(partitions=[*one.partitions,
                                      SimpleNamespace(name="p1_npu", nodes=[])])
    where = _partition_lookup(two)
    assert (where("/conv/Conv"), where("%y"), where("%made_by_a_pass")) == \
        ("p0_cpu", "p0_cpu", "-")


def test_a_decision_set_scored_before_keeps_its_score(block_path, monkeypatch):
    # In a small space the sampler repeats itself: a measured study re-timed the repeats
    # (6 of 17 trials in a space of 16), seconds each, and took the luckiest timing as best.
    from graphopt.tuner import subgraph

    compile_once, compiles = subgraph.Evaluator.compile, []

    def counted(self, params, space, **kwargs):
        compiles.append(params)
        return compile_once(self, params, space, **kwargs)
    monkeypatch.setattr(subgraph.Evaluator, "compile", counted)
    monkeypatch.setattr(subgraph, "simplify", lambda evaluator, space, best: best)  # its own
    result = tune_subgraph(_job(block_path), trials=60, seed=0,
                           storage=optuna.storages.InMemoryStorage())
    assert result.space.size == 40 and result.trials == 60
    scored = {tuple(sorted(p.items())) for p in compiles if p is not None}
    assert len(compiles) - 1 == len(scored) <= result.space.size  # discovery's, then one each


def test_the_cheaper_of_two_granularities_applies_and_another_targets_study_is_named(
        block_path, tmp_path):
    # The rule granularity's study won over a cheaper shape study of the same cost model
    # because of its place in a fixed order; a study for the 310 was passed over without a
    # word by a compile for the 310B.
    db = str(tmp_path / "kb.db")
    tune_subgraph(_job(block_path), trials=1, seed=0, storage=db)  # the default: no gain
    shaped = tune_subgraph(_job(block_path, granularity="shape"), trials=12, seed=0, storage=db)
    assert shaped.speedup > 1.05
    note = decisions_for(db, block_path, "ascend310", 3, None).note
    assert note.startswith(f"applying the subgraph decisions of {shaped.study_name} (cheaper "
                           "than those of subgraph/ascend310/") and "µs estimated)" in note, note
    assert best_decisions(db, _job(block_path), "ascend310")[2] == shaped.study_name
    other = decisions_for(db, block_path, "ascend310b", 3, None)
    assert other.gate is None and other.note == (
        "tuning_db holds subgraph decisions for this model on ascend310 (-O3), not on "
        "ascend310b: they apply to a compile for the target they were tuned for"), other.note


def test_a_study_at_another_level_and_pins_is_named_and_a_cpu_om_says_nothing_applied(
        block_path, tmp_path, capsys):
    # Another level and other pins both: the compile said nothing of the knowledge base, and
    # a CPU .om never says what of it applied (an NPU one says so of the tilings).
    db = str(tmp_path / "kb.db")
    tune_subgraph(SubgraphJob(block_path, "cpu", level=3, input_shapes="x:1,64,256"), trials=1,
                  storage=db)
    note = decisions_for(db, block_path, "cpu", 2, None).note
    assert note == ("tuning_db holds subgraph decisions for this model on cpu tuned at -O3 with "
                    "input_shapes='x:1,64,256', where this compile is at -O2 with no "
                    "input_shapes: they apply to a compile at the level and with the pins they "
                    "were tuned with"), note
    other = tmp_path / "other.onnx"
    onnx.save(parse_model("agraph (float[1,8] x) => (float[1,8] y) { y = Relu (x) }"), other)
    rc, out, err = run_cli(capsys, "optimize", other, "-o", tmp_path / "o.om", "--tuning-db", db)
    assert rc == 0 and f"note: --tuning-db: nothing in it applies to {tmp_path / 'o.om'}: no " \
        "subgraph decisions for this model on cpu at -O2" in out and "the cpu target has no NPU " \
        "kernels to take tilings" in out, out + err
