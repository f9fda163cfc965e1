r"""MergeParallelConvs: branches that convolve one input and are added become one Conv, the
structural re-parameterization RepVGG, MobileOne and FastViT apply by hand before deployment.

    x ─┬─ Conv(Wa, ba) ─┐                x ─ Conv(Wa ⊕ Wb, ba + bb)
       └─ Conv(Wb, bb) ─┴─ Add     →     (the smaller kernel zero-padded into the larger one)
    x ─┬─ Conv(W, b) ───────────┐
       └─ [BatchNormalization] ─┴─ Add  →  x ─ Conv(W ⊕ s·I, b + t)   (an identity kernel)

Both convs take the same input with the same group, strides and dilations, and their taps line
up: a 1×1 without padding sits at the centre of a 3×3 padded by 1, each output reading the
same input positions (or padding zeros) in the merged conv as in its own branch. The merged
kernel must be no larger than the larger branch's, so the merge never adds work (1×3 + 3×1
branches stay apart: one 3×3 costs more than both). An identity branch (x itself, or
x · s + t from an inference BatchNormalization) is a 1×1 conv with one tap per channel, which
needs as many output channels as input channels and stride 1. Training-time branches exported
as they are (timm's repvgg_a0 without `reparameterize()`) keep a 1×1 conv, an Add and a
BatchNorm pass beside each 3×3 conv; merged, each block is the 3×3 conv alone. Runs after
FuseConvBatchNorm, which folds each branch's BatchNorm into its conv first. Each merged weight
is one addition, rounded once: outputs change in the last bits only.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir.pattern import Match, Miss
from graphopt.passes.base import register
from graphopt.passes.fusion.conv_bn import _BatchNormAfter, _f64, _not_constant
from graphopt.passes.rules import HandMatchedRule, RulePass

FLOAT_KINDS = "f"


def _geometry(conv) -> dict | str:
    """A Conv's kernel, pads, strides, dilations and group as plain lists, or why not."""
    w = conv.inputs[1] if len(conv.inputs) > 1 else None
    if w is None or w.shape is None or len(w.shape) < 3 \
            or not all(isinstance(d, int) for d in w.shape):
        return f"the weight shape of Conv '{conv.name}' is unknown"
    if conv.attr("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return f"Conv '{conv.name}' pads by auto_pad"
    spatial = len(w.shape) - 2
    pads = list(conv.attr("pads") or [0] * 2 * spatial)
    return {"kernel": list(w.shape[2:]), "begin": pads[:spatial], "end": pads[spatial:],
            "strides": list(conv.attr("strides") or [1] * spatial),
            "dilations": list(conv.attr("dilations") or [1] * spatial),
            "group": conv.attr("group", 1), "channels": list(w.shape[:2])}


def _identity_geometry(like: dict) -> dict:
    """x itself as a conv beside `like`: one tap, no padding, stride 1."""
    spatial = len(like["kernel"])
    return {"kernel": [1] * spatial, "begin": [0] * spatial, "end": [0] * spatial,
            "strides": [1] * spatial, "dilations": like["dilations"], "group": like["group"],
            "channels": like["channels"]}


def _merged_window(a: dict, b: dict) -> tuple[list[int], list[int], list[int], list, list] | str:
    """(kernel, begin pads, end pads, a's and b's tap offsets) of one conv computing both, or
    why there is none. Along each axis an output reads input position o·stride − pad + j·dil for
    tap j: the merged conv pads by the larger begin pad and shifts each branch's taps by the
    difference, and its end pad keeps every branch's output length."""
    if a["strides"] != b["strides"] or a["dilations"] != b["dilations"] \
            or a["group"] != b["group"] or a["channels"] != b["channels"]:
        return "the branches differ in strides, dilations, group or channels"
    kernel, begin, end, shift_a, shift_b = [], [], [], [], []
    for axis, dil in enumerate(a["dilations"]):
        ka, kb, pa, pb = a["kernel"][axis], b["kernel"][axis], a["begin"][axis], b["begin"][axis]
        pad = max(pa, pb)
        if (pad - pa) % dil or (pad - pb) % dil:
            return f"the taps of the branches do not line up along axis {axis + 2}"
        sa, sb = (pad - pa) // dil, (pad - pb) // dil
        size = max(sa + ka, sb + kb)
        if size != max(ka, kb):
            return f"along axis {axis + 2} one kernel does not fit inside the other"
        ends = {p + q - (k - 1) * dil - pad + (size - 1) * dil
                for p, q, k in ((pa, a["end"][axis], ka), (pb, b["end"][axis], kb))}
        if len(ends) != 1 or min(ends) < 0:
            return f"the branches' outputs differ in length along axis {axis + 2}"
        kernel.append(size), begin.append(pad), end.append(ends.pop())
        shift_a.append(sa), shift_b.append(sb)
    if kernel not in (a["kernel"], b["kernel"]):  # 1×3 and 3×1: each fits along one axis
        return f"the merged {'×'.join(map(str, kernel))} kernel is larger than either branch's"
    return kernel, begin, end, shift_a, shift_b


def _add_placed(out: np.ndarray, weight: np.ndarray, shift: list[int]) -> None:
    """Add `weight` [C_out, C_in/group, k…] into the larger kernel `out`, its taps moved by
    `shift`."""
    out[(slice(None), slice(None)) + tuple(slice(s, s + k) for s, k in
                                           zip(shift, weight.shape[2:]))] += weight


def _branch(value, x, node):
    """What the Add's input `value` is: ("conv", Conv node) on x, ("identity", None) for x
    itself, ("bn", BatchNormalization node) of x, or None."""
    if value is x:
        return "identity", None
    producer = value.producer
    if producer is None or not producer.is_onnx or len(value.uses) != 1 \
            or value.is_graph_output or producer.inputs[0] is not x:
        return None
    if producer.op_type == "Conv":
        return "conv", producer
    if producer.op_type == "BatchNormalization" and len(producer.outputs) == 1:
        return "bn", producer
    return None


class _ParallelBranches(HandMatchedRule):
    """Add of two branches over one input, at least one of them a Conv."""

    base = True
    root_op = "Add"

    def match(self, node):
        if len(node.inputs) != 2 or any(v is None for v in node.inputs):
            return Miss(node, 0, "the Add does not have two inputs")
        for first, second in (node.inputs, node.inputs[::-1]):
            conv = first.producer
            if conv is None or conv.op_type != "Conv" or not conv.is_onnx or not conv.inputs:
                continue
            x = conv.inputs[0]
            a, b = _branch(first, x, node), _branch(second, x, node)
            if a is None or b is None or (b[0] == "conv") != self.both_convs:
                continue
            nodes = [node, conv] + ([b[1]] if b[1] is not None else [])
            return Match(node, {"add": node, "x": x, "conv": conv, "other": b}, nodes)
        return Miss(node, 0, "the Add's inputs are not "
                    + ("two Convs of one input" if self.both_convs
                       else "a Conv and its own input or a BatchNorm of it"))

    def check(self, add, x, conv, other):
        geometry = _geometry(conv)
        if isinstance(geometry, str):
            return geometry
        kind, node = other
        w, b = conv.inputs[1], conv.input(2)
        reason = _not_constant(weight=w, bias=b)
        if reason:
            return f"Conv '{conv.name}': {reason}"
        if w.dtype is None or w.constant().dtype.kind not in FLOAT_KINDS:
            return "the weights are not floating point"
        if kind == "conv":
            second = _geometry(node)
            if isinstance(second, str):
                return second
            reason = _not_constant(weight=node.inputs[1], bias=node.input(2))
            if reason:
                return f"Conv '{node.name}': {reason}"
            if node.inputs[1].dtype != w.dtype:
                return "the two Convs' weights differ in type"
        else:
            if geometry["channels"][0] != geometry["channels"][1] * geometry["group"]:
                return "the Conv changes the channel count, so x cannot be added to it"
            second = _identity_geometry(geometry)
            if geometry["strides"] != second["strides"]:
                return "the Conv has a stride, so its output is not x's size"
            if kind == "bn":
                reason = self._batchnorm_reason(node, geometry["channels"][0])
                if reason:
                    return reason
        window = _merged_window(geometry, second)
        if isinstance(window, str):
            return window
        return self._overflow_reason(conv, other)

    @staticmethod
    def _overflow_reason(conv, other) -> str | None:
        """Why the merged weights or bias might not be finite in the weights' type: a bound
        from the branches' largest magnitudes, without building the merged kernel."""
        kind, node = other
        dtype = conv.inputs[1].constant().dtype
        parts = [conv.inputs[1], conv.input(2)]
        if kind == "conv":
            parts += [node.inputs[1], node.input(2)]
        arrays = [v.constant() for v in parts if v is not None]
        if kind == "bn":
            arrays += list(_BatchNormAfter.affine(*node.inputs[1:5], node.attr("epsilon", 1e-5)))
        with np.errstate(all="ignore"):
            if not all(np.isfinite(a).all() for a in arrays) \
                    or sum(float(np.abs(a).max(initial=0)) for a in arrays) \
                    > np.finfo(dtype).max:
                return "the merged weights or bias may not be finite in the weights' type"
        return None

    @staticmethod
    def _batchnorm_reason(bn, channels: int) -> str | None:
        params = dict(zip(("scale", "shift", "mean", "var"), bn.inputs[1:5]))
        reason = _not_constant(**params)
        if reason:
            return f"BatchNormalization {reason}"
        if bn.attr("training_mode", 0):
            return "BatchNormalization is in training mode (training_mode=1)"
        if any(v.shape != (channels,) for v in params.values()):
            return f"BatchNormalization parameters are not [{channels}] vectors"
        return None

    @staticmethod
    def _merged(conv, other, window) -> tuple[np.ndarray, np.ndarray]:
        """(weight, bias) of the merged Conv in the weights' dtype. Two weights meet in one
        addition, rounded once in their own dtype as in float64 and back; an identity's scale
        and the biases, computed in float64, are rounded once at the end."""
        kernel, _, _, shift_a, shift_b = window
        kind, node = other
        w, b = conv.inputs[1], conv.input(2)
        dtype = w.constant().dtype
        weight = np.zeros(tuple(w.shape[:2]) + tuple(kernel), dtype)
        _add_placed(weight, w.constant(), shift_a)
        bias = _f64(b) if b is not None else np.zeros(weight.shape[0])
        if kind == "conv":
            _add_placed(weight, node.inputs[1].constant(), shift_b)
            if node.input(2) is not None:
                bias = bias + _f64(node.input(2))
        else:
            scale, shift = np.ones(weight.shape[0]), np.zeros(weight.shape[0])
            if kind == "bn":
                scale, shift = _BatchNormAfter.affine(*node.inputs[1:5],
                                                      node.attr("epsilon", 1e-5))
            # One tap a channel: output channel c reads input channel c, at the shifted tap.
            channels = np.arange(weight.shape[0])
            taps = (channels, channels % weight.shape[1]) + tuple(shift_b)
            weight[taps] = (weight[taps].astype(np.float64) + scale).astype(dtype)
            bias = bias + shift
        return weight, bias.astype(dtype)

    def rewrite(self, op, add, x, conv, other):
        geometry = _geometry(conv)
        second = _geometry(other[1]) if other[0] == "conv" else _identity_geometry(geometry)
        window = _merged_window(geometry, second)
        weight, bias = self._merged(conv, other, window)
        kernel, begin, end, _, _ = window
        attrs = dict(conv.attrs, kernel_shape=kernel, pads=begin + end)
        w = conv.inputs[1]
        return op.Conv(x, op.const(weight, f"{w.name}_merged"),
                       op.const(bias, f"{w.name}_merged_b"), **attrs)


class ParallelConvs(_ParallelBranches):
    """Add(Conv(x), Conv(x)) → one Conv, the smaller kernel zero-padded into the larger:
    RepVGG's 3×3 and 1×1 branches, MobileOne's k×k branches."""

    both_convs = True


class ConvPlusIdentity(_ParallelBranches):
    """Add(Conv(x), x) and Add(Conv(x), BatchNormalization(x)) → one Conv with a one-tap
    identity kernel added: RepVGG's identity branch."""

    both_convs = False


@register
class MergeParallelConvs(RulePass):
    name = "MergeParallelConvs"
    description = "merge added Conv branches over one input (and an identity of it) into one Conv"
    rules = (ParallelConvs, ConvPlusIdentity)


__all__ = ["MergeParallelConvs"]
