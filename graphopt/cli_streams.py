"""Input files given as pipes (`/dev/stdin`, a shell's `<(…)`) are copied to a temporary file
first: an .om or .npz is a zip read by seeking, and `inspect` sniffs a model before it parses
it, neither of which a pipe allows."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterator

from graphopt.atomic import is_special_file, scratch_folder
from graphopt.errors import OptionError

# The commands' arguments that name files they read (an output, like `kb export`'s, is not one).
_INPUT_ARGUMENTS = ("model", "models", "reference", "candidate", "inputs", "calibration",
                    "switch_file", "fusion_switch_file")


@contextlib.contextmanager
def streams_as_files(args, copies: dict[str, str]) -> Iterator[None]:
    """Inside the block, each input path of `args` that names a pipe or a socket is a
    temporary copy of what it delivered, and `copies` maps each copy's path to the path as
    given (for messages: terminal_text.paths_shown_as)."""
    if getattr(args, "command", None) == "report" and _is_stream(getattr(args, "model", None)) \
            and not args.output:
        raise OptionError(f"{args.model}: a report of a model read from a pipe needs "
                          "-o FILE.html (by default the page is written beside the model)")
    with contextlib.ExitStack() as stack:
        folder = None
        for argument in _INPUT_ARGUMENTS:
            value = getattr(args, argument, None)
            paths = value if isinstance(value, list) else [value]
            if not any(_is_stream(path) for path in paths):
                continue
            if folder is None:
                folder = stack.enter_context(scratch_folder("graphopt-stream-"))
            files = [_copy(path, folder, copies) if _is_stream(path) else path for path in paths]
            setattr(args, argument, files if isinstance(value, list) else files[0])
        yield


def _is_stream(path) -> bool:
    """A pipe or socket; not a device, whose bytes (/dev/zero) may never end."""
    if not isinstance(path, str) or not is_special_file(path):
        return False
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _copy(path: str, folder: str, copies: dict[str, str]) -> str:
    # Under the name as given (stdin, 63, model.om): a command that shows only a file's name
    # shows that, and an extension the name has is kept.
    subfolder = os.path.join(folder, str(len(copies)))
    os.mkdir(subfolder)
    copy = os.path.join(subfolder, os.path.basename(path) or "stream")
    try:
        source = open(path, "rb")  # noqa: SIM115 - closed below, its errors told from the copy's
    except OSError as exc:
        raise OptionError(f"{path}: cannot read ({exc.strerror or exc})") from None
    with source:
        try:
            with open(copy, "wb") as target:
                shutil.copyfileobj(source, target, 1 << 20)
        except OSError as exc:
            raise OptionError(f"{path}: cannot copy what it delivers to a temporary file in "
                              f"{os.path.dirname(folder)} ({exc.strerror or exc})") from None
    copies[copy] = path
    return copy
