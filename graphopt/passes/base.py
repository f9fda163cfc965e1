"""The pass interface: a named rewrite of a Model that reports what it changed."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from graphopt.ir import Model, Node
    from graphopt.passes.options import Options

# (pass name, rule name, anchor node) -> whether that one rewrite may happen. Subgraph tuning
# turns single fusions off with it; bisection lets only the first rewrites of a pass through.
RewriteGate = Callable[[str, str, "Node"], bool]


@dataclass
class PassResult:
    """`stats` counts rewrites per rule (a pass with one rule uses its own name)."""

    changed: bool = False
    stats: Counter = field(default_factory=Counter)

    def count(self, rule: str, n: int = 1) -> None:
        if n:
            self.stats[rule] += n
            self.changed = True


@dataclass
class PassContext:
    """What a pass may read besides the model: the typed options of this compile."""

    options: "Options"
    notes: list[str] = field(default_factory=list)  # one-line notices shown to the user
    tracer: Any = None  # rules.Tracer when --trace-rule asked for near-miss reports
    target: Any = None  # partition.target.Target when the compile names a target
    gate: RewriteGate | None = None  # None: every rewrite a pass finds happens
    current_pass: str = ""  # set by the pass manager around each pass run
    calibration: Any = None  # quant.calib_data.CalibrationData the compile read and checked
    # Shape profiles: statistics shared with the other profiles (quant.shared_stats.SharedStats),
    # and why this profile's compile could not use the calibration data itself, when it could not.
    shared_stats: Any = None
    calibration_mismatch: Exception | None = None
    # The node names and op types of the model as the pipeline got it, for notes on names a
    # user gave that match nothing after the fusions (set by the pass manager when the
    # compile names nodes: keep_dtype, quant_skip).
    source_names: frozenset[str] = frozenset()
    # The node names and op types --out-nodes removed before the pipeline (Model.cut_names).
    cut_names: frozenset[str] = frozenset()

    def note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)

    def allows(self, rule: str, anchor: "Node") -> bool:
        """Whether the rewrite of `rule` at `anchor` (the node the pass matched) may happen.
        Passes ask once per rewrite they are about to make, before changing anything."""
        return self.gate is None or self.gate(self.current_pass, rule, anchor)


def anchor_key(node: "Node") -> str:
    """A stable name for a rewrite's anchor across compiles of one model: the node's name, or
    its first output's (exporters often leave nodes unnamed; values are always named) after a
    "%". A name that itself starts with "%" or "\\" gets a "\\" in front, so that a node
    named "%y" and an unnamed one making %y keep apart."""
    if node.name:
        return "\\" + node.name if node.name[0] in "%\\" else node.name
    first = next((v for v in node.outputs if v is not None), None)
    return f"%{first.name}" if first is not None else node.op_type


class Pass:
    """Subclasses set `name` and `description` and implement `run`."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    def run(self, model: "Model", ctx: PassContext) -> PassResult:
        raise NotImplementedError


PASSES: dict[str, type[Pass]] = {}


def register(cls: type[Pass]) -> type[Pass]:
    """Class decorator adding a pass to the registry under its `name`."""
    assert cls.name and cls.description, f"{cls.__name__} needs a name and a description"
    assert cls.name not in PASSES, f"pass {cls.name} registered twice"
    PASSES[cls.name] = cls
    return cls
