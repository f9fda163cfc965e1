"""GroupNormalization in the ops its TorchScript export uses, where the device that would run it
has no kernel for it (ExpandForDevice):

    GroupNormalization(x, γ, β, G)  →  Reshape(InstanceNormalization(Reshape(x, [N, G, -1])),
                                               x's shape) · γ + β          (γ, β per channel)

The dynamo exporter writes torch's group_norm as the one op from opset 21 (TorchScript, and
dynamo below 21, write the InstanceNormalization form). onnxruntime 1.32 has no CPU kernel for it
and expands its ONNX function into about 30 ops per norm; the NPU profiles have none either, so
a diffusers VAE decoder exported at opset 21 fell into 23 alternating partitions on ascend310
where its opset-18 export ran on the NPU whole, and on the CPU its .om ran 1.00x the export
where the InstanceNormalization form runs about 0.88x. (GroupNormalization-18, whose scale and
bias are per group, is written as its function body at import: deprecated_ops.py.)
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import DType, Value
from graphopt.ir.pattern import Var
from graphopt.passes.rules import Rule, placed_device

_BODY = ("Reshape", "InstanceNormalization", "Mul", "Add")


class GroupNormAsInstanceNorm(Rule):
    """GroupNormalization → Reshape to [N, G, rest], InstanceNormalization, Reshape back, the
    per-channel scale and bias (opset 21) as Mul and Add."""

    dtypes = (DType.FLOAT,)

    def pattern(self, op, x):
        return op.GroupNormalization(x, Var("scale", const=True), Var("bias", const=True),
                                     _name="norm")

    def unsupported(self, root, target=None):
        return _has_kernel(target, root) or super().unsupported(root, target)

    def check(self, x, scale, bias, norm, **_):
        if x.shape is None or len(x.shape) < 3 \
                or not all(isinstance(d, int) for d in x.shape[1:]):
            return f"%{x.name} has no static channel and spatial dims"
        groups, channels = int(norm.attr("num_groups", 0)), x.shape[1]
        if groups <= 0 or channels % groups:
            return f"{channels} channels do not split into {groups} groups"
        if int(norm.attr("stash_type", 1)) != 1:
            return "it computes in another type than float32 (stash_type)"
        for role, p in (("scale", scale), ("bias", bias)):
            if p.constant().shape != (channels,):
                return f"its {role} is not one value per channel"
        return None

    def rewrite(self, op, x, scale, bias, norm, **_):
        groups, channels = int(norm.attr("num_groups")), x.shape[1]
        grouped = op.Reshape(x, op.const(np.array([0, groups, -1], np.int64)))
        normed = op.InstanceNormalization(grouped, op.const(np.ones(groups, np.float32)),
                                          op.const(np.zeros(groups, np.float32)),
                                          epsilon=float(norm.attr("epsilon", 1e-5)))
        back = op.Reshape(normed, op.const(np.array([0, *x.shape[1:]], np.int64)))
        back.dtype, back.shape = x.dtype, x.shape
        spatial = (1,) * (len(x.shape) - 2)
        scaled = op.Mul(back, op.const(scale.constant().reshape((channels, *spatial))))
        return op.Add(scaled, op.const(bias.constant().reshape((channels, *spatial))))


def _has_kernel(target, root: Value) -> str | None:
    """Why the device that would run the GroupNormalization at `root` keeps it (None: it has
    no kernel for it, and has the ops of the rewrite): onnxruntime's CPU kernel registry for a
    compile without a target."""
    if target is None:
        from graphopt.partition.target import load_target

        target = load_target("cpu")
    device = placed_device(target, root)
    if device.has_kernel("GroupNormalization", "", None):
        return f"target {target.shown}: its {device.name} runs GroupNormalization"
    missing = [op for op in _BODY if not device.has_kernel(op, "", "float32")]
    if missing:
        return f"target {target.shown}: its {device.name} has no kernel for " \
               f"{', '.join(missing)} either"
    return None
