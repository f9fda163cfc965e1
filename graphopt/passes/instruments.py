"""Pass instruments: cross-cutting work around every pass (timing lives in the manager;
structural verification and IR dumps are here)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import threading
from typing import TYPE_CHECKING

from graphopt.atomic import atomic_write_bytes
from graphopt.errors import OptionError, PassError
from graphopt.ir import format_model, verify
from graphopt.ir.tensor import external_initializers
from graphopt.ir.verify import VerifyError
from graphopt.option_names import setting

if TYPE_CHECKING:
    from graphopt.ir import Model
    from graphopt.passes.manager import PassLog, PassRecord


class Instrument:
    def start(self, model: "Model") -> None:
        """Called once after import, before the first pass."""

    def after_pass(self, model: "Model", record: "PassRecord", log: "PassLog") -> None:
        """Called after every pass run, with its record already in the log."""

    def finish(self, model: "Model", log: "PassLog") -> None:
        """Called once after the last pass."""

    def close(self) -> None:
        """Called once the run ends, finished or failed, for an instrument that started."""


class VerifyAfterEachPass(Instrument):
    """Structural verification after every pass; names the pass that broke the graph."""

    def start(self, model: "Model") -> None:
        self._check(model, "import", [])

    def after_pass(self, model, record, log) -> None:
        self._check(model, record.name, [r.name for r in log.records[:-1]])

    @staticmethod
    def _check(model, name: str, before: list[str]) -> None:
        try:
            verify(model)
        except VerifyError as e:
            history = f" (after: {', '.join(before[-5:])})" if before else ""
            raise PassError(f"pass {name} left the graph invalid: {e}{history}") from None


DUMP_FORMATS = ("text", "onnx", "both")
INDEX_FILE = "passes.json"
WEIGHTS_FILE = "weights.bin"  # tools.dump_onnx's: the ONNX dumps' shared external data
# What DumpIR names its files: NNN_<label>.txt or .onnx (the label sanitized to these characters).
_DUMP_NAME = re.compile(r"\d{3,}_[A-Za-z0-9_.-]*\.(txt|onnx)\Z")
_PROFILE_FOLDER = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*\Z")  # no "..", no separator


class DumpIR(Instrument):
    """Writes the IR after import and after each pass as numbered files (`NNN_<pass>.txt`
    printed IR, `NNN_<pass>.onnx` ONNX with its large weights shared in one `weights.bin`, or
    both), then passes.json with the log, each entry naming its dump files."""

    def __init__(self, directory: str, format: str = "text", source: str | None = None):
        if format not in DUMP_FORMATS:
            raise OptionError(f"{setting('dump_format', format)}: unknown format "
                              f"(use {', '.join(DUMP_FORMATS)})")
        self.directory = directory
        self.format = format
        self.source = source  # the model file compiled, which the dump must not overwrite
        self.count = 0
        self.files: list[list[str]] = []  # per dump (import first, then each pass run)
        self._weights = None
        self._claimed: str | None = None  # the folder's real path, while this dump has it

    def _write(self, model, label: str) -> None:
        stem = f"{self.count:03d}_{re.sub(r'[^A-Za-z0-9_.-]', '_', label)}"
        names = []
        if self.format in ("text", "both"):
            names.append(stem + ".txt")
            atomic_write_bytes(os.path.join(self.directory, names[-1]),
                               format_model(model).encode("utf-8"))
        if self.format in ("onnx", "both"):
            from graphopt.tools.dump_onnx import write_onnx_dump

            names.append(stem + ".onnx")
            write_onnx_dump(model, os.path.join(self.directory, names[-1]), self._weights)
        self.files.append(names)
        self.count += 1
        # An index of the dumps so far, which finish() replaces with the whole log: a compile
        # that fails or is interrupted leaves a folder the next dump recognises as its own.
        atomic_write_bytes(os.path.join(self.directory, INDEX_FILE), json.dumps({
            "dump_format": self.format, "complete": False, "import": {"dumps": self.files[0]},
            "passes": [{"dumps": later} for later in self.files[1:]]}).encode("utf-8"))

    def start(self, model) -> None:
        previous = _claimed(self.directory)
        self._claimed = _claim_folder(self.directory)
        try:  # a start that fails is not closed by the pass manager: give the folder back
            self._check_directory(model)
            _clear(self.directory, previous)
            if self.format in ("onnx", "both"):
                from graphopt.tools.dump_onnx import SharedWeights

                self._weights = SharedWeights(self.directory)
            self._write(model, "import")
        except BaseException:
            self.close()
            raise

    def _check_directory(self, model) -> None:
        """OptionError when the dump would overwrite the compiled model itself, or weights the
        model still reads from the folder."""
        folder = os.path.realpath(self.directory)
        where = setting("dump_dir", self.directory)
        source = self.source and os.path.realpath(self.source)
        if source and os.path.dirname(source) == folder and (
                _DUMP_NAME.match(os.path.basename(source))
                or os.path.basename(source) in (INDEX_FILE, WEIGHTS_FILE)):
            raise OptionError(f"{where}: the dump would overwrite the model {self.source}; "
                              "dump into another folder")
        for _, tensor in external_initializers(model):
            if os.path.dirname(os.path.realpath(tensor.external_path)) == folder:
                raise OptionError(f"{where}: the model reads its weights from "
                                  f"{tensor.external_path}, in the folder the dump rewrites; "
                                  "dump into another folder")

    def after_pass(self, model, record, log) -> None:
        self._write(model, record.name)

    def finish(self, model, log) -> None:
        data = log.to_json()
        data["dump_format"] = self.format
        data["import"] = {"dumps": self.files[0]}
        for entry, names in zip(data["passes"], self.files[1:]):
            entry["dumps"] = names
        atomic_write_bytes(os.path.join(self.directory, INDEX_FILE),
                           json.dumps(data, indent=1).encode("utf-8"))

    def close(self) -> None:
        if self._claimed is not None:
            with _DUMPING_LOCK:
                _DUMPING.discard(self._claimed)
            self._claimed = None


# The folders compiles of this process are dumping into, by real path: two compiles in two
# threads given one folder each rewrote the other's files and index.
_DUMPING: set[str] = set()
_DUMPING_LOCK = threading.Lock()


def _claim_folder(directory: str) -> str:
    """The folder's real path, now marked as this dump's; OptionError when another compile of
    this process is dumping into it."""
    folder = os.path.realpath(directory)
    with _DUMPING_LOCK:
        if folder in _DUMPING:
            raise OptionError(f"{setting('dump_dir', directory)}: another compile is dumping "
                              "into that folder now; give each compile its own")
        _DUMPING.add(folder)
    return folder


def start_profile_dumps(directory: str, profiles: list[str], format: str) -> None:
    """Ready `directory` for one dump folder per shape profile: an earlier dump there (flat or
    by profile) goes, and a passes.json naming the profile folders takes its place, by which
    the next dump into the folder removes them in turn."""
    previous = _claimed(directory)
    _clear(directory, previous)
    atomic_write_bytes(os.path.join(directory, INDEX_FILE), json.dumps(
        {"dump_format": format, "profiles": profiles}, indent=1).encode("utf-8"))


def _claimed(directory: str) -> dict | None:
    """Create `directory` if need be and read the passes.json an earlier graphopt dump left
    there (None: none). OptionError when the folder holds a passes.json or weights.bin no dump
    wrote (a model's external data, say), or a link there: the dump would replace it."""
    where = setting("dump_dir", directory)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise OptionError(f"{where}: cannot create it: {e.strerror or e}") from None
    try:  # a folder that exists but takes no file (read-only, immutable): say so before the work
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".graphopt-dump.", suffix=".tmp")
    except OSError as e:
        raise OptionError(f"{where}: cannot create a file in it: {e.strerror or e}") from None
    os.close(fd)
    os.unlink(probe)
    previous = _index(directory)
    owned = _owned(previous)
    for name in (INDEX_FILE, WEIGHTS_FILE):
        path = os.path.join(directory, name)
        if os.path.islink(path) or (os.path.lexists(path) and name not in owned):
            raise OptionError(f"{where}: holds a {name} that no graphopt dump wrote; dump "
                              "into an empty or new folder")
    return previous


