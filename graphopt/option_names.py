"""The names messages give the options: a command-line flag (`--input-shape`) when the call
came from `graphopt …`, the keyword argument (`input_shapes`) when it came from the Python API.

The CLI's entry runs its command inside `command_line()`; library code that names an option in
a message writes `option("input_shapes")`, or `setting("precision", mode)` when it shows the
value too (`--precision fp8` on the command line, `precision='fp8'` in Python)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar

# Keyword argument (of optimize, save, or a pass_options key) -> the CLI flag that sets it.
FLAGS = {
    "allow_custom_ops": "--allow-custom-ops",
    "atol": "--atol",
    "calibration": "--calibration",
    "calibration_method": "--calibration-method",
    "disable_passes": "--disable-pass",
    "dump_dir": "--dump-dir",
    "dump_format": "--dump-format",
    "dynamic_dims": "--dynamic-dims",
    "fold_size_limit": "--fold-size-limit",
    "input_shapes": "--input-shape",
    "inputs": "--inputs",
    "int4_accuracy_level": "--int4-accuracy-level",
    "int4_embeddings": "--int4-embeddings",
    "int4_group_size": "--int4-group-size",
    "int4_method": "--int4-method",
    "keep_dtype": "--keep-dtype",
    "precision": "--precision",
    "precision_allow": "--precision-allow",
    "precision_deny": "--precision-deny",
    "quantize": "--quantize",
    "rtol": "--rtol",
    "switch_file": "--switch-file",
    "target": "--target",
    "trace_rules": "--trace-rule",
    "tuning_db": "--tuning-db",
    "verify": "--verify",
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


def option(keyword: str) -> str:
    """The option's name for a message: `--input-shape` under the CLI, `input_shapes` else."""
    return FLAGS[keyword] if _from_command_line.get() else keyword


def setting(keyword: str, value: object = True) -> str:
    """The option as given: `--precision fp8` / `precision='fp8'`, `--verify` / `verify=True`."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if _from_command_line.get():
        return FLAGS[keyword] if value is True else f"{FLAGS[keyword]} {value}"
    return f"{keyword}={value!r}"


def usage(keyword: str, metavar: str) -> str:
    """The option with a placeholder for its value: `--calibration FILE.npz|DIR` /
    `calibration=FILE.npz|DIR`."""
    if _from_command_line.get():
        return f"{FLAGS[keyword]} {metavar}"
    return f"{keyword}={metavar}"
