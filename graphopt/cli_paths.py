"""Checks of a command's output paths before any work: a long run must not end in an
unwritable path, and an output must never replace one of the command's own inputs."""

from __future__ import annotations

import os
import tempfile

from graphopt.errors import OptionError


def check_output_path(option: str, path: str, inputs: dict[str, str | None] | None = None) -> None:
    """OptionError naming `option` when `path` cannot be written as a file, or is the same file
    as one of `inputs` (what -> path: "the model", "--inputs", …; None entries are skipped)."""
    if os.path.isdir(path):
        raise OptionError(f"{option} {path}: is a directory, expected a file path")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        problem = "is a file, not a folder" if os.path.exists(directory) else "does not exist"
        raise OptionError(f"{option} {path}: directory {directory} {problem}")
    for what, source in (inputs or {}).items():
        if source is not None and _same_file(path, source):
            raise OptionError(f"{option} {path}: would overwrite {what} ({source}); write the "
                              "output elsewhere")
    _check_writable(option, path, directory)


def _check_writable(option: str, path: str, directory: str) -> None:
    """OptionError when no file can be created in `directory`: found now, not after the work.
    The output is written there as a temporary file renamed into place (graphopt.atomic), so
    a file of that kind is what is tried; permission bits alone do not tell (root, read-only
    mounts, /proc)."""
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.",
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
