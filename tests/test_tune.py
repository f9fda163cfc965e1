"""Operator tuning (graphopt.tuner.search/kb/signature, `graphopt tune`, `graphopt kb`): the
default is trial 0, TPE beats it on the 256³ fp16 MatMul, runs are deterministic and resume,
workers share one SQLite storage, and the knowledge base round-trips through JSON."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import re
import shlex
import sys
import time
from unittest.mock import ANY

import numpy as np
import onnx
import onnx.helper as oh
import optuna
import pytest
from helpers import IR_VERSION, run_cli

from graphopt import optimize, zoo
from graphopt.cli_tune import add_kb_parser, add_tune_parser
from graphopt.errors import OptionError
from graphopt.partition.target import load_target
from graphopt.tuner import GemmShape, default_tiling, estimate, tiling_space
from graphopt.tuner.tiling import ConvGeometry, feasible
from graphopt.tuner.kb import best_tilings, export_kb, import_kb, list_kb, tuned_tilings
from graphopt.tuner.records import kernel_records
from graphopt.tuner.search import outside_space, trial_tiling, tune_kernel
from graphopt.tuner.signature import model_kernels, parse_signature, signature

SHAPE = GemmShape(1, 256, 256, 256, "float16")
SIG = "ascend310/gemm/b1_m256_k256_n256/float16"


def _gemm_only(shape: GemmShape) -> GemmShape:
    import dataclasses

    return dataclasses.replace(shape, conv=None)


@pytest.fixture(scope="module")
def a310():
    return load_target("ascend310").device("npu")


def memory():
    return optuna.storages.InMemoryStorage()


def conv_model(path):
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, 32, 32])
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 16, 32, 32])
    w1 = onnx.numpy_helper.from_array(np.full((16, 16, 3, 3), 0.01, "float32"), "w1")
    w2 = onnx.numpy_helper.from_array(np.full((16, 16, 3, 3), 0.02, "float32"), "w2")
    nodes = [oh.make_node("Conv", ["x", "w1"], ["h"], name="conv1", pads=[1, 1, 1, 1]),
             oh.make_node("Relu", ["h"], ["r"], name="relu"),
             oh.make_node("Conv", ["r", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    graph = oh.make_graph(nodes, "two_convs", [x], [y], [w1, w2])
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)],
                            ir_version=IR_VERSION), path)
    return path


def test_signature_round_trip():
    assert signature("ascend310", "gemm", SHAPE) == SIG
    assert signature("ascend310", "gemm", GemmShape(1, 256, 256, 256, "float32")) == SIG
    assert parse_signature(SIG) == ("ascend310", "gemm", SHAPE)
    with pytest.raises(ValueError, match="not a kernel signature"):
        parse_signature("ascend310/matmul/256")


def test_default_is_trial_zero_and_tpe_beats_it(a310):
    result = tune_kernel(SHAPE, a310, target="ascend310", trials=50, seed=0, storage=memory())
    default = default_tiling(SHAPE, a310)
    assert result.study_name == SIG and result.trials == 50
    assert result.default == (default, estimate(SHAPE, default, a310).seconds)
    assert result.history[0] == result.default[1]           # trial 0 is the default
    assert result.best[1] <= result.default[1]
    # Within 2% of the exhaustive optimum, 1.093x in seconds (bench/tuning.py): 256x128x16,
    # L1 depth 4, one core; every seed of the bench is there at 50 trials.
    assert result.speedup >= 1.093 / 1.02
    assert outside_space(result.best[0], SHAPE, a310) is None
    assert result.best[0] in set(tiling_space(SHAPE, a310))
    assert result.space_size == 25784


def test_tuning_keeps_optuna_quiet_and_leaves_the_callers_verbosity(a310, tmp_path):
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("optuna").addHandler(handler)
    optuna.logging.set_verbosity(optuna.logging.INFO)
    try:
        tune_kernel(SHAPE, a310, target="ascend310", trials=3, seed=0,
                    storage=str(tmp_path / "kb.db"))
        assert optuna.logging.get_verbosity() == optuna.logging.INFO
        assert not [r.getMessage() for r in records]  # no line per trial from Optuna
    finally:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        logging.getLogger("optuna").removeHandler(handler)


@pytest.mark.parametrize("workers", [0, 1025])
def test_worker_counts_are_bounded_as_thread_counts_are(a310, workers, capsys):
    # Each worker is a process: --workers 100000 started one per trial on a 2-core machine.
    with pytest.raises(OptionError, match=f"workers must be from 1 to 1024, got {workers}"):
        tune_kernel(SHAPE, a310, target="ascend310", trials=3, workers=workers)
    rc, _, err = run_cli(capsys, "tune", "model.onnx", "--workers", str(workers))
    assert rc == 2 and f"--workers: {workers} is not allowed; give 1 to 1024" in err


def test_trial_zero_is_the_default_in_the_storage(a310, tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    tune_kernel(SHAPE, a310, target="ascend310", trials=3, storage=url)
    study = optuna.load_study(study_name=SIG, storage=url)
    first = min(study.trials, key=lambda t: t.number)
    assert first.number == 0 and first.user_attrs.get("default")
    assert trial_tiling(first) == default_tiling(SHAPE, a310)


def test_same_seed_same_search(a310):
    one = tune_kernel(SHAPE, a310, target="ascend310", trials=25, seed=3, storage=memory())
    two = tune_kernel(SHAPE, a310, target="ascend310", trials=25, seed=3, storage=memory())
    assert one.history == two.history and one.best == two.best


def test_runs_sharing_a_study_at_once_sample_apart():
    # Two `graphopt tune` runs started together on one database: each seeded its sampler with
    # the user's seed plus the trials done, the same for both, and they evaluated the same
    # tilings trial for trial. Alone, a run samples as before (test_same_seed_same_search).
    from graphopt.tuner.search import RunSampler

    study = optuna.create_study()
    runs = [RunSampler("random", 0, 0), RunSampler("random", 0, 0)]
    drawn = []
    for turn in range(6):  # the runs take trials in turn, as two processes may
        study.sampler = runs[turn % 2]
        trial = study.ask()
        drawn.append(trial.suggest_int("x", 0, 10 ** 9))
        study.tell(trial, 0.0)
    assert len(set(drawn)) == 6
    alone = optuna.create_study(sampler=RunSampler("random", 0, 0))
    plain = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for study in (alone, plain):
        study.optimize(lambda t: t.suggest_int("x", 0, 10 ** 9), n_trials=4)
    assert [t.params for t in alone.trials] == [t.params for t in plain.trials]


def test_rerun_resumes(a310, tmp_path):
    url = f"sqlite:///{tmp_path / 'resume.db'}"
    first = tune_kernel(SHAPE, a310, target="ascend310", trials=10, storage=url)
    second = tune_kernel(SHAPE, a310, target="ascend310", trials=10, storage=url)
    assert (first.trials, second.trials) == (10, 20)
    study = optuna.load_study(study_name=SIG, storage=url)
    assert sorted(t.number for t in study.trials) == list(range(20))
    assert sum(bool(t.user_attrs.get("default")) for t in study.trials) == 1
    assert second.best[1] <= first.best[1]


def _tune_four(url: str) -> None:
    tune_kernel(SHAPE, "ascend310", target="ascend310", trials=4, storage=url)


def test_runs_started_together_on_a_new_file_share_one_default_and_lose_no_trial(a310,
                                                                                tmp_path):
    # The default used to be queued and popped by whichever run came first: on SQLite two runs
    # could both pop it, and all but one then failed to record it ("Cannot tell a COMPLETE
    # trial"), their trials lost. It is priced when the study is opened, under the setup lock.
    from graphopt.tuner.search import open_study

    study = open_study(f"sqlite:///{tmp_path / 'open.db'}", SIG, SHAPE, a310)
    (default,) = study.trials
    assert default.state == optuna.trial.TrialState.COMPLETE and default.user_attrs["default"]
    assert default.value == pytest.approx(estimate(SHAPE, None, a310).seconds)
    url = f"sqlite:///{tmp_path / 'together.db'}"
    ctx = multiprocessing.get_context("spawn")
    runs = [ctx.Process(target=_tune_four, args=(url,)) for _ in range(3)]
    for run in runs:
        run.start()
    for run in runs:
        run.join(120)
    assert [run.exitcode for run in runs] == [0, 0, 0]
    trials = optuna.load_study(study_name=SIG, storage=url).trials
    assert len(trials) == 12 and sorted(t.number for t in trials) == list(range(12))
    assert {t.state for t in trials} == {optuna.trial.TrialState.COMPLETE}
    assert sum(bool(t.user_attrs.get("default")) for t in trials) == 1


def test_a_default_trial_stopped_midway_is_evaluated_again(a310, tmp_path):
    from graphopt.tuner.search import search_choices, step_params

    url = f"sqlite:///{tmp_path / 'stopped.db'}"
    # Earlier releases queued the default; a Ctrl-C during it left it failed.
    study = optuna.create_study(storage=url, study_name=SIG, direction="minimize")
    study.enqueue_trial(step_params(default_tiling(SHAPE, a310), search_choices(SHAPE, a310)),
                        user_attrs={"default": True})
    trial = study.ask()
    assert trial.user_attrs.get("default")
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    result = tune_kernel(SHAPE, a310, target="ascend310", trials=3, storage=url)
    default_seconds = estimate(SHAPE, None, a310).seconds
    assert result.default[1] == pytest.approx(default_seconds)
    assert result.best[1] <= default_seconds  # never a random tiling slower than the default
    assert result.trials == 3  # evaluated, as kb list counts them: not the stopped one
    study = optuna.load_study(study_name=SIG, storage=url)
    defaults = [t.state.name for t in study.trials if t.user_attrs.get("default")]
    assert defaults == ["FAIL", "COMPLETE"]
    (row,) = list_kb(url)
    assert row["default_seconds"] == pytest.approx(default_seconds)
    assert row["repriced"] and not row["stale"]  # tuned by this cost model


def test_a_stored_tiling_this_cost_model_prices_slower_is_not_applied(a310, tmp_path,
                                                                         capsys):
    from graphopt import zoo
    from graphopt.tuner.search import (search_choices, step_distributions, step_params,
                                       tiling_params)

    # A knowledge base another graphopt filled (another cost model) holds as its best a
    # tiling today's model prices slowest of all.
    url = f"sqlite:///{tmp_path / 'stale.db'}"
    tune_kernel(SHAPE, a310, target="ascend310", trials=2, storage=url)
    slow = max(tiling_space(SHAPE, a310), key=lambda t: estimate(SHAPE, t, a310).seconds)
    choices = search_choices(SHAPE, a310)
    study = optuna.load_study(study_name=SIG, storage=url)
    study.add_trial(optuna.trial.create_trial(
        params=step_params(slow, choices), distributions=step_distributions(choices),
        value=1e-9, user_attrs={"tiling": tiling_params(slow)}))
    assert best_tilings(url, "ascend310")[SIG][0] == slow
    # Resumed, the study's result is priced by this cost model: the stale figure is not it.
    resumed = tune_kernel(SHAPE, a310, target="ascend310", trials=0, storage=url)
    assert resumed.best[0] != slow and resumed.best[1] <= resumed.default[1]
    # kb list shows the same prices, and keeps the stored ones beside them.
    (row,) = list_kb(url)
    assert row["stale"] and row["stored"]["best_seconds"] == 1e-9
    assert row["best_seconds"] == pytest.approx(resumed.best[1])
    assert row["tiling"] == str(resumed.best[0])
    assert row["default_seconds"] == pytest.approx(resumed.default[1])
    assert _cli(["kb", "list", "--tuning-db", url]) == 0
    out = capsys.readouterr().out
    assert f"{resumed.best[1] * 1e6:.2f}" in out and "note: 1 kernel(s) hold figures another " \
        "cost model priced" in out
    # An export carries that tiling too, not the stale one.
    export_kb(url, tmp_path / "kb.json")
    exported = json.loads((tmp_path / "kb.json").read_text())["kernels"][SIG]
    assert exported["tiling"] == tiling_params(resumed.best[0])
    assert exported["seconds"] == pytest.approx(resumed.best[1])
    result = optimize(zoo.build("matmul256"), target="ascend310")
    no_gain: list[str] = []
    applied = tuned_tilings(url, result.model, result.partitioning, no_gain=no_gain)
    if resumed.best[0] == resumed.default[0]:
        assert applied == {} and no_gain == ["/MatMul"]  # the node that keeps its default
    else:  # the random trial beat the default: the compile applies what the table shows
        assert applied == {"/MatMul": resumed.best[0]} and no_gain == []
    # Only the stale tiling stored: the node keeps its default, and says so.
    only_slow = f"sqlite:///{tmp_path / 'only_slow.db'}"
    study = optuna.create_study(study_name=SIG, storage=only_slow)
    study.add_trial(optuna.trial.create_trial(
        params=step_params(slow, choices), distributions=step_distributions(choices),
        value=1e-9, user_attrs={"tiling": tiling_params(slow)}))
    no_gain = []
    assert tuned_tilings(only_slow, result.model, result.partitioning, no_gain=no_gain) == {}
    assert no_gain == ["/MatMul"]


def test_a_compile_applies_the_stored_tiling_this_cost_model_prices_fastest(a310, tmp_path):
    from graphopt import zoo
    from graphopt.tuner.search import (search_choices, step_distributions, step_params,
                                       tiling_params)

    # Stored best first a stale one, then one this model prices below the default: the
    # compile applies the second, the tiling tune's table shows as the study's best.
    space = sorted(tiling_space(SHAPE, a310), key=lambda t: estimate(SHAPE, t, a310).seconds)
    fast, slow = space[0], space[-1]
    assert estimate(SHAPE, fast, a310).seconds < estimate(SHAPE, None, a310).seconds
    url = f"sqlite:///{tmp_path / 'two.db'}"
    choices = search_choices(SHAPE, a310)
    study = optuna.create_study(study_name=SIG, storage=url)
    for tiling, value in ((slow, 1e-9), (fast, 2e-9)):
        study.add_trial(optuna.trial.create_trial(
            params=step_params(tiling, choices), distributions=step_distributions(choices),
            value=value, user_attrs={"tiling": tiling_params(tiling)}))
    result = optimize(zoo.build("matmul256"), target="ascend310")
    no_gain: list[str] = []
    assert tuned_tilings(url, result.model, result.partitioning, no_gain=no_gain) == {
        "/MatMul": fast}
    assert no_gain == []
    assert tune_kernel(SHAPE, a310, target="ascend310", trials=0, storage=url).best[0] == fast


def test_the_history_a_plot_draws_prices_the_trials_as_the_table_does(a310, tmp_path):
    # --plot drew the stored figures, which another cost model may have left (a stale 1 ns
    # here), beside a table that re-prices the same tilings.
    from graphopt.tuner.search import (search_choices, step_distributions, step_params,
                                       tiling_params)

    space = sorted(tiling_space(SHAPE, a310), key=lambda t: estimate(SHAPE, t, a310).seconds)
    url = f"sqlite:///{tmp_path / 'stale.db'}"
    choices = search_choices(SHAPE, a310)
    study = optuna.create_study(study_name=SIG, storage=url)
    for tiling, value in ((space[-1], 1e-9), (space[0], 2e-9)):
        study.add_trial(optuna.trial.create_trial(
            params=step_params(tiling, choices), distributions=step_distributions(choices),
            value=value, user_attrs={"tiling": tiling_params(tiling)}))
    # The HTML report's curve too, beside kb list's re-priced row.
    from graphopt.tuner.kb import kernel_history, list_kb

    (row,) = list_kb(url)
    assert kernel_history(optuna.load_study(study_name=SIG, storage=url), row, {}) == [
        estimate(SHAPE, space[-1], a310).seconds, estimate(SHAPE, space[0], a310).seconds]
    result = tune_kernel(SHAPE, a310, target="ascend310", trials=0, storage=url)
    assert result.best == (space[0], estimate(SHAPE, space[0], a310).seconds)
    # The default this run added is trial 2: the best stays the second trial's.
    assert result.history == [estimate(SHAPE, space[-1], a310).seconds, result.best[1],
                              result.best[1]]


def test_two_workers_share_one_sqlite_storage(tmp_path):
    url = f"sqlite:///{tmp_path / 'workers.db'}"
    result = tune_kernel(SHAPE, "ascend310", trials=12, storage=url, workers=2)
    assert result.trials == 12
    study = optuna.load_study(study_name=SIG, storage=url)
    assert sorted(t.number for t in study.trials) == list(range(12))
    states = {t.state for t in study.trials}
    assert states <= {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED}


def test_workers_need_a_shared_storage(a310):
    with pytest.raises(OptionError, match="shared storage"):
        tune_kernel(SHAPE, a310, target="ascend310", trials=4, storage=memory(), workers=2)


def test_kb_import_is_all_or_nothing(a310, tmp_path):
    from graphopt.tuner.search import DEVICE_ATTR

    src = f"sqlite:///{tmp_path / 'src.db'}"
    small = GemmShape(1, 128, 128, 128, "float16")
    tune_kernel(SHAPE, a310, target="ascend310", trials=3, storage=src)
    tune_kernel(small, a310, target="ascend310", trials=3, storage=src)
    export_kb(src, tmp_path / "kb.json")
    # The destination's study of one of them was tuned on another profile of the name.
    dst = f"sqlite:///{tmp_path / 'dst.db'}"
    tune_kernel(SHAPE, a310, target="ascend310", trials=2, storage=dst)
    optuna.load_study(study_name=SIG, storage=dst).set_user_attr(DEVICE_ATTR, "another board")
    with pytest.raises(OptionError, match=f"kernel {SIG}: .* another profile of that name .*"
                                          "nothing was imported"):
        import_kb(tmp_path / "kb.json", dst)
    assert optuna.get_all_study_names(dst) == [SIG]  # the other kernel was not added first


def test_two_imports_of_one_file_at_once_add_each_tiling_once(a310, tmp_path):
    # Each import had found every tiling missing before the other added it, and both added
    # it: studies of 3 trials, "imported 2" twice. Each import now looks and adds under the
    # setup lock. The look is slowed so that the two always overlap.
    import subprocess

    src, dst = f"sqlite:///{tmp_path / 'src.db'}", f"sqlite:///{tmp_path / 'dst.db'}"
    tune_kernel(SHAPE, a310, target="ascend310", trials=4, storage=src)
    tune_kernel(GemmShape(1, 128, 128, 128, "float16"), a310, target="ascend310", trials=4,
                storage=src)
    export_kb(src, tmp_path / "kb.json")
    script = (
        "import sys, time\n"
        "from graphopt.tuner import kb\n"
        "held_by = kb._held_by\n"
        "def slow(*args):\n"
        "    time.sleep(0.5)\n"
        "    return held_by(*args)\n"
        "kb._held_by = slow\n"
        "print(kb.import_kb(sys.argv[1], sys.argv[2]))\n")
    runs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "kb.json"), dst],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    assert sorted(int(out) for out, _ in outputs) == [0, 2]
    for name in optuna.get_all_study_names(dst):
        tilings = [tuple(sorted(t.params.items())) for t in
                   optuna.load_study(study_name=name, storage=dst).trials]
        assert len(tilings) == len(set(tilings)), name


def test_kb_export_import_round_trip(a310, tmp_path):
    src, dst = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    tune_kernel(SHAPE, a310, target="ascend310", trials=15, storage=src)
    conv = GemmShape(1, 1024, 144, 16, "float16",
                     ConvGeometry((32, 32), (32, 32), (3, 3), (1, 1), (1, 1)))
    tune_kernel(conv, a310, target="ascend310", op_class="conv", trials=8, storage=src)
    with pytest.raises(OptionError, match="a conv is priced by its geometry"):
        tune_kernel(_gemm_only(conv), a310, target="ascend310", op_class="conv", trials=1,
                    storage=src)
    assert export_kb(src, tmp_path / "kb.json") == 2
    assert import_kb(tmp_path / "kb.json", dst) == 2
    assert best_tilings(dst, "ascend310") == best_tilings(src, "ascend310")
    assert best_tilings(dst, "ascend910b") == {}
    assert import_kb(tmp_path / "kb.json", dst) == 0          # already there
    # Saved again by an editor that writes a byte-order mark: refused as not JSON, before.
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + (tmp_path / "kb.json").read_bytes())
    assert import_kb(bom, f"sqlite:///{tmp_path / 'c.db'}") == 2
    # The default's cost comes along: the import lists the same speedup as the source.
    rows, source = ({row["signature"]: row for row in list_kb(url)} for url in (dst, src))
    for key in ("default_seconds", "best_seconds", "speedup", "tiling"):
        assert rows[SIG][key] == source[SIG][key]
    assert rows[SIG]["trials"] == 2  # the default, completed, and the import
    # Tuning continues from the import: the default is trial 0, then the import.
    after = tune_kernel(SHAPE, a310, target="ascend310", trials=5, storage=dst)
    assert after.trials == 7 and after.best[1] <= best_tilings(src, "ascend310")[SIG][1]
    assert after.default[1] == source[SIG]["default_seconds"]
    rows = {row["signature"]: row for row in list_kb(dst)}
    assert rows[SIG]["trials"] == 7 and rows[SIG]["speedup"] >= 1.0


def test_a_study_named_by_the_user_is_found_by_its_kernel(a310, tmp_path):
    # `tune --study NAME` stores the kernel's signature on the study: the knowledge base
    # lists, exports and applies it as it does a study named by the signature.
    db = f"sqlite:///{tmp_path / 'named.db'}"
    named = tune_kernel(SHAPE, a310, target="ascend310", trials=8, storage=db,
                        study_name="myrun")
    (row,) = list_kb(db)
    assert (row["signature"], row["study"], row["trials"]) == (SIG, "myrun", 8)
    assert best_tilings(db, "ascend310")[SIG][1] == named.best[1]
    assert export_kb(db, tmp_path / "kb.json") == 1
    # Its own export imported back adds nothing: it made a second study of 2 trials, which a
    # later tune without --study resumed, leaving the named study's history behind.
    assert import_kb(tmp_path / "kb.json", db) == 0
    assert [row["study"] for row in list_kb(db)] == ["myrun"]
    # A study tuned under the signature too: the better of the two is the kernel's.
    tune_kernel(SHAPE, a310, target="ascend310", trials=2, storage=db)
    assert best_tilings(db, "ascend310")[SIG][1] == named.best[1]
    # The same kernel in float32 (the cube computes it in float16) resumes the named study.
    resumed = tune_kernel(GemmShape(1, 256, 256, 256, "float32"), a310, target="ascend310",
                          trials=1, storage=db, study_name="myrun")
    assert resumed.trials == 9
    # The name holds that kernel: another shape under it is refused.
    with pytest.raises(OptionError, match="--study myrun: that study tunes " + SIG):
        tune_kernel(GemmShape(1, 128, 256, 256, "float16"), a310, target="ascend310",
                    trials=2, storage=db, study_name="myrun")
    # A name that spells another kernel's signature would file this one's tilings there.
    other = "ascend310/gemm/b1_m64_k128_n48/float16"
    with pytest.raises(OptionError, match=f"--study {other}: that name is another kernel's"):
        tune_kernel(SHAPE, a310, target="ascend310", trials=2, storage=db, study_name=other)


def test_a_named_study_that_is_not_op_tunings_is_left_alone(a310, tmp_path):
    # Another program's study, or a subgraph study: op trials appended to it mixed with its
    # own, and a subgraph study was then read as a tuned compile priced at a tiling's cost.
    db = f"sqlite:///{tmp_path / 'mixed.db'}"
    foreign = optuna.create_study(storage=db, study_name="my-hpo")
    foreign.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=3)
    subgraph = optuna.create_study(storage=db, study_name="subgraph/ascend310/abc/O2/estimate")
    subgraph.set_user_attr("job", {"target": "ascend310", "level": 2})
    for name, message in (("my-hpo", "holds trials graphopt's op tuning did not make"),
                          (subgraph.study_name, "is a subgraph tuning study")):
        with pytest.raises(OptionError, match=f"--study {name}: that .*{message}"):
            tune_kernel(SHAPE, a310, target="ascend310", trials=2, storage=db, study_name=name)
        study = optuna.load_study(study_name=name, storage=db)
        assert len(study.trials) == (3 if name == "my-hpo" else 0)
        assert "signature" not in study.user_attrs and "shape" not in study.user_attrs


def test_a_study_named_as_subgraph_tuning_names_its_own_is_refused(a310, tmp_path):
    # Made as an op study, it was loaded by the subgraph job of that default name, which set
    # its decision space on it and refused it as priced by other tilings.
    db = tmp_path / "clash.db"
    name = "subgraph/ascend310/36e57623054c0a61/O3/estimate"
    with pytest.raises(OptionError, match=f"--study {name}: that name is a subgraph tuning "
                                          "study's; this job tunes ascend310/gemm/"):
        tune_kernel(SHAPE, a310, target="ascend310", trials=2, storage=str(db), study_name=name)
    assert not db.exists() or optuna.get_all_study_names(f"sqlite:///{db}") == []


def test_tuned_tilings_reach_the_kernel_records(tmp_path):
    model = optimize(conv_model(str(tmp_path / "m.onnx")), target="ascend310")
    kernels = model_kernels(model.model, model.partitioning)
    assert len(kernels) == 1 and len(kernels[0].nodes) == 2   # two convs, one signature
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    tune_kernel(kernels[0].shape, "ascend310", op_class="conv", trials=10, storage=url)
    tilings = tuned_tilings(url, model.model, model.partitioning)
    assert set(tilings) == set(kernels[0].nodes)
    records = kernel_records(model.model, model.partitioning, tilings, source="tuned")
    cube = [r for rows in records["partitions"].values() for r in rows if "tiling" in r]
    assert len(cube) == 2 and {r["tiling_source"] for r in cube} == {"tuned"}


def gated_model(path):
    """Two MatMuls of one signature: with epilogue fusion the first heads a graphopt:: group
    (its Sigmoid and Mul), the second stays alone."""
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64, 256])
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64, 256])
    w1 = onnx.numpy_helper.from_array(np.full((256, 256), 0.01, "float32"), "w1")
    w2 = onnx.numpy_helper.from_array(np.full((256, 256), 0.02, "float32"), "w2")
    nodes = [oh.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             oh.make_node("Sigmoid", ["h"], ["s"], name="sigmoid"),
             oh.make_node("Mul", ["s", "x"], ["g"], name="gate"),
             oh.make_node("MatMul", ["g", "w2"], ["y"], name="mm2")]
    graph = oh.make_graph(nodes, "gated", [x], [y], [w1, w2])
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)],
                            ir_version=IR_VERSION), path)
    return path


def test_a_cube_kernel_heading_an_epilogue_group_keeps_its_tuned_tiling(tmp_path):
    # It was priced at the default tiling and written to the .om without one, so a subgraph
    # study turning epilogues on compared an untuned fused kernel with a tuned lone one.
    from graphopt.tuner.model import model_estimate

    fused = optimize(gated_model(str(tmp_path / "m.onnx")), target="ascend310", level=3,
                     pass_options={"elementwise_epilogues": True})
    (call,) = [n for n in fused.model.graph if n.domain == "graphopt"]
    (kernel,) = model_kernels(fused.model, fused.partitioning)
    assert kernel.nodes == [call.name, "mm2"]
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    tune_kernel(kernel.shape, "ascend310", trials=10, storage=url)
    tilings = tuned_tilings(url, fused.model, fused.partitioning)
    assert set(tilings) == {call.name, "mm2"}
    records = kernel_records(fused.model, fused.partitioning, tilings, source="tuned")
    tiled = {r["node"]: r for rows in records["partitions"].values() for r in rows
             if "tiling" in r}
    assert tiled[call.name]["kind"] == "group" and tiled[call.name]["tiling_source"] == "tuned"
    assert tiled[call.name]["tiling"] == tiled["mm2"]["tiling"]
    group_us = {tuned: next(row.seconds for row in model_estimate(
        fused.model, fused.partitioning, tilings if tuned else None).rows if row.name == call.name)
        for tuned in (False, True)}
    assert group_us[True] < group_us[False]


def test_a_stored_tiling_that_an_edited_profile_cannot_hold_is_not_applied(tmp_path):
    # Studies are keyed by the target's name, which an edited copy of a profile keeps.
    import json

    import graphopt.partition

    source = conv_model(str(tmp_path / "m.onnx"))
    tuned = optimize(source, target="ascend310")
    (group,) = model_kernels(tuned.model, tuned.partitioning)
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    tune_kernel(group.shape, "ascend310", op_class="conv", trials=10, storage=url)
    folder = os.path.join(os.path.dirname(graphopt.partition.__file__), "targets")
    with open(os.path.join(folder, "ascend310.json")) as f:
        profile = json.load(f)
    profile["devices"][0]["buffers"]["L0C"] = 4096
    edited = tmp_path / "ascend310_small_l0c.json"
    edited.write_text(json.dumps(profile))
    small = optimize(source, target=str(edited))
    (kernel,) = model_kernels(small.model, small.partitioning)
    device = small.partitioning.target.device(kernel.device)
    stored_best = best_tilings(url, "ascend310")[group.signature][0]
    assert feasible(stored_best, kernel.shape, device) is not None  # L0C too small for it
    applied = tuned_tilings(url, small.model, small.partitioning)
    # What applies there, if anything, is another stored tiling that fits and beats the default.
    assert stored_best not in applied.values()
    for tiling in applied.values():
        assert feasible(tiling, kernel.shape, device) is None
        assert estimate(kernel.shape, tiling, device).seconds < \
            estimate(kernel.shape, None, device).seconds
    assert tuned_tilings(url, tuned.model, tuned.partitioning)


def two_matmuls() -> onnx.ModelProto:
    """Two unnamed MatMuls of different shapes: two kernel signatures on ascend310."""
    from tests.helpers import parse_model

    rng = np.random.default_rng(0)
    return parse_model("""
