"""FoldShapes (work in progress)."""

from __future__ import annotations

from graphopt.ir import Model
from graphopt.passes.base import Pass, PassContext, PassResult, register


@register
class FoldShapes(Pass):
    name = "FoldShapes"
    description = "replace Shape and Size of statically shaped values with int64 initializers"

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        return PassResult()
