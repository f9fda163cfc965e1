"""The names messages give the options: a command-line flag (`--input-shape`) when the call
came from `graphopt …`, the keyword argument (`input_shapes`) when it came from the Python API.

The CLI's entry runs its command inside `command_line()`; library code that names an option in
a message writes `option("input_shapes")`, or `setting("precision", mode)` when it shows the
value too (`--precision fp8` on the command line, `precision='fp8'` in Python). A tool function
names its own keywords by its own table: `option("repeat", PROFILE_FLAGS)`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from contextvars import ContextVar

# Keyword argument (of optimize, save, or a pass_options key) -> the CLI flag that sets it.
FLAGS = {
    "activation_symmetric": "--activation-symmetric",
    "allow_custom_ops": "--allow-custom-ops",
    "atol": "--atol",
    "calibration": "--calibration",
    "calibration_method": "--calibration-method",
    "calibration_percentile": "--calibration-percentile",
    "disable_passes": "--disable-pass",
    "dump_dir": "--dump-dir",
    "dump_format": "--dump-format",
    "dynamic_dims": "--dynamic-dims",
    "fold_size_limit": "--fold-size-limit",
    "input_fp16_nodes": "--input-fp16-nodes",
    "input_shapes": "--input-shape",
    "inputs": "--inputs",
    "insert_op_conf": "--insert-op-conf",
    "int4_accuracy_level": "--int4-accuracy-level",
    "int4_embeddings": "--int4-embeddings",
    "int4_group_size": "--int4-group-size",
    "int4_method": "--int4-method",
    "keep_dtype": "--keep-dtype",
    "out_nodes": "--out-nodes",
    "output_type": "--output-type",
    "per_channel": "--per-channel",
    "precision": "--precision",
    "precision_allow": "--precision-allow",
    "precision_deny": "--precision-deny",
    "quant_keep_sensitive": "--quantize-sensitive",
    "quant_keep_ends": "--quantize-ends",
    "quant_equalize": "--no-equalize-channels",
    "quant_skip": "--quant-skip",
    "quantize": "--quantize",
    "rtol": "--rtol",
    "switch_file": "--switch-file",
    "target": "--target",
    "trace_rules": "--trace-rule",
    "tuning_db": "--tuning-db",
    "verify": "--verify",
}

# The inspection tools' keyword arguments -> the flag of their command, a table per tool: the
# same flag may have another keyword there (compare_models' feeds is --inputs, optimize's
# inputs), and the same keyword another flag (profile_model's level is onnxruntime's --level,
# optimize's and bisect's -O).
COMPARE_FLAGS = {  # compare_models, and accuracy_report, which takes its feeds alike
    "atol": "--atol",
    "feeds": "--inputs",
    "input_shapes": "--input-shape",
    "min_cosine": "--min-cosine",
    "per_tensor": "--per-tensor",
    "rtol": "--rtol",
    "seed": "--seed",
}
BISECT_FLAGS = {
    "atol": "--atol",
    "feeds": "--inputs",
    "input_shapes": "--input-shape",
    "level": "-O",
    "min_cosine": "--min-cosine",
    "rtol": "--rtol",
    "target": "--target",
}
PROFILE_FLAGS = {
    "calibration": "--calibration",
    "feeds": "--inputs",
    "input_shapes": "--input-shape",
    "level": "--level",
    "repeat": "--repeat",
    "seed": "--seed",
    "threads": "--threads",
    "warmup": "--warmup",
}
DIFF_PASS_FLAGS = {
    "all_runs": "--all-runs",
    "level": "-O",
    "pass_name": "--pass",
    "target": "--target",
}
REPORT_FLAGS = {  # tools.report_data.gather
    "atol": "--atol",
    "input_shapes": "--input-shape",
    "inputs": "--inputs",
    "min_cosine": "--min-cosine",
    "per_tensor": "--per-tensor",
    "reference": "--reference",
    "rtol": "--rtol",
    "tuning_db": "--tuning-db",
}
CALIBRATE_FLAGS = {  # tuner.calibrate.calibrate
    "threads": "--threads",
}

_from_command_line: ContextVar[bool] = ContextVar("graphopt_from_command_line", default=False)


@contextlib.contextmanager
def command_line() -> Iterator[None]:
    """Messages raised inside name the command line's flags."""
    token = _from_command_line.set(True)
    try:
        yield
    finally:
        _from_command_line.reset(token)


def from_command_line() -> bool:
    return _from_command_line.get()


_spellings: ContextVar[Mapping[str, str]] = ContextVar("graphopt_flag_spellings", default={})


@contextlib.contextmanager
def flags_spelled(renamed: Mapping[str, str]) -> Iterator[None]:
    """Messages raised inside name these flags as another command line spells them: graphopt
    atc runs its translation under ATC's names (--input_shape for --input-shape)."""
    token = _spellings.set({**_spellings.get(), **renamed})
    try:
        yield
    finally:
        _spellings.reset(token)


def spellings_in_use() -> Mapping[str, str]:
    """graphopt's flag -> the spelling of the command line being run (empty outside graphopt atc)."""
    return _spellings.get()


def spelled(flag: str) -> str:
    """A flag as the command line being run spells it (`--keep_dtype` under graphopt atc)."""
    return _spellings.get().get(flag, flag)


def _flag(keyword: str, flags: Mapping[str, str]) -> str:
    flag = flags[keyword]
    return _spellings.get().get(flag, flag)


_caller_keywords: ContextVar[Mapping[str, str]] = ContextVar("graphopt_caller_keywords",
                                                             default={})


@contextlib.contextmanager
def caller_keywords(renamed: Mapping[str, str]) -> Iterator[None]:
    """Messages raised inside name keywords as the Python caller spelled them: a tool that
    passes its own `inputs` on as another's `feeds` wraps that call in {"feeds": "inputs"}."""
    token = _caller_keywords.set({**_caller_keywords.get(), **renamed})
    try:
        yield
    finally:
        _caller_keywords.reset(token)


def _keyword(keyword: str) -> str:
    return _caller_keywords.get().get(keyword, keyword)


def option(keyword: str, flags: Mapping[str, str] = FLAGS) -> str:
    """The option's name for a message: `--input-shape` under the CLI, `input_shapes` else;
    `flags` is the table of the function that took the keyword."""
    return _flag(keyword, flags) if _from_command_line.get() else _keyword(keyword)


def setting(keyword: str, value: object = True, flags: Mapping[str, str] = FLAGS) -> str:
    """The option as given: `--precision fp8` / `precision='fp8'`, `--verify` / `verify=True`.
    A one-letter flag takes its value attached, as it is written: `-O3` / `level=3`."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if _from_command_line.get():
        flag = _flag(keyword, flags)
        if value is True:
            return flag
        return f"{flag}{value}" if len(flag) == 2 else f"{flag} {value}"
    return f"{_keyword(keyword)}={value!r}"


def usage(keyword: str, metavar: str, flags: Mapping[str, str] = FLAGS) -> str:
    """The option with a placeholder for its value: `--calibration FILE.npz|DIR` /
    `calibration=FILE.npz|DIR`."""
    if _from_command_line.get():
        return f"{_flag(keyword, flags)} {metavar}"
    return f"{_keyword(keyword)}={metavar}"