agraph (float[64,256] x) => (float[64,32] y) {
    h = MatMul (x, w1)
    y = MatMul (h, w2)
}
""", w1=rng.standard_normal((256, 512)).astype(np.float32),
        w2=rng.standard_normal((512, 32)).astype(np.float32))


def test_unnamed_cube_nodes_keep_their_own_tilings(tmp_path):
    proto = two_matmuls()
    result = optimize(proto, target="ascend310")
    kernels = model_kernels(result.model, result.partitioning)
    assert [g.nodes for g in kernels] == [["%h"], ["%y"]]  # unnamed: keyed by their output
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    for group in kernels:
        tune_kernel(group.shape, "ascend310", trials=30, storage=url)
    tilings = tuned_tilings(url, result.model, result.partitioning)
    assert set(tilings) == {"%h", "%y"} and tilings["%h"] != tilings["%y"]
    from graphopt.tuner.model import model_estimate

    default = model_estimate(result.model, result.partitioning).seconds
    assert model_estimate(result.model, result.partitioning, tilings).seconds <= default


def test_workers_share_the_kernels_and_find_what_one_process_finds(tmp_path, capsys):
    # Each kernel started `--workers` fresh processes for its trials, about 2 s apiece: two
    # workers tuned the zoo's ResNet-50 in 43 s against 10 s with one. The kernels are shared
    # out instead, each tuned as one process tunes it.
    proto = two_matmuls()
    path = tmp_path / "two.onnx"
    onnx.save(proto, path)
    tables, searches = [], []
    for workers in ("1", "2"):
        db = str(tmp_path / f"w{workers}.db")
        assert _cli(["tune", str(path), "--target", "ascend310", "--trials", "6",
                     "--tuning-db", db, "--workers", workers]) == 0
        out = capsys.readouterr().out
        tables.append(out.replace(db, "DB"))
        url = f"sqlite:///{db}"
        searches.append({name: [t.params for t in optuna.load_study(study_name=name,
                                                                    storage=url).trials]
                         for name in optuna.get_all_study_names(url)})
    assert tables[0] == tables[1]
    # Trial for trial the same search: each kernel's study was run as one process runs it.
    assert searches[0] == searches[1] and sorted(map(len, searches[1].values())) == [6, 6]


def _cli(argv):
    import argparse
    parser = argparse.ArgumentParser(prog="graphopt")
    sub = parser.add_subparsers(dest="command", required=True)
    add_tune_parser(sub)
    add_kb_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


def test_the_tables_whole_model_counts_what_a_compile_applies_from_another_study(tmp_path,
                                                                                capsys):
    # A --study NAME study held 26.23 µs for the kernel; a run on the default study printed
    # "tuned 28.98 µs, 1.000x" and a whole model without it, where a compile applies 26.23.
    from graphopt import zoo

    path = str(tmp_path / "mm.onnx")
    onnx.save(zoo.build("matmul256"), path)
    db = str(tmp_path / "st.db")
    assert _cli(["tune", path, "--target", "ascend310", "--study", "mine", "--trials", "25",
                 "--tuning-db", db, "-q"]) == 0
    named = capsys.readouterr().out
    assert _cli(["tune", path, "--target", "ascend310", "--trials", "1", "--tuning-db", db,
                 "-q"]) == 0
    out = capsys.readouterr().out
    whole = [line for line in out.splitlines() if line.startswith("whole model")]
    assert whole == [line for line in named.splitlines() if line.startswith("whole model")]
    assert "note: 1 kernel(s) have a faster tiling in another study of " in out
    assert "25.75     25.75    1.000" in out  # the table's row is still this study's own


def test_rows_are_read_again_after_another_run_improved_an_earlier_kernel(tmp_path, capsys,
                                                                          monkeypatch):
    # Two runs on one knowledge base: while this one tuned its second kernel, the other
    # added better trials to the first. Its row, read as it finished, kept the old best, and
    # a note blamed another study for the difference the whole-model line counted.
    import graphopt.tuner.search as search
    from graphopt import zoo

    path = str(tmp_path / "tiny.onnx")  # three kernels
    onnx.save(zoo.build("tiny"), path)
    db = str(tmp_path / "two.db")
    real, calls = search.tune_kernel, []

    def with_another_run(shape, device, **kw):
        calls.append(shape)
        if len(calls) == 2 and kw.get("trials"):  # the other run, on the first kernel
            real(calls[0], device, **{**kw, "trials": 60, "seed": 7, "progress": None})
        return real(shape, device, **kw)

    monkeypatch.setattr(search, "tune_kernel", with_another_run)
    assert _cli(["tune", path, "--target", "ascend310", "--trials", "2", "--tuning-db", db,
                 "-q"]) == 0
    out = capsys.readouterr().out
    assert "another study" not in out
    first = next(line for line in out.splitlines() if line.startswith("ascend310/conv"))
    assert first.split()[5] == "62"  # 2 of this run and 60 of the other


def test_a_better_trial_landing_between_the_reads_is_no_other_study(tmp_path, capsys,
                                                                      monkeypatch):
    # Two runs started together on one new knowledge base: the other added a faster trial to
    # this study between the rows' read and the read of what a compile applies, and a note
    # blamed "another study", with a whole-model figure that disagreed with the row.
    import graphopt.tuner.kb as kb
    import graphopt.tuner.search as search
    from graphopt import zoo

    path = str(tmp_path / "mm.onnx")
    onnx.save(zoo.build("matmul256"), path)
    db = str(tmp_path / "race.db")
    real_tilings, real_tune = kb.tuned_tilings, search.tune_kernel

    def then_the_other_run(*args, **kw):
        applied = real_tilings(*args, **kw)
        real_tune(SHAPE, "ascend310", trials=60, seed=7, target="ascend310",
                  storage=f"sqlite:///{db}")
        return applied

    monkeypatch.setattr(kb, "tuned_tilings", then_the_other_run)
    assert _cli(["tune", path, "--target", "ascend310", "--trials", "2", "--tuning-db", db,
                 "-q"]) == 0
    out = capsys.readouterr().out
    assert "another study" not in out, out
    row = next(line for line in out.splitlines() if line.startswith("ascend310/gemm"))
    whole = next(line for line in out.splitlines() if line.startswith("whole model"))
    assert row.split()[5] == "62"  # 2 of this run and 60 of the other
    # The whole-model line counts the row's tiling: both gain the same.
    default, tuned = float(row.split()[2]), float(row.split()[3])
    found = re.search(r"default ([\d.]+) µs, tuned ([\d.]+) µs", whole)
    assert abs((float(found[1]) - float(found[2])) - (default - tuned)) < 0.02, (row, whole)


def test_cli_tune_prints_the_table(tmp_path, capsys):
    path = conv_model(str(tmp_path / "m.onnx"))
    db = str(tmp_path / "cli.db")
    plot = str(tmp_path / "h.png")
    assert _cli(["tune", path, "--target", "ascend310", "--trials", "20", "--tuning-db", db,
                 "--plot", plot]) == 0
    out = capsys.readouterr()
    assert "ascend310/conv/b1_m1024_k144_n16_i32x32_o32x32_f3x3_s1x1_d1x1/float16" in out.out
    assert "speedup" in out.out and "whole model (estimate)" in out.out
    assert "kernel 1/1" in out.err
    # The next step: a compile applies the tilings only given the knowledge base.
    line = next(line for line in out.out.splitlines() if line.startswith("apply them: "))
    assert line == f"apply them: graphopt optimize {path} -o m.om --target ascend310 " \
        f"--tuning-db {db}"
    argv = shlex.split(line.removeprefix("apply them: "))[1:]
    argv[argv.index("-o") + 1] = str(tmp_path / "m.om")
    from graphopt.cli import main

    assert main(argv) == 0 and "tuned tilings for 2 of 2" in capsys.readouterr().out
    # tune's and kb's --storage spelling works there too (it was an unrecognized argument).
    argv[argv.index("--tuning-db")] = "--storage"
    assert main(argv) == 0 and "tuned tilings for 2 of 2" in capsys.readouterr().out
    with open(plot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert _cli(["kb", "list", "--tuning-db", db]) == 0
    assert "b1_m1024_k144_n16" in capsys.readouterr().out
    assert _cli(["kb", "list", "--tuning-db", db, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)  # one document, for scripts
    (kernel,) = listed["kernels"]
    assert kernel["signature"].endswith("b1_m1024_k144_n16_i32x32_o32x32_f3x3_s1x1_d1x1/float16")
    assert kernel["trials"] == 20
    assert listed["subgraph_studies"] == []
    assert _cli(["kb", "export", str(tmp_path / "kb.json"), "--tuning-db", db]) == 0


def test_optimize_with_the_knowledge_base_writes_tuned_tilings(tmp_path, capsys):
    from graphopt.cli import main
    from graphopt.codegen import load_om

    path = conv_model(str(tmp_path / "m.onnx"))
    db = str(tmp_path / "kb.db")
    assert main(["tune", path, "--target", "ascend310", "--trials", "8", "--tuning-db", db,
                 "-q"]) == 0
    out = str(tmp_path / "m.om")
    assert main(["optimize", path, "-o", out, "--target", "ascend310", "--tuning-db", db,
                 "-q"]) == 0
    records = load_om(out).extra["kernels"]["partitions"]["p0_npu"]
    cube = [r for r in records if r["kind"] == "cube"]
    assert len(cube) == 2 and {r["tiling_source"] for r in cube} == {"tuned"}
    assert main(["optimize", path, "-o", str(tmp_path / "m.onnx.opt.onnx"),
                 "--tuning-db", db]) == 1
    assert "--tuning-db applies what `graphopt tune` found for a target" in capsys.readouterr().err
    assert main(["optimize", path, "-o", out, "--tuning-db", str(tmp_path / "none.db")]) == 1
    assert "no such knowledge base" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "none.db")


def test_compiles_with_the_knowledge_base_leave_no_handles_on_it(tmp_path):
    # Each read of the knowledge base opened an engine whose pooled connections stayed open
    # until a full collection: 8 descriptors a compile, until "unable to open database file".
    import graphopt

    path = conv_model(str(tmp_path / "m.onnx"))
    db = str(tmp_path / "kb.db")
    assert _cli(["tune", path, "--target", "ascend310", "--trials", "4", "--tuning-db", db,
                 "-q"]) == 0

    def handles() -> int:
        folder = "/proc/self/fd"
        return sum(1 for fd in os.listdir(folder)
                   if os.path.realpath(os.path.join(folder, fd)).startswith(db))

    gc.disable()  # no collection may close them instead
    try:
        graphopt.save(graphopt.optimize(path, target="ascend310", tuning_db=db),
                      str(tmp_path / "m.om"))
        after_one = handles()
        for _ in range(4):
            graphopt.save(graphopt.optimize(path, target="ascend310", tuning_db=db),
                          str(tmp_path / "m.om"))
        assert handles() == after_one
    finally:
        gc.enable()


def test_a_result_finds_its_knowledge_base_after_a_chdir(tmp_path, monkeypatch):
    import graphopt

    path = conv_model(str(tmp_path / "m.onnx"))
    assert _cli(["tune", path, "--target", "ascend310", "--trials", "4", "--tuning-db",
                 str(tmp_path / "kb.db"), "-q"]) == 0
    monkeypatch.chdir(tmp_path)
    result = graphopt.optimize(path, target="ascend310", tuning_db="kb.db")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    graphopt.save(result, "m.om")  # took "kb.db" from the new folder, where there is none
    assert os.path.exists(elsewhere / "m.om")


def test_tuning_one_model_serves_another_with_the_same_layer_shape(tmp_path):
    from graphopt.cli import main
    from graphopt.codegen import load_om

    tuned = conv_model(str(tmp_path / "a.onnx"))
    db = str(tmp_path / "kb.db")
    assert main(["tune", tuned, "--target", "ascend310", "--trials", "8", "--tuning-db", db,
                 "-q"]) == 0
    # Model B shares the 16→16 3×3 conv at 32×32 and adds a 1×1 conv that nobody tuned.
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, 32, 32])
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 32, 32, 32])
    weights = [onnx.numpy_helper.from_array(np.full((16, 16, 3, 3), 0.01, "float32"), "w1"),
               onnx.numpy_helper.from_array(np.full((32, 16, 1, 1), 0.02, "float32"), "w2")]
    nodes = [oh.make_node("Conv", ["x", "w1"], ["h"], name="same", pads=[1, 1, 1, 1]),
             oh.make_node("Conv", ["h", "w2"], ["y"], name="new")]
    other = str(tmp_path / "b.onnx")
    onnx.save(oh.make_model(oh.make_graph(nodes, "b", [x], [y], weights),
                            opset_imports=[oh.make_opsetid("", 17)], ir_version=IR_VERSION), other)
    out = str(tmp_path / "b.om")
    assert main(["optimize", other, "-o", out, "--target", "ascend310", "--tuning-db", db,
                 "-q"]) == 0
    records = load_om(out).extra["kernels"]["partitions"]["p0_npu"]
    sources = {r["node"]: r["tiling_source"] for r in records if r["kind"] == "cube"}
    assert sources == {"same": "tuned", "new": "default"}


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used")
def test_a_killed_worker_loses_nothing(a310, tmp_path, monkeypatch):
    import graphopt.tuner.storage as storage

    monkeypatch.setattr(storage, "HEARTBEAT_S", 1)
    monkeypatch.setattr(storage, "GRACE_S", 1)
    db = str(tmp_path / "killed.db")
    first = tune_kernel(SHAPE, a310, target="ascend310", trials=6, seed=0, storage=db)
    # A worker dies mid-trial: its trial was asked for, never told, and its heartbeat stops.
    study = optuna.load_study(study_name=first.study_name, storage=storage.open_storage(db))
    orphan = study.ask()
    study._storage.record_heartbeat(orphan._trial_id)
    time.sleep(2.5)
    again = tune_kernel(SHAPE, a310, target="ascend310", trials=4, seed=1, storage=db)
    trials = optuna.load_study(study_name=first.study_name,
                               storage=storage.open_storage(db)).get_trials(deepcopy=False)
    states = [t.state for t in trials]
    assert states[orphan.number] == optuna.trial.TrialState.FAIL  # marked, not left RUNNING
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) >= 6 + 4 - sum(s == optuna.trial.TrialState.PRUNED for s in states)
    assert again.best[1] <= first.best[1]
    assert sorted(t.number for t in trials) == list(range(len(trials)))


POSTGRES = os.environ.get("GRAPHOPT_TEST_POSTGRES_URL")


@pytest.mark.skipif(not POSTGRES, reason="no PostgreSQL server: GRAPHOPT_TEST_POSTGRES_URL is "
                                         "unset (.ci/run starts one with .ci/postgres.sh)")
def test_two_workers_share_a_postgresql_study(a310):
    # Two worker processes on one server-backed study, as on two machines: every trial is
    # counted once, none lost, numbers unique; a rerun resumes the same study.
    import uuid

    study = f"pg-{uuid.uuid4().hex[:8]}"
    first = tune_kernel(SHAPE, a310, target="ascend310", trials=12, seed=0, storage=POSTGRES,
                        study_name=study, workers=2)
    again = tune_kernel(SHAPE, a310, target="ascend310", trials=4, seed=5, storage=POSTGRES,
                        study_name=study)
    trials = optuna.load_study(study_name=study, storage=POSTGRES).get_trials(deepcopy=False)
    assert first.trials == 12 and again.trials == 16 == len(trials)
    assert sorted(t.number for t in trials) == list(range(16))
    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    assert all(t.state in finished for t in trials)
    optuna.delete_study(study_name=study, storage=POSTGRES)


@pytest.mark.skipif(not POSTGRES, reason="no PostgreSQL server: GRAPHOPT_TEST_POSTGRES_URL is "
                                         "unset (.ci/run starts one with .ci/postgres.sh)")
def test_setting_a_study_up_on_postgresql_is_one_process_at_a_time():
    # Two runs started together on a server both queued the default trial.
    assert _setup_lock_order(POSTGRES) == ["first", "second"]


def _setup_lock_order(url: str) -> list[str]:
    """The order in which this thread, holding setup_lock(url), and a second thread asking
    for it while it is held get through it."""
    import threading

    from graphopt.tuner.storage import setup_lock

    held, order = threading.Event(), []

    def second():
        held.wait()
        with setup_lock(url):
            order.append("second")

    thread = threading.Thread(target=second)
    thread.start()
    with setup_lock(url):
        held.set()
        time.sleep(0.5)  # the other thread is waiting on the lock by now
        order.append("first")
    thread.join(timeout=30)
    return order


def test_progress_in_a_log_is_a_line_per_tenth_without_carriage_returns(capsys):
    from graphopt.progress import ProgressLine

    line = ProgressLine()
    for done in range(1, 101):
        line.update(f"trial {done}/100", done, 100)
    line.finish()
    err = capsys.readouterr().err
    assert "\r" not in err
    assert err.splitlines() == [f"trial {done}/100" for done in (1, *range(10, 101, 10))]
    for _ in range(3):  # workers' progress is polled: the last count comes again
        line.update("trial 100/100", 100, 100)
    assert capsys.readouterr().err == ""
    line.begin()
    line.update("kernel 2: trial 1/1", 1, 1)  # the next kernel, done at its first report
    assert capsys.readouterr().err == "kernel 2: trial 1/1\n"
    quiet = ProgressLine(enabled=False)
    quiet.update("trial 1/1", 1, 1)
    assert capsys.readouterr().err == ""


def test_progress_on_a_narrow_terminal_stays_one_row(capsys, monkeypatch):
    # A 39-column line rewritten on a 30-column terminal wraps, and each carriage return
    # went back to its last row only: every update left a stale row behind.
    import graphopt.progress as progress

    monkeypatch.setattr(progress, "_stderr_columns", lambda: 30)
    line = progress.ProgressLine()
    line.terminal = True
    line.update("kernel 1/1  trial 10/10  best 24.27 µs", 10, 10)
    line.update("kernel 1/1  trial 10/10", 10, 10)
    err = capsys.readouterr().err
    first, second = err.split("\r")[1:]
    assert first == "kernel 1/1  trial 10/10  bes…" and len(first) == 29
    assert second == "kernel 1/1  trial 10/10" + " " * 6  # covers the longer line's tail


def test_progress_of_many_kernels_in_a_log_is_a_line_per_kernel_and_a_heartbeat(
        capsys, monkeypatch):
    import graphopt.progress as progress

    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    line = progress.ProgressLine()
    for kernel in (1, 2):
        line.begin(2)
        for done in range(1, 51):
            clock[0] += 1.0 if kernel == 1 else 0.1  # the first kernel's trials take a second
            line.update(f"kernel {kernel}/2  trial {done}/50", done, 50)
        line.update(f"kernel {kernel}/2  trial 50/50", 50, 50)  # polled again
    assert capsys.readouterr().err.splitlines() == [
        "kernel 1/2  trial 30/50", "kernel 1/2  trial 50/50", "kernel 2/2  trial 50/50"]


def test_progress_under_a_timeout_goes_by_the_time_when_the_trial_cap_is_far(
        capsys, monkeypatch):
    import graphopt.progress as progress

    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    line = progress.ProgressLine()
    line.begin(1, seconds=60)
    for done in range(1, 121):  # a trial each half second, against a cap of 100000
        clock[0] += 0.5
        line.update(f"trial {done}/100000", done, 100000)
    # In a log: the first, then a line a tenth of the time, each saying how long of how long.
    assert capsys.readouterr().err.splitlines() == ["trial 1/100000  0/60 s"] + [
        f"trial {12 * tenth}/100000  {6 * tenth}/60 s" for tenth in range(1, 11)]
    # A --timeout under 10 s counts tenths: 0.3 s had read 0/0 s all along.
    line = progress.ProgressLine()
    line.begin(1, seconds=0.3)
    clock[0] += 0.15
    line.update("trial 1/100000", 1, 100000)
    assert capsys.readouterr().err.splitlines() == ["trial 1/100000  0.1/0.3 s"]


def test_progress_on_a_terminal_covers_a_longer_earlier_line(capsys):
    from graphopt.progress import ProgressLine

    line = ProgressLine()
    line.terminal = True  # capsys is no terminal
    line.update("trial 1/2, best 125.43 µs", 1, 2)
    line.update("trial 2/2, best 9.50 µs", 2, 2)
    line.finish()
    err = capsys.readouterr().err
    # What a terminal shows: the last carriage return's line, written over the first.
    first, last = err.rstrip("\n").split("\r")[1:]
    shown = last + first[len(last):]
    assert shown.rstrip() == "trial 2/2, best 9.50 µs"


def test_progress_on_a_terminal_ends_its_line_when_the_work_is_interrupted(capsys):
    from graphopt.progress import ProgressLine

    line = ProgressLine()
    line.terminal = True
    with pytest.raises(KeyboardInterrupt), line:
        line.update("trial 9/200", 9, 200)
        raise KeyboardInterrupt
    assert capsys.readouterr().err.endswith("trial 9/200\n")  # "interrupted" starts a line


def test_seeds_past_numpys_bound_wrap_and_the_cli_refuses_them(a310, tmp_path, capsys):
    # A rerun seeds the sampler with seed + the trials already done: the largest seed the CLI
    # takes, plus the enqueued default, passed numpy's 2**32 bound.
    from helpers import run_cli

    db = f"sqlite:///{tmp_path / 's.db'}"
    first = tune_kernel(SHAPE, a310, target="ascend310", trials=3, storage=db, seed=2**32 - 1)
    assert first.trials == 3
    rc, _, err = run_cli(capsys, "tune", conv_model(str(tmp_path / "m.onnx")), "--target",
                         "ascend310", "--seed", str(2**32))
    assert rc == 2 and "--seed: 4294967296 is too large; give 0 to 4294967295" in err, err


def test_workers_stop_with_the_parent_on_ctrl_c_and_failures_are_one_line():
    # Ctrl-C reaches the parent as KeyboardInterrupt (here from the progress tick): the
    # workers, which ignore SIGINT so none dies mid-commit, are terminated, not left running.
    import multiprocessing

    from graphopt.errors import GraphoptError
    from graphopt.tuner.workers import supervise

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=time.sleep, args=(60,)) for _ in range(2)]
    started = time.monotonic()

    def interrupt():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        supervise(procs, interrupt, "tuning worker")
    assert not any(p.is_alive() for p in procs) and time.monotonic() - started < 30
    failing = [ctx.Process(target=sys.exit, args=(3,))]
    with pytest.raises(GraphoptError, match=r"1 tuning worker\(s\) exited with status \[3\]"):
        supervise(failing, None, "tuning worker")


def test_a_worker_ends_when_its_parent_is_killed(tmp_path):
    # kill -9 (an OOM kill, a container's grace period) gives the parent no chance to stop
    # its workers: they went on tuning on their own, racing the rerun.
    import signal
    import subprocess

    script = tmp_path / "parent.py"
    script.write_text(
        "import multiprocessing, time\n"
        "from graphopt.tuner.workers import end_with_parent\n"
        "def worker():\n"
        "    end_with_parent(0.05)\n"
        f"    open({str(tmp_path / 'ready')!r}, 'w').close()\n"
        "    time.sleep(60)\n"
        "if __name__ == '__main__':\n"
        "    proc = multiprocessing.get_context('spawn').Process(target=worker)\n"
        "    proc.start()\n"
        "    print(proc.pid, flush=True)\n"
        "    time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())

    def running(pid: int) -> bool:  # a zombie nobody reaped has ended too
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # until the worker is up and watching
    assert running(worker)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while running(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(worker)


@pytest.mark.parametrize("model, flags", [
    ("matmul256", []), ("tiny", []),
    ("mobilenetv2", ["--job", "subgraph", "-O3", "--input-shape", "input:1,3,224,224"])])
def test_a_ctrl_c_leaves_no_worker_trial_running(model, flags, tmp_path):
    # The parent terminates its workers on Ctrl-C; they died with their trials RUNNING, which
    # a rerun within the heartbeat's 30 s grace counted as another run's. A terminated
    # worker now marks its trial failed and ends quietly. (matmul256: one kernel's trials on
    # both workers; tiny: its kernels shared out; mobilenetv2: its subgraph study's trials.)
    import signal
    import subprocess

    path = str(tmp_path / "m.onnx")
    onnx.save(zoo.build(model), path)
    db = tmp_path / "kb.db"
    url = f"sqlite:///{db}"
    run = subprocess.Popen([sys.executable, "-m", "graphopt", "tune", path, "--target",
                            "ascend310", "--trials", "5000", "--tuning-db", str(db),
                            "--workers", "2", *flags, "-q"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)

    def trials() -> list:
        try:
            return [t for name in optuna.get_all_study_names(url)
                    for t in optuna.load_study(study_name=name, storage=url).trials]
        except Exception:  # the tables not made yet
            return []
    deadline = time.monotonic() + 120
    while len(trials()) < 40 and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.2)
    os.killpg(run.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
    _, err = run.communicate(timeout=60)
    assert run.returncode == 130, err
    assert "Traceback" not in err, err
    states = {t.state for t in trials()}
    assert optuna.trial.TrialState.RUNNING not in states, states


def test_a_ctrl_c_while_the_workers_start_is_taken_once_they_have(monkeypatch):
    # The parent used to ignore SIGINT while it started the workers (for them to inherit), so
    # a Ctrl-C that came then was lost and the run went on to the end. Now it waits until
    # every worker has started, and all are terminated; the workers themselves block it.
    import multiprocessing
    import os
    import signal
    from multiprocessing import process

    from graphopt.tuner.workers import supervise

    start = process.BaseProcess.start

    def start_then_ctrl_c(self):
        start(self)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(process.BaseProcess, "start", start_then_ctrl_c)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=time.sleep, args=(5,)) for _ in range(2)]
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        supervise(procs, None, "tuning worker")
    assert [p.exitcode for p in procs] == [-signal.SIGTERM] * 2
    assert time.monotonic() - started < 4
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())


def test_op_tuning_compiles_with_the_switches_and_says_to_apply_them_alike(tmp_path, capsys):
    from helpers import run_cli

    model = conv_model(str(tmp_path / "m.onnx"))
    db = str(tmp_path / "kb.db")
    (tmp_path / "sw.cfg").write_text("FuseConvBatchNorm: off\n")
    rc, out, err = run_cli(capsys, "tune", model, "--target", "ascend310", "--trials", "2",
                           "--tuning-db", db, "--disable-pass", "FuseElementwise",
                           "--fusion-switch-file", tmp_path / "sw.cfg",
                           "--fold-size-limit", "4K", "-q")
    assert rc == 0, err
    line = next(line for line in out.splitlines() if line.startswith("apply them: "))
    assert f"--disable-pass FuseElementwise --switch-file {tmp_path / 'sw.cfg'} " \
        "--fold-size-limit 4096 --tuning-db" in line
    # An unknown pass is refused by the compile, as optimize refuses it.
    rc, _, err = run_cli(capsys, "tune", model, "--target", "ascend310", "--trials", "1",
                         "--tuning-db", db, "--disable-pass", "NoSuchPass")
    assert rc == 2 and "--disable-pass: unknown pass or rule NoSuchPass" in err, err
    # Subgraph tuning searches the rewrites itself.
    rc, _, err = run_cli(capsys, "tune", model, "--target", "ascend310", "--job", "subgraph",
                         "--tuning-db", db, "--disable-pass", "FuseElementwise")
    assert rc == 1 and "--disable-pass: for --job op; subgraph tuning searches" in err, err


def test_options_of_the_measured_subgraph_job_are_refused_for_op_tuning(tmp_path, capsys):
    from helpers import run_cli

    model = conv_model(str(tmp_path / "m.onnx"))
    for flags, message in ((["--repeat", "5"], "--repeat time candidates of --job subgraph"),
                           (["--threads", "2"], "--threads time candidates of --job subgraph"),
                           (["--granularity", "shape"], "--granularity is for --job subgraph")):
        rc, _, err = run_cli(capsys, "tune", model, "--target", "ascend310", *flags)
        assert rc == 1 and message in err, err
    # Nor by the estimated subgraph job, which prices candidates: they were ignored there.
    for flags in (["--repeat", "5"], ["--threads", "2"]):
        rc, _, err = run_cli(capsys, "tune", model, "--target", "ascend310", "--job",
                             "subgraph", *flags)
        assert rc == 1 and f"{flags[0]} time candidates of --objective measured" in err, err
    # An empty name or path (an unset shell variable) is not the option left out.
    for flag in ("--study", "--plot"):
        rc, _, err = run_cli(capsys, "tune", model, "--target", "ascend310", flag, "")
        assert rc == 2 and f"argument {flag}: an empty" in err, err
    rc, _, err = run_cli(capsys, "tune", model, "--target", "ascend310", "--repeat", "0")
    assert rc == 2 and "--repeat: 0 is not allowed" in err, err


@pytest.mark.parametrize("recorded", [
    None, {"base_m": 16, "swizzle": 1},
    # Every field there, of the wrong type: a crash in a comparison, or `cores: True` in an .om.
    {"base_m": "128", "base_n": 256, "base_k": 64, "l1_depth": 1, "double_buffer": True,
     "cores": 2},
    {"base_m": 128.0, "base_n": 256, "base_k": 64, "l1_depth": 1, "double_buffer": True,
     "cores": 2},
    {"base_m": 128, "base_n": 256, "base_k": 64, "l1_depth": 1, "double_buffer": 1,
     "cores": True}])
def test_a_trial_graphopt_did_not_write_is_a_one_line_error(a310, tmp_path, recorded):
    db = f"sqlite:///{tmp_path / 'edited.db'}"
    tune_kernel(SHAPE, a310, target="ascend310", trials=2, storage=db)
    study = optuna.load_study(study_name=SIG, storage=db)
    trial = optuna.trial.create_trial(value=1e-6, user_attrs={} if recorded is None
                                      else {"tiling": recorded})
    study.add_trial(trial)
    with pytest.raises(OptionError, match="records no tiling graphopt wrote"):
        list_kb(db)


def test_a_compile_leaves_out_a_trial_graphopt_did_not_write(tmp_path, capsys):
    from graphopt.cli import main
    from graphopt.codegen import load_om

    path = conv_model(str(tmp_path / "m.onnx"))
    db = str(tmp_path / "kb.db")
    # Enough trials to find a tiling faster than the default: only such a one is applied.
    assert main(["tune", path, "--target", "ascend310", "--trials", "8", "--tuning-db", db,
                 "-q"]) == 0
    [(sig, (kept, _))] = best_tilings(db, "ascend310").items()
    study = optuna.load_study(study_name=sig, storage=f"sqlite:///{db}")
    study.add_trial(optuna.trial.create_trial(value=1e-12, user_attrs={"tiling": {"x": 1}}))
    with pytest.raises(OptionError, match=f"study {sig}, trial 8 records no tiling graphopt"):
        best_tilings(db, "ascend310")
    skipped = []
    assert best_tilings(db, "ascend310", skipped=skipped) == {sig: (kept, ANY)}
    assert skipped == [f"{sig} #8"]
    # Tuning on, op or subgraph, takes the best of the trials graphopt wrote as well; op
    # tuning says which it left out.
    for job in ("op", "subgraph"):
        assert main(["tune", path, "--target", "ascend310", "--job", job, "--trials", "1",
                     "--tuning-db", db, "-q"]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert job == "subgraph" or ("note: left out 1 trial(s) that record no tiling graphopt "
                                     f"wrote ({sig} #8)") in out, out
    assert main(["optimize", path, "-o", str(tmp_path / "m.om"), "--target", "ascend310",
                 "--tuning-db", db]) == 0
    assert f"--tuning-db: left out 1 trial(s) that record no tiling graphopt wrote ({sig} #8)" \
        in capsys.readouterr().out
    records = load_om(str(tmp_path / "m.om")).extra["kernels"]["partitions"]["p0_npu"]
    assert {r["tiling_source"] for r in records if r["kind"] == "cube"} == {"tuned"}
    # kb list, export and the report show and move what the compile applied, saying what
    # they left out, rather than refusing the whole knowledge base for one trial.
    note = f"note: left out 1 trial(s) that record no tiling graphopt wrote ({sig} #8)"
    assert main(["kb", "list", "--tuning-db", db]) == 0
    out = capsys.readouterr().out
    assert note in out and str(kept) in out, out
    assert main(["kb", "list", "--tuning-db", db, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["left_out_trials"] == [f"{sig} #8"]
    assert [k["tiling"] for k in listed["kernels"]] == [str(kept)]
    # Its trials count is graphopt's: the tune's 8 and the resumed op run's 1 (it was 10).
    assert [k["trials"] for k in listed["kernels"]] == [9]
    export = str(tmp_path / "kb.json")
    assert main(["kb", "export", export, "--tuning-db", db]) == 0
    assert note in capsys.readouterr().out
    assert main(["kb", "export", "-", "--tuning-db", db]) == 0
    out, err = capsys.readouterr()
    assert note in err and json.loads(out) == json.load(open(export))
    fresh = str(tmp_path / "fresh.db")
    assert main(["kb", "import", export, "--tuning-db", fresh]) == 0
    assert best_tilings(fresh, "ascend310") == {sig: (kept, ANY)}
    report = str(tmp_path / "m.html")
    assert main(["report", str(tmp_path / "m.om"), "-o", report, "--tuning-db", db]) == 0, \
        capsys.readouterr().err


def test_tilings_off_the_search_ladders_are_outside_the_space(a310):
    from dataclasses import replace

    best = next(iter(tiling_space(SHAPE, a310)))
    assert outside_space(best, SHAPE, a310) is None
    assert "l1_depth 3 is not one of 1, 2, 4, 8" in outside_space(replace(best, l1_depth=3),
                                                                  SHAPE, a310)
    assert "base_m 1024 is not a base size for a dim of 256" in outside_space(
        replace(best, base_m=1024), SHAPE, a310)


def test_a_study_tuned_on_another_profile_of_the_name_is_refused(a310, tmp_path):
    from dataclasses import replace

    db = f"sqlite:///{tmp_path / 'kb.db'}"
    tune_kernel(SHAPE, a310, target="ascend310", trials=2, storage=db)
    smaller = replace(a310, buffers={**a310.buffers, "L0C": a310.buffers["L0C"] // 2})
    with pytest.raises(OptionError, match="was tuned on another profile of that name"):
        tune_kernel(SHAPE, smaller, target="ascend310", trials=2, storage=db)
    tune_kernel(SHAPE, a310, target="ascend310", trials=1, storage=db)  # the same one resumes


def test_an_export_whose_best_is_the_default_comes_back_identical(a310, tmp_path):
    src, dst = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    tune_kernel(SHAPE, a310, target="ascend310", trials=1, storage=src)  # the default alone
    export_kb(src, tmp_path / "a.json")
    import_kb(tmp_path / "a.json", dst)
    export_kb(dst, tmp_path / "b.json")
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()


def test_a_running_trial_that_never_beat_is_failed_after_the_grace(tmp_path, monkeypatch):
    # A worker killed between creating its trial and its heartbeat thread's first write.
    from graphopt.tuner import storage as storages

    store = storages.open_storage(f"sqlite:///{tmp_path / 'kb.db'}")
    study = optuna.create_study(storage=store, study_name="s")
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING))
    assert storages.fail_silent_trials(study) == 0  # within the grace: it may yet beat
    monkeypatch.setattr(storages, "GRACE_S", -1)
    assert storages.fail_silent_trials(study) == 1
    (trial,) = study.get_trials()
    assert trial.state == optuna.trial.TrialState.FAIL


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used")
def test_a_running_trial_whose_heartbeat_stopped_is_failed_before_any_trial(tmp_path,
                                                                             monkeypatch):
    # A worker killed mid-trial: Optuna fails it only inside study.optimize, and a rerun
    # deciding before that whether to queue the default again saw it RUNNING.
    from graphopt.tuner import storage as storages

    monkeypatch.setattr(storages, "GRACE_S", 1)
    monkeypatch.setattr(storages, "HEARTBEAT_S", 1)
    store = storages.open_storage(f"sqlite:///{tmp_path / 'kb.db'}")
    study = optuna.create_study(storage=store, study_name="s")
    trial = study.ask()
    store.record_heartbeat(trial._trial_id)
    storages.fail_silent_trials(study)
    assert study.get_trials()[0].state == optuna.trial.TrialState.RUNNING  # it may yet beat
    time.sleep(2.5)  # the heartbeat's time is stored to the second
    storages.fail_silent_trials(study)
    assert study.get_trials()[0].state == optuna.trial.TrialState.FAIL


def test_threads_of_one_process_take_a_files_setup_lock_one_at_a_time(tmp_path):
    # The flock is taken on one shared descriptor, which let a second thread in at once.
    assert _setup_lock_order(f"sqlite:///{tmp_path / 'kb.db'}") == ["first", "second"]


def test_a_new_knowledge_base_is_set_up_by_one_process_at_a_time(a310, tmp_path):
    # Two runs started together on a new file both created Optuna's tables (one failed) or
    # both queued the default trial. Setting up takes the file's lock: a second run waits.
    import multiprocessing
    import sqlite3

    from graphopt.tuner.storage import setup_lock

    db = tmp_path / "new.db"
    run = multiprocessing.get_context("spawn").Process(
        target=tune_kernel, args=(SHAPE, "ascend310"), kwargs={"trials": 3, "storage": str(db)})
    with setup_lock(f"sqlite:///{db}"):
        run.start()
        time.sleep(6)  # long enough for the run to import graphopt and reach its setup
        tables = sqlite3.connect(db).execute("SELECT name FROM sqlite_master").fetchall()
        assert run.is_alive() and tables == []
    run.join(120)
    assert run.exitcode == 0
    study = optuna.load_study(study_name=SIG, storage=f"sqlite:///{db}")
    assert len(study.trials) == 3
    assert [t.number for t in study.trials if t.user_attrs.get("default")] == [0]


def test_a_kernel_stopped_short_in_a_log_still_gets_its_line(capsys):
    # tune --timeout ends a study before its trial count: its last progress is shown anyway.
    from graphopt.progress import ProgressLine

    line = ProgressLine()
    with line:
        for kernel in (1, 2):
            line.begin(2)
            for done in range(1, 21):
                line.update(f"kernel {kernel}/2  trial {done}/50", done, 50)
    assert capsys.readouterr().err.splitlines() == ["kernel 1/2  trial 20/50",
                                                    "kernel 2/2  trial 20/50"]


def test_a_ctrl_c_in_optunas_bookkeeping_leaves_the_trial_failed(a310, tmp_path, monkeypatch):
    # Optuna fails the trial whose objective Ctrl-C interrupts, not one interrupted while it
    # records the result: that one stayed RUNNING (the default, when it was queued, and a
    # rerun within the heartbeat's grace period did not queue it again).
    db = f"sqlite:///{tmp_path / 'kb.db'}"
    record = optuna.storages.RDBStorage.set_trial_state_values
    interrupted = []

    def ctrl_c_while_recording(self, trial_id, state, values=None):
        if state == optuna.trial.TrialState.COMPLETE and not interrupted:
            interrupted.append(trial_id)
            raise KeyboardInterrupt
        return record(self, trial_id, state, values)

    monkeypatch.setattr(optuna.storages.RDBStorage, "set_trial_state_values",
                        ctrl_c_while_recording)
    with pytest.raises(BaseException) as raised:  # Optuna's own error on top of it
        tune_kernel(SHAPE, a310, target="ascend310", trials=3, storage=db)
    assert isinstance(raised.value, KeyboardInterrupt) \
        or isinstance(raised.value.__context__, KeyboardInterrupt)
    default, trial = optuna.load_study(study_name=SIG, storage=db).trials
    assert default.state == optuna.trial.TrialState.COMPLETE and default.user_attrs["default"]
    assert trial.state == optuna.trial.TrialState.FAIL
    monkeypatch.setattr(optuna.storages.RDBStorage, "set_trial_state_values", record)
    again = tune_kernel(SHAPE, a310, target="ascend310", trials=1, storage=db)
    assert again.default[1] > 0 and again.trials == 2


def test_a_ctrl_c_between_a_trials_creation_and_its_objective_leaves_it_failed(
        a310, tmp_path, monkeypatch):
    # The storage creates the trial, then Optuna sets it up (its Trial object, the sampler's
    # state, the heartbeat) before the objective runs: stopped there, the trial stayed
    # RUNNING (about one Ctrl-C in 16 at the command line).
    db = f"sqlite:///{tmp_path / 'kb.db'}"
    set_up = optuna.trial.Trial.__init__
    calls = []

    def ctrl_c_while_setting_up(self, study, trial_id):
        calls.append(trial_id)
        if len(calls) == 2:
            raise KeyboardInterrupt
        set_up(self, study, trial_id)

    monkeypatch.setattr(optuna.trial.Trial, "__init__", ctrl_c_while_setting_up)
    with pytest.raises(KeyboardInterrupt):
        tune_kernel(SHAPE, a310, target="ascend310", trials=5, storage=db)
    states = [t.state for t in optuna.load_study(study_name=SIG, storage=db).trials]
    assert states == [optuna.trial.TrialState.COMPLETE] * 2 + [optuna.trial.TrialState.FAIL]
    # The study's storage has its own methods again once the run ends, interrupted or not.
    from graphopt.tuner.storage import optimize_failing_on_interrupt

    monkeypatch.undo()
    study = optuna.create_study(storage=db, study_name="plain")
    optimize_failing_on_interrupt(study, lambda trial: trial.suggest_float("x", 0, 1),
                                  n_trials=2)

    def stopped(trial):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        optimize_failing_on_interrupt(study, stopped, n_trials=2)
    assert not {"create_new_trial", "set_trial_state_values"} & set(vars(study._storage))
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE", "FAIL"]

    # Optuna's own error on top of the interrupt (its trial runner reads a variable the
    # interrupted code never set) reached a library caller, who catches KeyboardInterrupt.
    def stopped_under_optunas_error(trial):
        try:
            raise KeyboardInterrupt
        finally:
            raise UnboundLocalError("cannot access local variable 'updated_state'")
    with pytest.raises(KeyboardInterrupt):
        optimize_failing_on_interrupt(study, stopped_under_optunas_error, n_trials=1)


def test_a_ctrl_c_that_lands_as_the_new_trials_commit_returns_leaves_it_failed(
        a310, tmp_path, monkeypatch):
    # SQLite's commit of a new trial takes long enough that a Ctrl-C often lands in it: the
    # KeyboardInterrupt came right after the row was written, before its id was returned,
    # and the trial stayed RUNNING. The signal now waits until the id is noted.
    import signal

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    db = f"sqlite:///{tmp_path / 'kb.db'}"
    create = optuna.storages.RDBStorage._create_new_trial
    calls = []

    def ctrl_c_as_the_commit_returns(self, study_id, template_trial=None):
        trial = create(self, study_id, template_trial)
        calls.append(trial.number)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return trial

    monkeypatch.setattr(optuna.storages.RDBStorage, "_create_new_trial",
                        ctrl_c_as_the_commit_returns)
    with pytest.raises(KeyboardInterrupt):
        tune_kernel(SHAPE, a310, target="ascend310", trials=5, storage=db)
    states = [t.state for t in optuna.load_study(study_name=SIG, storage=db).trials]
    assert states == [optuna.trial.TrialState.COMPLETE] * 2 + [optuna.trial.TrialState.FAIL]


def test_an_interrupted_tune_says_its_trials_are_kept_and_how_to_resume(tmp_path, capsys,
                                                                       monkeypatch):
    # It said only "graphopt: interrupted", where kb import says how far it got.
    import graphopt.tuner.search as search

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    def stopped_in_a_trial(*args, **kwargs):  # Optuna's cleanup fails as the stop unwinds
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("a variable the interrupted code never set") from None

    path = conv_model(str(tmp_path / "m.onnx"))
    db = tmp_path / "kb.db"
    # Stopped in the compile, before the knowledge base was made, it said trials were kept in
    # a file that was not there.
    import graphopt.compiler

    with monkeypatch.context() as patched:
        patched.setattr(graphopt.compiler, "optimize", stopped)
        rc, _, err = run_cli(capsys, "tune", path, "--target", "ascend310", "--tuning-db", db)
    assert rc == 130 and not db.exists()
    assert err.splitlines()[-2:] == [
        f"note: the stop came before any trial was stored: {db} was not made",
        "graphopt: interrupted"]
    optuna.create_study(storage=f"sqlite:///{db}", study_name="earlier")
    for stop in (stopped, stopped_in_a_trial):
        monkeypatch.setattr(search, "tune_kernel", stop)
        rc, _, err = run_cli(capsys, "tune", path, "--target", "ascend310", "--tuning-db", db)
        assert rc == 130
        assert err.splitlines()[-2:] == [
            f"note: the trials completed before the stop are kept in {db}; the same "
            "command resumes the job", "graphopt: interrupted"]


def test_op_tuning_on_a_target_without_an_npu_points_to_subgraph_tuning(tmp_path, capsys):
    # It said no node of the model runs on an NPU device, as if the model were at fault.
    import graphopt

    source = tmp_path / "tiny.onnx"
    onnx.save(graphopt.zoo.build("tiny"), source)
    rc, _, err = run_cli(capsys, "tune", source, "--target", "cpu", "--trials", "1",
                         "--tuning-db", tmp_path / "kb.db")
    assert rc == 1 and "--target cpu has no NPU: op tuning picks the tilings of NPU cube " \
                       "kernels; on the CPU, --job subgraph tunes" in err, err
