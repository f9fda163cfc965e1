r"""FuseActivation: Conv, Gemm and matrix MatMul followed by an activation, into onnxruntime's
FusedConv and FusedGemm, which apply the activation to each output tile while it is in cache.

    Conv(x, w, b) → act   ⇒  FusedConv(x, w, b, activation=act, activation_params=[p…])
    Gemm(a, b, c) → act   ⇒  FusedGemm(a, b, c, activation=act, activation_alpha=α, …)
                             (Gemm's alpha, beta, transA, transB kept)
    MatMul(a, b)  → act   ⇒  FusedGemm(a, b, activation=act), a and b of rank 2 only

        x   w  b                      x   w  b
         \  |  /                       \  |  /
          Conv          ⇒          FusedConv(activation="Clip", activation_params=[0, 6])
           │
         Clip(0, 6)

    act                       FusedConv             FusedGemm
    Relu, Sigmoid, Tanh       —                     —
    LeakyRelu(α=0.01)         [α]                   activation_alpha=α
    HardSigmoid(α=0.2, β=0.5) [α, β]                activation_alpha=α, activation_beta=β
    HardSwish                 —                     (not taken)
    Clip(min, max)            [min, max]            (not taken)
    Clip's bounds are constant inputs (opset ≥ 11; Relu6 is Clip(0, 6)) or, before, attributes.

The activation strings are the ONNX op names. Which ones a kernel takes depends on the
onnxruntime build (this one's FusedConv takes HardSwish, which older MLAS activation lists lack;
FusedGemm's element-wise functors have no Clip or HardSwish), so each (kernel, activation) pair
is tried once on a one-node model and a rule refuses what onnxruntime refuses. SiLU,
x · sigmoid(x), has no fused form in either kernel and stays as it is. The kernels are fp32 on
CPU here; other types keep the unfused ops.
"""

from __future__ import annotations

import functools

import numpy as np

from graphopt.ir import DType
from graphopt.ir.pattern import Attr, Const, Optional
from graphopt.passes.base import register
from graphopt.passes.rules import Rule, RulePass, target_attributes_refuse

MS = "com.microsoft"
# The activation parameters, in the order FusedConv's activation_params lists them.
PARAMS = {"LeakyRelu": ("alpha",), "HardSigmoid": ("alpha", "beta"), "Clip": ("min", "max")}
# ONNX's defaults of those that are attributes.
DEFAULTS = {"LeakyRelu": {"alpha": 0.01}, "HardSigmoid": {"alpha": 0.2, "beta": 0.5}}
FLOAT_MAX = float(np.finfo(np.float32).max)


