"""What the passes replacing a slow onnxruntime CPU kernel share: they fire only where a CPU
would run the op, and some stay off in a compile that converts precision."""

from __future__ import annotations

from graphopt.passes.base import PassResult
from graphopt.passes.rules import Rule, RulePass, placed_device


class OnTheCpu(Rule):
    """A rule whose rewrite pays off on onnxruntime's CPU provider only: a target whose device
    for the root's op is not a CPU (an NPU with its own kernel) keeps the op."""

    def unsupported(self, root, target=None):
        if target is not None and placed_device(target, root).kind != "cpu":
            device = placed_device(target, root).name
            return f"target {target.shown}: its {device} runs {root.producer.op_type}"
        return super().unsupported(root, target)


class FloatOnlyLowering(RulePass):
    """A lowering pass that stays off in a compile converting precision: a mixed mode keeps
    the op it replaces in float32, which the ops of its lowered form would not all be."""

    def run(self, model, ctx):
        if ctx.options.precision != "keep":
            return PassResult()
        return super().run(model, ctx)
