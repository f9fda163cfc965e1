"""FuseLayerNorm: LayerNorm and RMSNorm as exporters decompose them, into one normalization op.

    LayerNorm  y = (x - μ) / √(σ² + ε) · γ + β,  μ = mean(x), σ² = mean((x - μ)²) over the last
               axis → LayerNormalization(x, γ, β, axis=-1, epsilon=ε)   (ai.onnx opset 17: a
               model at 13–16 is raised to 17 when its nodes mean the same there, opset_raise)
    Add + LN   LN(a + b), a and b of one shape [B,S,C] → com.microsoft::SkipLayerNormalization,
               only for a device other than onnxruntime's CPU provider (an NPU's AddLayerNorm):
               its CPU kernel is a scalar loop, 6× slower than Add + LayerNormalization
    RMSNorm    y = x / √(mean(x²) + ε) · γ → RMSNormalization(x, γ) at opset ≥ 23, else the
               SimplifiedLayerNormalization(x, γ) that onnxruntime registers in ai.onnx; with
               no γ (a unit weight removed), γ = 1

  x -+--------------> Sub -> d -+-> Pow(d, 2) -> ReduceMean -> Add ε -> Sqrt -+
     |                 ^        |   (or Mul(d, d))                            |
     +-> ReduceMean -> μ        +-------------------------------------------> Div -> Mul γ -> Add β

ReduceMean's axes (an attribute before opset 18, an input from 18) must be the last axis only;
fp16 exports compute between Cast(x → f32) and a Cast back; γ, β are constants broadcasting to [C].
TensorFlow's batchnorm form (tf2onnx's Keras LayerNormalization) folds γ into the scale first:
g = γ · rsqrt(σ² + ε), y = x·g + (β - μ·g), its means GlobalAveragePool at rank 3
(LayerNormBatchnorm).
"""

from __future__ import annotations


import numpy as np

from graphopt.ir import DType, Value
from graphopt.ir.pattern import Attr, Const, OneOf, Optional
from graphopt.opcheck import runtime_schemas
from graphopt.passes.base import register
from graphopt.passes.opset_raise import raise_blocker, raise_opset
from graphopt.passes.rules import Rule, RulePass, placed_device, target_refuses

MS = "com.microsoft"
FLOATS = (DType.FLOAT, DType.FLOAT16, DType.DOUBLE)  # what onnxruntime's CPU kernels take
EPS = Const(pred=lambda a: a.dtype.kind == "f", name="eps")  # _problem checks it is a scalar
EXACT_2 = Const(2.0, rtol=0.0)  # d²: any other exponent is NaN for a negative d


def _mean(op, v, key: str):
    """ReduceMean(v) binding `<key>_axes` (attribute), `<key>_axes_in` (input), `<key>_keep`."""
    axes_input = Optional(Const(pred=lambda a: a.dtype.kind == "i", name=f"{key}_axes_in"))
    return op.ReduceMean(v, axes_input, axes=Attr(f"{key}_axes"), keepdims=Attr(f"{key}_keep", 1))


def _norm(op, x, centre: bool = True, square: str = "pow", inverse: str = "div", cast=False,
          moments: bool = False):
    """d / √(mean(d²) + ε), d = x - mean(x) (LayerNorm) or x (RMSNorm); square: Pow, Mul or
    either ("any"); the division: Div by √· or ·^½, ·Reciprocal(√·), ·(1 / √·), ·Pow(·, -½),
    or any of the three products ("rsqrt"); `cast`: on Cast(x → f32), cast back; `moments`:
    the variance as mean(x²) − mean(x)², clamped at 0 or not (Flax's `use_fast_variance`)."""
    xf = op.Cast(x, to=Attr("cast_in")) if cast else x
    mean = _mean(op, xf, "mean")
    d = op.Sub(xf, mean) if centre else xf
    if moments:
        second = _mean(op, OneOf(op.Mul(xf, xf), op.Pow(xf, EXACT_2)), "var")
        variance = op.Sub(second, OneOf(op.Mul(mean, mean), op.Pow(mean, EXACT_2)))
        ms = op.Add(OneOf(op.Max(variance, Const(0.0, rtol=0.0)), variance), EPS)
    else:
        squared = {"pow": lambda: op.Pow(d, EXACT_2), "mul": lambda: op.Mul(d, d),
                   "any": lambda: OneOf(op.Pow(d, EXACT_2), op.Mul(d, d))}[square]()
        ms = op.Add(_mean(op, squared, "var"), EPS)
    y = {"div": lambda: op.Div(d, OneOf(op.Sqrt(ms), op.Pow(ms, 0.5))),
         "reciprocal": lambda: op.Mul(d, op.Reciprocal(op.Sqrt(ms))),
         "one_over": lambda: op.Mul(d, op.Div(1.0, op.Sqrt(ms))),
         "pow": lambda: op.Mul(d, op.Pow(ms, -0.5)),
         "rsqrt": lambda: op.Mul(d, OneOf(op.Reciprocal(op.Sqrt(ms)), op.Div(1.0, op.Sqrt(ms)),
                                          op.Pow(ms, -0.5)))}[inverse]()
    return op.Cast(y, to=Attr("cast_out")) if cast else y


