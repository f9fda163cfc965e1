"""What one pass did to a model: compile with ONNX dumps, diff the graph before and after it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from graphopt import api_args
from graphopt.atomic import scratch_folder, scratch_writes
from graphopt.errors import OptionError
from graphopt.option_names import DIFF_PASS_FLAGS, from_command_line, setting, usage
from graphopt.switches import read_switch_file
from graphopt.tools.diff import GraphDiff, diff_models, load_for_diff


@dataclass
class PassDiff:
    pass_name: str
    runs: int                 # how often the pass ran in the pipeline
    changed_runs: int         # how many of those runs changed the graph
    first_run: int            # 1-based run numbers diffed: before `first_run`, after `last_run`
    last_run: int
    rewrites: dict[str, int]  # summed over the diffed runs
    diff: GraphDiff
    between: list[str] = field(default_factory=list)  # other passes that changed the graph
                                                       # between first_run and last_run

    @property
    def note(self) -> str:
        runs = (f"run {self.first_run}" if self.first_run == self.last_run
                else f"runs {self.first_run}-{self.last_run}")
        others = (f"; the diff also holds what {', '.join(self.between)} changed between "
                  "them" if self.between else "")
        if self.changed_runs == 0:
            return (f"{self.pass_name} ran {self.runs} time(s) and never changed the graph; "
                    f"showing its {runs}{others}")
        rewrites = ", ".join(f"{k}={v}" for k, v in sorted(self.rewrites.items())) or "none"
        return (f"{self.pass_name} {runs} of {self.runs} ({self.changed_runs} changed the "
                f"graph); rewrites: {rewrites}{others}")

    def to_json(self) -> dict:
        return {"pass": {"name": self.pass_name, "runs": self.runs,
                         "changed_runs": self.changed_runs, "first_run": self.first_run,
                         "last_run": self.last_run, "rewrites": self.rewrites},
                **self.diff.to_json()}


def diff_pass(model: str | os.PathLike, pass_name: str, *, level: int = 2, target=None,
              all_runs: bool = False, allow_custom_ops: bool = False, input_shapes=None,
              precision: str = "keep", quantize: str = "none",
              calibration: str | os.PathLike | None = None,
              pass_options: dict | None = None, disable_passes=(),
              switch_file: str | os.PathLike | None = None,
              fold_size_limit: int | str | None = None) -> PassDiff:
    """Diff the graph right before and right after the first run of `pass_name` that changed
    it (its first run if none did); `all_runs`: before its first run, after its last run.
    `allow_custom_ops`, `input_shapes`, `precision`, `quantize`, `calibration`,
    `pass_options`, `disable_passes`, `switch_file` and `fold_size_limit` compile as
    optimize's do."""
    from graphopt.compiler import optimize

    label = os.path.basename(os.fspath(model))
    with scratch_folder("graphopt-diff-") as directory, scratch_writes():
        # The ONNX dumps are the snapshots: one per pass run, weights shared on disk.
        optimize(model, level=level, target=target, dump_dir=directory, dump_format="onnx",
                 allow_custom_ops=allow_custom_ops, input_shapes=input_shapes,
                 precision=precision, quantize=quantize, calibration=calibration,
                 pass_options=pass_options, disable_passes=disable_passes,
                 switch_file=switch_file, fold_size_limit=fold_size_limit)
        with open(os.path.join(directory, "passes.json"), encoding="utf-8") as f:
            log = json.load(f)
        records = log["passes"]
        runs = [i for i, r in enumerate(records) if r["pass"] == pass_name]
        if not runs:
            off = _switched_off(pass_name, disable_passes, switch_file)
            raise OptionError(off or _not_run(pass_name, records, level, target))
        changed = [i for i in runs if records[i]["changed"]]
        if all_runs:
            first, last = runs[0], runs[-1]
        else:
            first = last = changed[0] if changed else runs[0]
        before = log["import"]["dumps"][0] if first == 0 else records[first - 1]["dumps"][0]
        after = records[last]["dumps"][0]
        a = load_for_diff(os.path.join(directory, before))
        b = load_for_diff(os.path.join(directory, after))
        # Inside the block: the dumps' weights are read from weights.bin only when compared.
        diff = diff_models(a, b, label_a=f"{label} before {pass_name} (after {_step(before)})",
                           label_b=f"{label} after {pass_name}")
    rewrites: dict[str, int] = {}
    for i in runs:
        if first <= i <= last:
            for rule, count in records[i]["rewrites"].items():
                rewrites[rule] = rewrites.get(rule, 0) + count
    # With all runs, the window also spans the passes that ran between them.
    between = list(dict.fromkeys(records[i]["pass"] for i in range(first, last + 1)
                                 if i not in runs and records[i]["changed"]))
    return PassDiff(pass_name, len(runs), len(changed), runs.index(first) + 1,
                    runs.index(last) + 1, rewrites, diff, between)


