"""Pass instruments: cross-cutting work around every pass (timing lives in the manager;
structural verification and IR dumps are here)."""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING

from graphopt.errors import PassError
from graphopt.ir import format_model, verify
from graphopt.ir.verify import VerifyError

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


class DumpIR(Instrument):
    """Writes the printed IR after import and after each pass as numbered files, then
    passes.json with the log."""

    def __init__(self, directory: str):
        self.directory = directory
        self.count = 0

    def _write(self, model, label: str) -> None:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", label)
        path = os.path.join(self.directory, f"{self.count:03d}_{safe}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(format_model(model))
        self.count += 1

    def start(self, model) -> None:
        os.makedirs(self.directory, exist_ok=True)
        self._write(model, "import")

    def after_pass(self, model, record, log) -> None:
        self._write(model, record.name)

    def finish(self, model, log) -> None:
        with open(os.path.join(self.directory, "passes.json"), "w", encoding="utf-8") as f:
            json.dump(log.to_json(), f, indent=1)