def _problem(x: Value, b: dict) -> str | None:
    """Why the normalization matched on `x` is not one op over x's last axis (None: it is)."""
    if x.dtype is None or not x.shape or not isinstance(x.shape[-1], int):
        return f"the type or last dim of %{x.name} is unknown (run InferShapes)"
    if x.shape[-1] == 0:  # onnxruntime's kernel refuses to normalize nothing at load
        return f"the last dim of %{x.name} is 0"
    rank, c = len(x.shape), x.shape[-1]
    for key in [k for k in ("mean", "var") if f"{k}_keep" in b]:
        axes = b.get(f"{key}_axes_in", b.get(f"{key}_axes"))
        axes = None if axes is None else [int(a) for a in np.ravel(axes)]
        if b[f"{key}_keep"] != 1 or axes not in ([-1], [rank - 1]):
            return f"a ReduceMean reduces over axes {axes or 'all'} with keepdims=" \
                   f"{b[f'{key}_keep']}, not over the last axis only with keepdims=1"
    if b["eps"].size != 1 or b["eps"].ndim > rank:  # a [1,1,1,1] ε would add an axis
        return f"epsilon has shape {list(b['eps'].shape)}, not a scalar"
    if not float(b["eps"].ravel()[0]) > 0:  # NaN too
        return f"epsilon {float(b['eps'].ravel()[0])} is not positive, which onnxruntime's " \
               "(Skip)LayerNormalization kernels refuse"
    if "cast_in" in b and (b["cast_in"] != DType.FLOAT or b["cast_out"] != x.dtype):
        return "the Casts do not go from x's type to f32 and back"
    for role, p in [(r, b[r]) for r in ("gamma", "beta") if b.get(r) is not None]:
        shape, tails = tuple(p.shape or ()), ((), (1,), (c,))
        if not p.is_constant:
            return f"{role} %{p.name} is not a constant"
        if len(shape) > rank or any(d != 1 for d in shape[:-1]) or shape[-1:] not in tails:
            return f"{role} %{p.name} of shape {list(shape)} does not broadcast to exactly [{c}]"
    return None


def _scale_bias(op, x: Value, gamma: Value | None, beta: Value | None) -> list[Value]:
    """[γ, β] as [C] tensors (reshaped constants if need be); γ = 1 when absent, β left out."""
    c, out = x.shape[-1], []
    for p, fill in ((gamma, 1.0), (beta, None)):
        if p is not None and tuple(p.shape) == (c,):
            out.append(p)
        elif p is not None or fill is not None:
            data = np.full(c, fill, x.dtype.numpy) if p is None else p.constant().reshape(-1)
            out.append(op.const(np.ascontiguousarray(np.broadcast_to(data, (c,)))))
    return out


def _slow_on_cpu(root: Value, target) -> str | None:
    """Why SkipLayerNormalization is not worth emitting for `root`: when onnxruntime's CPU
    provider would run it (no target, or a target that places it on its CPU). That kernel adds,
    normalizes and scales in plain scalar loops with a division per element; at [1,128,768] it
    takes 0.58 ms where Add + LayerNormalization (MLAS) take 0.09 ms (1 thread, onnxruntime
    1.32); nine of them are 4% of a 4-layer BERT-base forward."""
    if target is not None and placed_device(target, root).kind != "cpu":
        return None
    return "onnxruntime's CPU SkipLayerNormalization kernel runs 6× slower than Add + " \
           "LayerNormalization"


