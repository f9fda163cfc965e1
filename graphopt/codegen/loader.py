"""graphopt.load: open a compiled .om artifact as a runnable session."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from graphopt.api_args import without_nul
from graphopt.codegen.om_file import ReplacedWhileLoading
from graphopt.codegen.om_read import is_om, looks_like_onnx
from graphopt.codegen.runtime import OmSession
from graphopt.errors import ArtifactError, InputError, OptionError


# Loads of an artifact that a save keeps replacing: each attempt reads one whole file.
_ATTEMPTS = 3


def load(
    path: str | os.PathLike,
    *,
    intra_op_num_threads: int | None = None,
    optimization_level: str | None = None,
    inter_op_num_threads: int | None = None,
    session_config: Mapping[str, str] | None = None,
    profiles: list[str] | None = None,
) -> OmSession:
    """Load a compiled `.om` artifact for inference; `session.run({name: array})` runs it.

    Every member is checked against the manifest's checksums, and nothing in the file is
    executed. In an artifact of 1 MiB or more, the partitions' and weights' sums are computed
    on a thread of their own while the sessions are built: the first `run` waits for them, and
    raises the ArtifactError of a tampered member (`session.artifact` waits too, for a
    readiness check that must fail before the first request).

    The options go to each partition's onnxruntime session: `intra_op_num_threads` (None or 0:
    onnxruntime chooses), `optimization_level` ("disable", "basic", "extended", "all"; None:
    the level each partition's compile recorded, else "all"), `inter_op_num_threads` and
    `session_config` (session config entries).

    An artifact with shape profiles opens every profile's sessions, unless `profiles` names
    the ones to open (a worker that serves one batch size need not hold the others); inputs
    that fit a profile left closed are refused, saying so.

    Raises InputError when `path` is missing or is not an .om (an .onnx model must be compiled
    first), ArtifactError when the artifact is malformed or tampered with (see above for the
    sums checked later), OptionError for a bad option.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise OptionError(f"load takes the path of an .om file, not {type(path).__name__}")
    path = os.fsdecode(path)  # a path-like may give bytes, which os.path.join mixes with str
    if not path:
        raise OptionError("load: the path is empty")
    without_nul(path, "load")
    try:
        return _opened(path, intra_op_num_threads=intra_op_num_threads,
                       optimization_level=optimization_level,
                       inter_op_num_threads=inter_op_num_threads, session_config=session_config,
                       profiles=profiles)
    except ArtifactError:
        # The path is looked at, and the file sniffed, only once loading failed (start-up
        # matters): a missing file or a folder gets its own message, an ONNX model a hint, and
        # anything else that is not an .om load_om's precise reason (not a zip, no manifest, …).
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise InputError(f"{path}: no such file") from None
        except OSError:  # a folder on the way without search permission: the loader's reason
            mode = None  # (cannot read: Permission denied), not "no such file"
        if mode is None:
            raise
        if stat.S_ISDIR(mode):
            raise InputError(f"{path}: is a directory, expected an .om file") from None
        if not stat.S_ISREG(mode):
            # A pipe's bytes were read once already: sniffing it again would wait for a writer.
            raise InputError(f"{path}: not a regular file (a pipe or device); an .om is loaded "
                             "from a file, whose zip directory is read from its end") from None
        if not is_om(path) and looks_like_onnx(path):
            raise InputError(f"{path}: not an .om artifact (it looks like an ONNX model); compile "
                             f"it with `graphopt optimize {path} -o model.om` (or graphopt.optimize "
                             "+ graphopt.save)") from None
        if not is_om(path) and path.lower().endswith(".onnx"):
            # Named so but no model: compiling it, as the hint above says, would fail too.
            raise InputError(f"{path}: neither an .om artifact nor an ONNX model (its bytes do "
                             "not start as a serialized ModelProto does)") from None
        raise


def _opened(path: str, **options) -> OmSession:
    """OmSession(path), loaded again (_ATTEMPTS in all) when a save renamed a new artifact over
    the path mid-load (a pipeline reloading while another process writes): each attempt reads
    one whole file."""
    attempt = 1
    while True:
        try:
            return OmSession(path, **options)
        except ReplacedWhileLoading:
            if attempt == _ATTEMPTS:
                raise
            attempt += 1
