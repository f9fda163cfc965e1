"""`Model`: the main graph plus everything a ModelProto carries around it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graphopt.ir.graph import Graph


@dataclass
class Model:
    graph: Graph
    ir_version: int = 9
    opset_imports: dict[str, int] = field(default_factory=lambda: {"": 17})
    producer_name: str = ""
    producer_version: str = ""
    domain: str = ""
    model_version: int = 0
    doc_string: str = ""
    metadata_props: dict[str, str] = field(default_factory=dict)
    # Model-local functions and training info are carried through untouched (as protos):
    # passes do not rewrite function bodies.
    functions: list[Any] = field(default_factory=list)
    training_info: list[Any] = field(default_factory=list)
    configuration: list[Any] = field(default_factory=list)
    # The node names and op types --out-nodes removed at import (never written): a note on a
    # name a user gave that matches nothing can then say why.
    cut_names: frozenset[str] = field(default_factory=frozenset)

    def opset(self, domain: str = "") -> int | None:
        if domain in ("", "ai.onnx"):
            return self.opset_imports.get("", self.opset_imports.get("ai.onnx"))
        return self.opset_imports.get(domain)

    def function_keys(self) -> set[tuple[str, str]]:
        return {(f.domain, f.name) for f in self.functions}