def _same_shape(x: Value, skip: Value) -> str | None:
    if x.shape is None or len(x.shape) != 3 or None in x.shape or x.shape != skip.shape:
        return f"the Add's inputs %{x.name} {x.shape} and %{skip.name} {skip.shape} are not " \
               "of one known shape [B,S,C]"
    return None


def opset_17_blocker(model) -> str | None:
    """Why a rewrite cannot emit ai.onnx LayerNormalization in `model` (None: it can, raising
    the model to opset 17 where need be)."""
    blocker = raise_blocker(model, 17)
    if blocker:
        return f"ai.onnx LayerNormalization needs opset 17, the model imports " \
               f"{model.opset('') or 1}: {blocker}"
    return None


class _LayerNorm(Rule):
    emits = (("", "LayerNormalization"),)
    dtypes = FLOATS

    def check(self, x, model, **b):
        return opset_17_blocker(model) or _problem(x, b)

    def rewrite(self, op, x, eps, gamma=None, beta=None, **_):
        raise_opset(op.model, 17)  # checked: every node means the same at 17
        return op.LayerNormalization(x, *_scale_bias(op, x, gamma, beta), axis=-1,
                                     epsilon=float(eps.ravel()[0]))


class LayerNormDecomposed(_LayerNorm):
    """Pow(x - μ, 2), γ and β: torch.onnx's nn.LayerNorm below opset 17."""
    def pattern(self, op, x, gamma, beta):
        return op.Add(op.Mul(_norm(op, x), gamma), beta)


class LayerNormMulSquare(_LayerNorm):
    """(x - μ)·(x - μ) for the square, γ and β."""
    def pattern(self, op, x, gamma, beta):
        return op.Add(op.Mul(_norm(op, x, square="mul"), gamma), beta)


class LayerNormCast(_LayerNorm):
    """Computed in f32 between Casts (fp16 exports), γ and β applied in x's type."""
    def pattern(self, op, x, gamma, beta):
        return op.Add(op.Mul(_norm(op, x, cast=True), gamma), beta)


class LayerNormRsqrt(_LayerNorm):
    """(x - μ) · rsqrt(σ² + ε) · γ + β, hand-written: rsqrt as Reciprocal(√·) (torch.rsqrt
    through the dynamo exporter), 1 / √· (through TorchScript) or ·^-½, the square Pow or Mul."""
    def pattern(self, op, x, gamma, beta):
        return op.Add(op.Mul(_norm(op, x, square="any", inverse="rsqrt"), gamma), beta)


class LayerNormMoments(_LayerNorm):
    """(x - μ) / √(max(mean(x²) − μ², 0) + ε) · γ + β: Flax's nn.LayerNorm (its default
    `use_fast_variance`) through jax2onnx, and GroupNorm's form; the division also as rsqrt.
    onnxruntime's kernel takes the variance from the same two moments."""
    def pattern(self, op, x, gamma, beta):
        return op.Add(op.Mul(OneOf(_norm(op, x, moments=True),
                                   _norm(op, x, inverse="rsqrt", moments=True)), gamma), beta)


class LayerNormMomentsNoAffine(_LayerNorm):
    """LayerNormMoments with neither γ nor β (use_scale=False, use_bias=False)."""
    def pattern(self, op, x):
        return _norm(op, x, moments=True)


class LayerNormThenBias(Rule):
    """LayerNormalization over the last axis, then + β (a constant over that axis) → the same
    LayerNormalization with β as its bias (added to any bias it had): where a freshly built
    model's γ of ones went with its Mul (EliminateNoOps), the norm had fused without its
    affine part and kept the bias Add beside it (Flax's LayerNorm through jax2onnx)."""

    emits = (("", "LayerNormalization"),)
    dtypes = FLOATS

    def pattern(self, op, x, scale, bias, beta):
        return op.Add(op.LayerNormalization(x, scale, Optional(bias), axis=Attr("axis", -1),
                                            epsilon=Attr("eps", 1e-5),
                                            stash_type=Attr("stash", 1)), beta)

    def check(self, x, scale, beta, axis=-1, bias=None):
        if x.shape is None or not x.shape or not isinstance(x.shape[-1], int) \
                or axis not in (-1, len(x.shape) - 1):
            return f"the norm is not over the known last axis of %{x.name}"
        c, shape = x.shape[-1], tuple(beta.shape or ())
        if not beta.is_constant or any(d != 1 for d in shape[:-1]) \
                or shape[-1:] not in ((), (1,), (c,)) or len(shape) > len(x.shape):
            return f"%{beta.name} is not a constant that broadcasts to exactly [{c}]"
        if bias is not None and not bias.is_constant:
            return f"the norm's bias %{bias.name} is not a constant"
        return None

    def rewrite(self, op, x, scale, beta, eps=1e-5, stash=1, bias=None, **_):
        c = x.shape[-1]
        total = np.broadcast_to(beta.constant().reshape(-1), (c,)).astype(x.dtype.numpy)
        if bias is not None:
            total = total + bias.constant().reshape(-1)
        return op.LayerNormalization(x, scale, op.const(np.ascontiguousarray(total)), axis=-1,
                                     epsilon=eps, stash_type=stash)


