"""Checks of a command's output paths before any work: a long run must not end in an
unwritable path, and an output must never replace one of the command's own inputs."""

from __future__ import annotations

import os
import tempfile

from graphopt.atomic import destination, is_special_file, side_name
from graphopt.errors import OptionError, UsageError


def check_output_path(option: str, path: str,
                      inputs: dict[str, str | list[str] | None] | None = None) -> None:
    """OptionError naming `option` when `path` cannot be written as a file, or is the same file
    as one of `inputs` (what -> path, or paths for a repeatable option: "the model", "--inputs",
    …; None entries are skipped). `path` is judged where a write to it lands: a symbolic link's
    target (graphopt.atomic)."""
    if not os.fspath(path):
        raise OptionError(f"{option}: an empty path, expected a file name")
    target = destination(path)
    if os.path.isdir(target):
        raise OptionError(f"{option} {path}: is a directory, expected a file path")
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        problem = "is a file, not a folder" if os.path.exists(directory) else "does not exist"
        raise OptionError(f"{option} {path}: directory {directory} {problem}")
    named = [(what, source) for what, sources in (inputs or {}).items()
             for source in ([sources] if isinstance(sources, str) else sources or ())]
    for what, source in named:
        if _same_file(path, source):
            raise OptionError(f"{option} {path}: would overwrite {what} ({source}); write the "
                              "output elsewhere")
        if _reads_weights_from(source, target):
            raise OptionError(f"{option} {path}: holds the weights of {what} ({source}); write "
                              "the output elsewhere")
    _check_writable(option, path, target)


def refuse_model_name(option: str, path: str, writes: str) -> None:
    """UsageError when a text output (a report, a CSV, a trace) is named as a model: `-o
    x.onnx` replaced whatever model was there with text; or as "-", which other commands read
    as standard output, where these wrote a file of that name."""
    if os.fspath(path) == "-":
        raise UsageError(f"{option} -: {writes} to a file; for standard output give "
                         "/dev/stdout")
    if os.fspath(path).lower().endswith((".onnx", ".om")):
        raise UsageError(f"{option} {path}: {writes}, not a model; name it otherwise")


def _reads_weights_from(model_path: str, target: str) -> bool:
    """Whether the ONNX model at `model_path` keeps weights in the existing file `target`
    (its external data, found as the loader finds it: beside the path as given). Only a file
    under that folder, or the folder a link to the model lands in, can be one, which is all
    that needs the model's protobuf read (without its weights)."""
    from graphopt.codegen.om_weights import external_tensors
    from graphopt.errors import GraphoptError
    from graphopt.ir.onnx_io import read_model_proto

    folder = os.path.dirname(os.path.abspath(model_path))
    roots = {os.path.realpath(folder), os.path.dirname(os.path.realpath(model_path))}
    real = os.path.realpath(target)
    if not (os.path.isfile(target) and os.path.isfile(model_path)
            and any(real.startswith(root + os.sep) for root in roots)):
        return False
    try:
        proto = read_model_proto(model_path, load_external=False)
    except GraphoptError:
        return False  # not an ONNX model (an .om, a .npz): the command itself says what is wrong
    locations = {entry.value for tensor in external_tensors(proto)
                 for entry in tensor.external_data if entry.key == "location"}
    return any(_same_file(os.path.join(folder, location), target) for location in locations)


def _check_writable(option: str, path: str, target: str) -> None:
    """OptionError when the output cannot be written: found now, not after the work. It is
    written as a temporary file beside `target` renamed into place (graphopt.atomic), so a file
    of that kind is what is tried; permission bits alone do not tell (root, read-only mounts,
    /proc). A device or FIFO is written in place: it must be writable."""
    if is_special_file(target):
        if not os.access(target, os.W_OK):
            raise OptionError(f"{option} {path}: not writable")
        return
    directory = os.path.dirname(target)
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=side_name(target) + ".",
                                     suffix=".tmp")
    except OSError as exc:
        raise OptionError(f"{option} {path}: cannot create a file in {directory} "
                          f"({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(probe)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # either does not exist (yet): compare where they point
        return os.path.realpath(a) == os.path.realpath(b)