@functools.cache
def runtime_refuses(fused: str, activation: str) -> str | None:
    """Why the installed onnxruntime's `fused` kernel cannot apply `activation` (None if it can):
    the kernels validate the activation when a session creates them."""
    import onnx.parser
    import onnxruntime as ort

    names = PARAMS.get(activation, ())
    attrs = [f'activation="{activation}"']
    if fused == "FusedConv":
        dims = "1,1,1,1"
        attrs += [f"activation_params=[{', '.join(['0.5'] * len(names))}]"] if names else []
    else:
        dims = "1,1"
        attrs += [f"activation_{name}=0.5" for name in names]
    model = onnx.parser.parse_model(
        f'<ir_version: 8, opset_import: ["": 17, "{MS}": 1]>\n'
        f"probe (float[{dims}] x, float[{dims}] w) => (float y) "
        f"{{ y = {MS}.{fused}<{', '.join(attrs)}>(x, w) }}")
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the refusal is expected; keep it off stderr
    try:
        ort.InferenceSession(model.SerializeToString(), options,
                             providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - onnxruntime raises a different class per refusal
        return f"onnxruntime's {fused} does not take activation '{activation}'"
    return None


def activation_params(activation: str, alpha=None, beta=None, min=None, max=None,
                      min_attr=None, max_attr=None, **_) -> list[float]:
    """The activation's parameters in PARAMS order, its ONNX defaults filled in."""
    values = {"alpha": alpha, "beta": beta}
    if activation == "Clip":
        low = min if min is not None else min_attr
        high = max if max is not None else max_attr
        values = {"min": -FLOAT_MAX if low is None else low,
                  "max": FLOAT_MAX if high is None else high}
    return [float(np.asarray(values[name]).reshape(-1)[0]) for name in PARAMS.get(activation, ())]


class _Fuse(Rule):
    """The match's root is the activation; its op type is the kernel's activation string."""

    fused: str
    dtypes = (DType.FLOAT,)
    device_dtypes = (DType.FLOAT16,)

    def unsupported(self, root, target=None):
        act = root.producer
        refusal = super().unsupported(root, target) or runtime_refuses(self.fused, act.op_type)
        if refusal:
            return refusal
        # A profile may take the fused op with some attribute values only (a FusedConv whose
        # activation_params are [0.1]): ask about every one the fused node would carry.
        layer = act.inputs[0].producer if act.inputs and act.inputs[0] is not None else None
        layer_attrs = {name: a.value for name, a in layer.attrs.items()} \
            if layer is not None and layer.op_type in ("Conv", "Gemm") else {}
        attrs = self.attributes(layer_attrs, act.op_type, **_matched_params(act))
        return target_attributes_refuse(target, root, (MS, self.fused), attrs)

    def attributes(self, layer_attrs: dict, activation: str, **params) -> dict:
        """The fused node's attributes: the layer's, and the activation with its parameters."""
        raise NotImplementedError


def _matched_params(act) -> dict:
    """The activation node's parameters, by the names the patterns bind them to."""
    params = {name: act.attr(name, default)
              for name, default in DEFAULTS.get(act.op_type, {}).items()}
    if act.op_type == "Clip":
        bounds = [act.input(i).constant() if act.input(i) is not None else None for i in (1, 2)]
        params.update(min=bounds[0], max=bounds[1], min_attr=act.attr("min"),
                      max_attr=act.attr("max"))
    return params


class _IntoFusedConv(_Fuse):
    fused = "FusedConv"
    emits = ((MS, "FusedConv"),)

    def attributes(self, layer_attrs, activation, **params):
        attrs = dict(layer_attrs, activation=activation)
        if activation in PARAMS:
            attrs["activation_params"] = activation_params(activation, **params)
        return attrs

    def rewrite(self, op, x, w, conv, b=None, **params):
        attrs = self.attributes(conv.attrs, op.root.op_type, **params)
        return op.FusedConv(*((x, w) if b is None else (x, w, b)), _domain=MS, **attrs)


class _IntoFusedGemm(_Fuse):
    fused = "FusedGemm"
    emits = ((MS, "FusedGemm"),)

    def check(self, a, b, gemm=None):
        if gemm is None and (len(a.shape or ()) != 2 or len(b.shape or ()) != 2):
            return "MatMul operands are not both known to be matrices (Gemm takes rank 2 only)"
        return None

    def attributes(self, layer_attrs, activation, **params):
        attrs = dict(layer_attrs, activation=activation)
        values = activation_params(activation, **params)
        attrs.update({f"activation_{n}": v for n, v in zip(PARAMS.get(activation, ()), values)})
        return attrs

    def rewrite(self, op, a, b, gemm=None, c=None, **params):
        attrs = self.attributes(gemm.attrs if gemm is not None else {}, op.root.op_type,
                                **params)
        return op.FusedGemm(*((a, b) if c is None else (a, b, c)), _domain=MS, **attrs)


def _conv(op, x, w, b):
    return op.Conv(x, w, Optional(b), _name="conv")


def _gemm(op, a, b, c):
    return op.Gemm(a, b, Optional(c), _name="gemm")


def _leaky_relu(op, y):
    return op.LeakyRelu(y, alpha=Attr("alpha", DEFAULTS["LeakyRelu"]["alpha"]))


def _hard_sigmoid(op, y):
    defaults = DEFAULTS["HardSigmoid"]
    return op.HardSigmoid(y, alpha=Attr("alpha", defaults["alpha"]),
                          beta=Attr("beta", defaults["beta"]))


def _clip(op, y):
    """Clip with constant bounds: inputs from opset 11 (Relu6 is Clip(0, 6)), attributes before."""
    return op.Clip(y, _bound("min"), _bound("max"), min=Attr("min_attr"), max=Attr("max_attr"))


def _bound(name):
    return Optional(Const(pred=lambda data: data.size == 1, name=name))


class ConvRelu(_IntoFusedConv):
    """Conv + Relu → FusedConv with activation Relu."""

    def pattern(self, op, x, w, b):
        return op.Relu(_conv(op, x, w, b))


class ConvLeakyRelu(_IntoFusedConv):
    """Conv + LeakyRelu → FusedConv with activation LeakyRelu."""

    def pattern(self, op, x, w, b):
        return _leaky_relu(op, _conv(op, x, w, b))


class ConvSigmoid(_IntoFusedConv):
    """Conv + Sigmoid → FusedConv with activation Sigmoid."""

    def pattern(self, op, x, w, b):
        return op.Sigmoid(_conv(op, x, w, b))


class ConvTanh(_IntoFusedConv):
    """Conv + Tanh → FusedConv with activation Tanh."""

    def pattern(self, op, x, w, b):
        return op.Tanh(_conv(op, x, w, b))


class ConvClip(_IntoFusedConv):
    """Conv + Clip → FusedConv with activation Clip."""

    def pattern(self, op, x, w, b):
        return _clip(op, _conv(op, x, w, b))


class ConvHardSigmoid(_IntoFusedConv):
    """Conv + HardSigmoid → FusedConv with activation HardSigmoid."""

    def pattern(self, op, x, w, b):
        return _hard_sigmoid(op, _conv(op, x, w, b))


class ConvHardSwish(_IntoFusedConv):
    """Conv + HardSwish → FusedConv with activation HardSwish."""

    def pattern(self, op, x, w, b):
        return op.HardSwish(_conv(op, x, w, b))


class GemmRelu(_IntoFusedGemm):
    """Gemm + Relu → FusedGemm with activation Relu."""

    def pattern(self, op, a, b, c):
        return op.Relu(_gemm(op, a, b, c))


class GemmLeakyRelu(_IntoFusedGemm):
    """Gemm + LeakyRelu → FusedGemm with activation LeakyRelu."""

    def pattern(self, op, a, b, c):
        return _leaky_relu(op, _gemm(op, a, b, c))


class GemmSigmoid(_IntoFusedGemm):
    """Gemm + Sigmoid → FusedGemm with activation Sigmoid."""

    def pattern(self, op, a, b, c):
        return op.Sigmoid(_gemm(op, a, b, c))


class GemmTanh(_IntoFusedGemm):
    """Gemm + Tanh → FusedGemm with activation Tanh."""

    def pattern(self, op, a, b, c):
        return op.Tanh(_gemm(op, a, b, c))


class GemmHardSigmoid(_IntoFusedGemm):
    """Gemm + HardSigmoid → FusedGemm with activation HardSigmoid."""

    def pattern(self, op, a, b, c):
        return _hard_sigmoid(op, _gemm(op, a, b, c))


class MatMulRelu(_IntoFusedGemm):
    """MatMul of two matrices + Relu → FusedGemm with activation Relu."""

    def pattern(self, op, a, b):
        return op.Relu(op.MatMul(a, b))


class MatMulLeakyRelu(_IntoFusedGemm):
    """MatMul of two matrices + LeakyRelu → FusedGemm with activation LeakyRelu."""

    def pattern(self, op, a, b):
        return _leaky_relu(op, op.MatMul(a, b))


class MatMulSigmoid(_IntoFusedGemm):
    """MatMul of two matrices + Sigmoid → FusedGemm with activation Sigmoid."""

    def pattern(self, op, a, b):
        return op.Sigmoid(op.MatMul(a, b))


class MatMulTanh(_IntoFusedGemm):
    """MatMul of two matrices + Tanh → FusedGemm with activation Tanh."""

    def pattern(self, op, a, b):
        return op.Tanh(op.MatMul(a, b))


class MatMulHardSigmoid(_IntoFusedGemm):
    """MatMul of two matrices + HardSigmoid → FusedGemm with activation HardSigmoid."""

    def pattern(self, op, a, b):
        return _hard_sigmoid(op, op.MatMul(a, b))


@register
class FuseActivation(RulePass):
    name = "FuseActivation"
    description = "Conv/Gemm/matrix MatMul + activation into onnxruntime's FusedConv/FusedGemm"
    rules = (ConvRelu, ConvLeakyRelu, ConvSigmoid, ConvTanh, ConvClip, ConvHardSigmoid,
             ConvHardSwish, GemmRelu, GemmLeakyRelu, GemmSigmoid, GemmTanh, GemmHardSigmoid,
             MatMulRelu, MatMulLeakyRelu, MatMulSigmoid, MatMulTanh, MatMulHardSigmoid)


__all__ = ["FuseActivation"]