class LayerNormNoAffine(_LayerNorm):
    """Neither γ nor β (elementwise_affine=False): γ = 1, no bias; the square Pow or Mul."""
    def pattern(self, op, x):
        return _norm(op, x, square="any")


class LayerNormNoAffineRsqrt(_LayerNorm):
    """(x - μ) · rsqrt(σ² + ε) with neither γ nor β, rsqrt and the square as LayerNormRsqrt's."""
    def pattern(self, op, x):
        return _norm(op, x, square="any", inverse="rsqrt")


def _channel_problem(x: Value, b: dict) -> str | None:
    """Why the normalization matched on `x` is not one LayerNorm over its channel axis 1 (None:
    it is): ReduceMeans over axis 1 with keepdims, γ and β of shape [C, 1, …] or absent."""
    if x.dtype is None or x.shape is None or len(x.shape) < 3 \
            or not isinstance(x.shape[1], int):
        return f"%{x.name} is not of a known rank ≥ 3 with a static channel dim"
    if x.shape[1] == 0:
        return f"the channel dim of %{x.name} is 0"
    rank, c = len(x.shape), x.shape[1]
    for key in ("mean", "var"):
        axes = b.get(f"{key}_axes_in", b.get(f"{key}_axes"))
        axes = None if axes is None else [int(a) for a in np.ravel(axes)]
        if b[f"{key}_keep"] != 1 or axes not in ([1], [1 - rank]):
            return f"a ReduceMean reduces over axes {axes or 'all'}, not over the channels only"
    if b["eps"].size != 1 or b["eps"].ndim > rank or not float(b["eps"].ravel()[0]) > 0:
        return "epsilon is not one positive number"
    for role in ("gamma", "beta"):
        p = b.get(role)
        if p is None:
            continue
        shape = tuple(p.shape or ())
        if len(shape) > rank:  # it would broadcast the output to a higher rank
            return f"{role} %{p.name} has a higher rank than %{x.name}"
        while shape and shape[0] == 1 and len(shape) > rank - 1:
            shape = shape[1:]
        if not p.is_constant or shape != (c,) + (1,) * (rank - 2):
            return f"{role} %{p.name} of shape {list(p.shape or ())} is not a constant " \
                   f"[{c}, 1, …] over the channels"
    return None


class _ChannelLayerNorm(_LayerNorm):
    """LayerNorm over the channels of NCHW, as ConvNeXt's and SAM's LayerNorm2d write it
    (`x.mean(1, keepdim=True)` …, `weight[:, None, None] * x + bias[:, None, None]`):
    LayerNormalization over the last axis between Transposes to channels-last and back.
    onnxruntime's kernel normalizes each pixel's channels in one pass where the decomposed
    form makes six passes over the tensor: at [1, 96, 56, 56] the three ops ran 0.63× the
    nine (1 thread, onnxruntime 1.32)."""

    def check(self, x, model, **b):
        return opset_17_blocker(model) or _channel_problem(x, b)

    def rewrite(self, op, x, eps, gamma=None, beta=None, **_):
        raise_opset(op.model, 17)  # checked: every node means the same at 17
        rank, c = len(x.shape), x.shape[1]
        last = op.Transpose(x, perm=[0, *range(2, rank), 1])
        last.dtype, last.shape = x.dtype, (x.shape[0], *x.shape[2:], c)
        affine = [op.const(np.ascontiguousarray(p.constant().reshape(c)))
                  for p in (gamma, beta) if p is not None]
        if gamma is None:
            affine.insert(0, op.const(np.ones(c, x.dtype.numpy)))
        normed = op.LayerNormalization(last, *affine, axis=-1, epsilon=float(eps.ravel()[0]))
        normed.dtype, normed.shape = last.dtype, last.shape
        return op.Transpose(normed, perm=[0, rank - 1, *range(1, rank - 1)])