def _step(dump_name: str) -> str:
    """`012_FoldConstants.onnx` -> `FoldConstants`, the pass whose result the dump holds."""
    return os.path.splitext(dump_name)[0].split("_", 1)[1]


def _switched_off(pass_name: str, disable_passes, switch_file) -> str | None:
    """Why `pass_name` did not run when the compile's own switches left it out, else None."""
    given = setting("pass_name", pass_name, DIFF_PASS_FLAGS)
    if pass_name in api_args.names(disable_passes, "disable_passes"):
        return f"{given}: switched off by {setting('disable_passes', pass_name)}"
    if switch_file and pass_name in read_switch_file(os.fspath(switch_file)):
        return f"{given}: switched off by the switch file {os.fspath(switch_file)}"
    return None


def _not_run(pass_name: str, records: list[dict], level: int, target) -> str:
    from graphopt.passes import PASSES

    ran = list(dict.fromkeys(r["pass"] for r in records))
    compiled = [setting("level", level, DIFF_PASS_FLAGS)]
    if target:
        compiled.append(setting("target", getattr(target, "name", target), DIFF_PASS_FLAGS))
    # `-O2 --target cpu` as a command line reads, `level=2, target='cpu'` as a call does.
    where = (" " if from_command_line() else ", ").join(compiled)
    ran_text = f"passes that ran: {', '.join(ran)}" if ran else "no pass ran"
    given = setting("pass_name", pass_name, DIFF_PASS_FLAGS)
    if pass_name not in PASSES:  # at no level: `graphopt passes` lists them all
        from graphopt.passes.manager import did_you_mean

        return (f"{given}: no such pass ({did_you_mean([pass_name], PASSES)}`graphopt passes` "
                f"lists them; {ran_text} at {where})")
    return f"{given}: did not run at {where}{_runs_when(pass_name)} ({ran_text})"


def _runs_when(pass_name: str) -> str:
    """What makes `pass_name` run, for a pass the compile left out: `did not run at -O2`
    alone sent a user of QuantizeInt8 or LayoutNchwc to try other levels, where it did not
    run either."""
    from graphopt.passes.pipelines import PIPELINES, PRECISION_PASSES

    cpu = setting("target", "cpu", DIFF_PASS_FLAGS)
    o2, o3 = (setting("level", n, DIFF_PASS_FLAGS) for n in (2, 3))
    asked = {"ConvertPrecision": usage("precision", "MODE"),
             **{name: setting("quantize", mode) for mode, name in PRECISION_PASSES.items()},
             # pipelines.for_target adds these two for a CPU target only.
             "WinogradConv": f"{o3} and {cpu}",
             "LayoutNchwc": f"{cpu}, on a CPU with AVX2 or AVX-512F, at {o2} or {o3}"}
    if pass_name in asked:
        return f"; it runs only with {asked[pass_name]}"
    levels = [setting("level", n, DIFF_PASS_FLAGS) for n, pipeline in PIPELINES.items()
              if pass_name in pipeline.pass_names()]
    return f"; it runs at {', '.join(levels)}" if levels else ""