def _index(directory: str) -> dict | None:
    """The passes.json of an earlier graphopt dump into `directory`: a flat dump's (its files
    listed per pass) or a profiled compile's (its profile folders); None for none, or for a
    passes.json graphopt did not write."""
    try:
        with open(os.path.join(directory, INDEX_FILE), encoding="utf-8") as f:
            data = json.load(f)
        if data["dump_format"] not in DUMP_FORMATS:
            return None
        if "profiles" in data:
            folders = data["profiles"]
            return data if isinstance(folders, list) and all(
                isinstance(n, str) and _PROFILE_FOLDER.match(n) for n in folders) else None
        entries = [data.get("import", {}), *data.get("passes", [])]
        names = [name for entry in entries for name in entry.get("dumps", [])]
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return None
    return data if all(isinstance(n, str) and _DUMP_NAME.match(n) for n in names) else None


def _owned(index: dict | None) -> set[str]:
    """The files of `directory` an earlier dump's index says graphopt wrote."""
    if index is None:
        return set()
    if "profiles" in index:
        return {INDEX_FILE}
    entries = [index.get("import", {}), *index.get("passes", [])]
    names = {name for entry in entries for name in entry.get("dumps", [])}
    weights = {WEIGHTS_FILE} if index["dump_format"] in ("onnx", "both") else set()
    return names | {INDEX_FILE} | weights


def _clear(directory: str, index: dict | None) -> None:
    """Remove what an earlier dump left in `directory` (its `index`): left beside the new
    files, they would read as this compile's, and their ONNX files point into a weights.bin
    the new dump rewrites. A profiled compile's folders go too, once empty."""
    if index is None:
        return
    for folder in index.get("profiles", ()):
        path = os.path.join(directory, folder)
        if os.path.isdir(path) and not os.path.islink(path):
            _clear(path, _index(path))
            with contextlib.suppress(OSError):
                os.rmdir(path)  # a file of the user's inside keeps the folder
    for name in _owned(index):
        with contextlib.suppress(OSError):
            os.remove(os.path.join(directory, name))