class ChannelLayerNorm(_ChannelLayerNorm):
    """Over axis 1: (x - μ) / √(σ² + ε) · γ + β, the square Pow or Mul."""
    def pattern(self, op, x, gamma, beta):
        return op.Add(op.Mul(_norm(op, x, square="any"), gamma), beta)


class ChannelLayerNormRsqrt(_ChannelLayerNorm):
    """Over axis 1, rsqrt written out as Reciprocal(√·), 1 / √· or ·^-½."""
    def pattern(self, op, x, gamma, beta):
        return op.Add(op.Mul(_norm(op, x, square="any", inverse="rsqrt"), gamma), beta)


def _mean_or_pool(op, v, key: str):
    """The last-axis mean as ReduceMean or as GlobalAveragePool (binding `<key>_pool`), which
    tf2onnx writes for a keepdims mean over every axis from 2 on: the last axis at rank 3."""
    return OneOf(op.GlobalAveragePool(v, _name=f"{key}_pool"), _mean(op, v, key))


class LayerNormBatchnorm(_LayerNorm):
    """TensorFlow's batchnorm form, as tf2onnx exports Keras's LayerNormalization:
    g = γ · rsqrt(mean((x - μ)²) + ε), y = x·g + (β - μ·g) (Keras 3: x·g + ((-μ)·g + β)); the
    means GlobalAveragePool (rank 3) or ReduceMean, rsqrt as Reciprocal(√·), 1 / √· or ·^-½,
    the square Mul(d, d) or Pow(d, 2).
    LayerNormalization computes (x - μ)·g + β, without the batchnorm form's cancellation of
    x·g against μ·g for a large mean: it is closer to the exact result, not further."""

    def pattern(self, op, x, gamma, beta):
        mean = _mean_or_pool(op, x, "mean")
        d = op.Sub(x, mean)
        ve = op.Add(_mean_or_pool(op, OneOf(op.Mul(d, d), op.Pow(d, EXACT_2)), "var"), EPS)
        std = op.Sqrt(ve)
        g = op.Mul(OneOf(op.Reciprocal(std), op.Div(1.0, std), op.Pow(ve, -0.5)), gamma)
        # Keras 3's shift is (-μ)·g + β, which tf2onnx writes as Neg, Mul, Add.
        return op.Add(op.Mul(x, g), OneOf(op.Sub(beta, op.Mul(mean, g)),
                                          op.Add(op.Mul(op.Neg(mean), g), beta)))

    def check(self, x, model, eps, **b):
        pooled = [k for k in ("mean", "var") if b.get(f"{k}_pool") is not None]
        if pooled and (x.shape is None or len(x.shape) != 3):
            rank = "unknown rank" if x.shape is None else f"rank {len(x.shape)}"
            return f"GlobalAveragePool averages %{x.name} of {rank} over every axis from 2 on, " \
                   "the last axis only at rank 3"
        if eps.size == 1 and not float(eps.ravel()[0]) > 0:
            return f"epsilon {float(eps.ravel()[0])} is not positive"
        return super().check(x, model, eps=eps, **b)


class _Skip(Rule):
    emits = ((MS, "SkipLayerNormalization"),)
    # Not float16, though the NPU profiles run it so: onnxruntime's CPU kernel, the stand-in
    # wherever the CANN provider is missing, computes it in float16, and a 6-layer float16
    # BERT's .om ended 3× farther from the float32 result than the unfused ops, whose
    # LayerNormalization sums in float32.
    dtypes = (DType.FLOAT,)
    # A pre-LN block's residual sum also feeds the next block's residual Add: the fused op's
    # fourth output (input_skip_bias_sum) carries it there.
    exposes = ("residual",)

    def unsupported(self, root: Value, target=None) -> str | None:
        return super().unsupported(root, target) or _slow_on_cpu(root, target)


class _SkipDecomposed(_Skip):
    def check(self, x, skip, residual, **b):
        return _same_shape(x, skip) or _problem(residual.output, b)

    def rewrite(self, op, x, skip, eps, exposed, gamma=None, beta=None, **_):
        return _skip_layernorm(op, x, skip, _scale_bias(op, x, gamma, beta),
                               float(eps.ravel()[0]), exposed)


