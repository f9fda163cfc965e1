"""Helpers shared by several test modules: op listings and a deliberately wrong pass."""

from __future__ import annotations

from graphopt.ir import Tensor
from graphopt.passes import Pass, PassResult


def ops(model) -> list[str]:
    """The main graph's ops in order (`domain::Op` outside the default domain)."""
    return [n.qualified_op for n in model.graph]


def node(model, op_type: str):
    """The one node of `op_type` in the main graph (fails if there are none or several)."""
    (found,) = [n for n in model.graph if n.op_type == op_type]
    return found


class PerturbWeights(Pass):
    """Test-only miscompile: adds 1 to every float initializer."""

    name = "TestPerturbWeights"
    description = "add 1 to every float initializer (a deliberate miscompile)"

    def run(self, model, ctx) -> PassResult:
        result = PassResult()
        for value in model.graph.initializers.values():
            array = value.constant()
            if array is not None and array.dtype.kind == "f":
                value.const = Tensor(array + 1)
                result.count("perturbed")
        return result