def _skip_layernorm(op, x, skip, scale_bias, epsilon, exposed):
    """SkipLayerNormalization(x, skip, γ[, β]), its residual sum as a fourth output (mean and
    inverse deviation left out) when something outside the match reads it."""
    if not exposed:
        return op.SkipLayerNormalization(x, skip, *scale_bias, _domain=MS, epsilon=epsilon), {}
    y, _, _, residual = op.SkipLayerNormalization(x, skip, *scale_bias, _domain=MS,
                                                  _outputs=4, _omit=(1, 2), epsilon=epsilon)
    return y, {"residual": residual}


class SkipLayerNormDecomposed(_SkipDecomposed):
    """Decomposed LayerNorm (Pow form, γ, β) of a residual sum x + skip, at any opset."""
    def pattern(self, op, x, skip, gamma, beta):
        return op.Add(op.Mul(_norm(op, op.Add(x, skip, _name="residual")), gamma), beta)


class SkipLayerNormNoAffine(_SkipDecomposed):
    """The same without γ and β (left out by a cleanup when they were 1 and 0)."""
    def pattern(self, op, x, skip):
        return _norm(op, op.Add(x, skip, _name="residual"))


class SkipLayerNorm(_Skip):
    """LayerNormalization(x + skip) over the last axis, γ (and β) of shape [C]."""

    def pattern(self, op, x, skip, gamma, beta):
        return op.LayerNormalization(op.Add(x, skip, _name="residual"), gamma, Optional(beta),
                                     axis=Attr("axis", -1), epsilon=Attr("epsilon", 1e-5))

    def check(self, x, skip, gamma, axis, epsilon, beta=None):
        if not epsilon > 0:  # NaN too: SkipLayerNormalization's kernel refuses it at load
            return f"epsilon {epsilon} is not positive"
        shapes = {tuple(p.shape or ()) for p in (gamma, beta) if p is not None}
        problem = _same_shape(x, skip)
        if problem is None and (axis not in (-1, 2) or shapes != {(x.shape[-1],)}):
            problem = f"axis={axis}, γ/β of shape {sorted(shapes)}: SkipLayerNormalization " \
                      f"takes the last axis and γ/β of shape [{x.shape[-1]}]"
        return problem

    def rewrite(self, op, x, skip, gamma, epsilon, exposed, beta=None):
        return _skip_layernorm(op, x, skip, [gamma, *([] if beta is None else [beta])],
                               float(epsilon), exposed)


def _centred(x: Value) -> bool:
    """x = Sub(v, ReduceMean(v)): an RMSNorm of it is a LayerNorm the LayerNorm rules own."""
    sub = x.producer
    mean = sub.inputs[1].producer if sub is not None and sub.op_type == "Sub" else None
    return mean is not None and mean.op_type == "ReduceMean" and mean.inputs[0] is sub.inputs[0]


def _standard(model) -> bool:
    """Whether an RMSNorm fuses into ONNX's RMSNormalization (opset 23, where onnxruntime has
    its schema), else onnxruntime's SimplifiedLayerNormalization."""
    return (model.opset("") or 1) >= 23 and ("", "RMSNormalization") in runtime_schemas()


class _RmsNorm(Rule):
    emits = (("", "SimplifiedLayerNormalization"),)
    dtypes = FLOATS

    def check(self, x, model, target=None, **b):
        if _centred(x):
            return "x is x - mean(x), a LayerNorm"
        # At opset 23 and later the rewrite emits ONNX's RMSNormalization, which the target
        # must take too: a profile without it had sent the fused norm to the host
        standard = (("", "RMSNormalization"),) if _standard(model) else ()
        return target_refuses(target, standard, x) or _problem(x, b)

    def rewrite(self, op, x, eps, gamma=None, **_):
        fused = op.RMSNormalization if _standard(op.model) else op.SimplifiedLayerNormalization
        return fused(x, *_scale_bias(op, x, gamma, None), axis=-1, epsilon=float(eps.ravel()[0]))


class RmsNormDiv(_RmsNorm):
    """x / √(mean(x²) + ε) · γ"""
    def pattern(self, op, x, gamma):
        return op.Mul(_norm(op, x, centre=False), gamma)


class RmsNormReciprocal(_RmsNorm):
    """x · Reciprocal(√(mean(x²) + ε)) · γ: torch.rsqrt through the dynamo exporter."""
    def pattern(self, op, x, gamma):
        return op.Mul(_norm(op, x, centre=False, inverse="reciprocal"), gamma)


class RmsNormOneOver(_RmsNorm):
    """x · (1 / √(mean(x²) + ε)) · γ: torch.rsqrt through the TorchScript exporter."""
    def pattern(self, op, x, gamma):
        return op.Mul(_norm(op, x, centre=False, inverse="one_over"), gamma)


class RmsNormPowHalf(_RmsNorm):
    """x · (mean(x²) + ε)^-½ · γ"""
    def pattern(self, op, x, gamma):
        return op.Mul(_norm(op, x, centre=False, inverse="pow"), gamma)


class RmsNormMulSquare(_RmsNorm):
    """x / √(mean(x·x) + ε) · γ: the square as torch.square or a hand-written x * x gives it."""
    def pattern(self, op, x, gamma):
        return op.Mul(_norm(op, x, centre=False, square="mul"), gamma)


class RmsNormMulSquareReciprocal(_RmsNorm):
    """x · Reciprocal(√(mean(x·x) + ε)) · γ: the same with torch.rsqrt."""
    def pattern(self, op, x, gamma):
        return op.Mul(_norm(op, x, centre=False, square="mul", inverse="reciprocal"), gamma)


class RmsNormCast(_RmsNorm):
    """Llama/T5 in fp16: γ · Cast(Cast(x → f32) · Reciprocal(√(mean(x²) + ε)) → x's type)."""
    def pattern(self, op, x, gamma):
        return op.Mul(_norm(op, x, centre=False, inverse="reciprocal", cast=True), gamma)


def _rms_no_affine(op, x, root: str):
    """x / √(mean(x²) + ε) with no γ, in any of the forms above (the square Pow or Mul), rooted
    at its `root`: the Div, or the Mul by Reciprocal(√·), 1 / √· or ·^-½."""
    ms = op.Add(_mean(op, OneOf(op.Pow(x, EXACT_2), op.Mul(x, x)), "var"), EPS)
    if root == "Div":
        return op.Div(x, op.Sqrt(ms))
    return op.Mul(x, OneOf(op.Reciprocal(op.Sqrt(ms)), op.Div(1.0, op.Sqrt(ms)),
                           op.Pow(ms, -0.5)))


class RmsNormNoAffineDiv(_RmsNorm):
    """x / √(mean(x²) + ε) with no γ: a unit weight a cleanup removed (as every freshly
    initialized RMSNorm has), or a norm without one. Tried after the rules with γ."""
    def pattern(self, op, x):
        return _rms_no_affine(op, x, "Div")


class RmsNormNoAffineMul(_RmsNorm):
    """x · rsqrt(mean(x²) + ε) with no γ, rsqrt as Reciprocal(√·), 1 / √· or ·^-½."""
    def pattern(self, op, x):
        return _rms_no_affine(op, x, "Mul")


class RmsNormNoAffineCast(_RmsNorm):
    """Llama/T5 in fp16 with no γ: Cast(Cast(x → f32) · Reciprocal(√(mean(x²) + ε)) → x's type)."""
    def pattern(self, op, x):
        return _norm(op, x, centre=False, inverse="reciprocal", cast=True)


@register
class FuseLayerNorm(RulePass):
    name = "FuseLayerNorm"
    description = "LayerNorm and RMSNorm (decomposed, with Casts, after a residual Add) into one op"
    # Skip…Decomposed rules precede their LayerNorm twins: the residual Add fuses in the same run.
    # A rule with γ precedes its twin without, which would take the norm and leave the Mul; the
    # Cast form precedes the plain ones, which would take the norm between the Casts.
    rules = (SkipLayerNormDecomposed, LayerNormDecomposed, LayerNormMulSquare, LayerNormCast,
             LayerNormRsqrt, LayerNormMoments, LayerNormBatchnorm, SkipLayerNormNoAffine,
             LayerNormNoAffine, LayerNormNoAffineRsqrt, LayerNormMomentsNoAffine, SkipLayerNorm, ChannelLayerNorm, ChannelLayerNormRsqrt,
             RmsNormDiv, RmsNormReciprocal, RmsNormOneOver, RmsNormPowHalf, RmsNormMulSquare,
             RmsNormMulSquareReciprocal, RmsNormCast, RmsNormNoAffineCast, RmsNormNoAffineDiv,
             RmsNormNoAffineMul, LayerNormThenBias)


__all__ = ["FuseLayerNorm"]
