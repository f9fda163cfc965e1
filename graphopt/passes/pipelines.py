"""Named pipelines: the optimization levels -O0 … -O3 as ordered pass lists."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FixedPoint:
    """Repeat `passes` until none changes the model (or the iteration cap is hit)."""

    passes: tuple[str, ...]


Step = str | FixedPoint

_CLEANUP = ("EliminateIdentity", "EliminateNoOps", "EliminateDeadNodes")
# Fusions run after folding (patterns expect folded constants) and repeat with dead-node removal
# so that a fusion exposing another (Gelu then BiasGelu) is found.
# Order matters within a sweep: BatchNorm folds into Conv before Conv+Relu can fuse (and into
# each branch before MergeParallelConvs adds the branches' convs up), MatMul+Add
# becomes Gemm before Gemm+Relu does, the residual Add fuses into SkipLayerNormalization.
# Attention follows FuseMatMul, whose FusedMatMul already carries the scale; the Transpose and
# Reshape pairs it leaves cancel in the next sweep's SimplifyLayout and EliminateNoOps.
# UnmergeHeads comes first: at batch 1 SimplifyLayout's ReshapeChain folds a heads merge into
# the head split, which leaves no rank-4 tensor to unmerge to.
# SinkTransposes precedes SimplifyLayout, which cancels the Transpose pairs it brings together.
# LowerPRelu follows SinkTransposes, which moves Transposes past a PRelu as one op, and comes
# before FuseActivation, which takes the LeakyRelu a one-slope PRelu becomes into the conv.
# FoldInputAffine follows the activation fusions, whose patterns end in the Mul or Div by a
# constant it would otherwise take into the next Conv (hard-swish's / 6).
_FUSE = ("UnmergeHeads", "SinkTransposes", "SimplifyLayout", "SimplifySlicing",
         "FuseConvBatchNorm", "MergeParallelConvs", "ExpandForDevice", "LowerPRelu", "LowerLRN",
         "FuseLayerNorm", "FuseGelu", "FuseHardSwish", "FoldInputAffine", "FuseMatMul",
         "FuseRotaryEmbedding", "FuseAttention", "ReadShapesUpstream", "EliminateNoOps",
         "EliminateDeadNodes")
# Conv/Gemm + activation into FusedConv/FusedGemm only at -O3: onnxruntime fuses activations
# itself at ORT_ENABLE_ALL, and an offline FusedConv measured slower on Inception-v2 (52.9 vs
# 49.3 ms, bench/latency.py) because it stops onnxruntime's own layout-level fusions there.
# LowerSoftplus changes results within 3e-6 (the kernels' exp and log against Exp and Log): -O3.
# So does LowerSTFT, within the 3e-5 of the largest bin by which onnxruntime's plain DFT misses.
_FUSE_ALL = _FUSE[:-1] + ("LowerSoftplus", "LowerSTFT", "FuseActivation", "EliminateDeadNodes")
# An If whose condition folds to a constant becomes its branch inside the fold loop, so the
# branch's own nodes fold and fuse with the graph around them.
_FOLD = ("FoldShapes", "FoldConstants", "InlineConstantIf", "EliminateIdentity", "EliminateNoOps",
         "EliminateCommonSubexpressions", "EliminateDeadNodes")
# -O2 infers shapes again after folding, in a fixed point of its own: a dim that ONNX inference
# left symbolic before the folds (a batch of 1 broadcast against a Slice whose bounds were not
# yet constant, as BERT's token-type ids are) is static now, and the Shape→Gather→Concat
# chains that read it fold here, before the fusions. Each fold can make the next layer's dims
# static (GPT-2 at one token: layer by layer), so inference repeats until nothing changes; it
# skips a model whose every value is already typed and static, so a static model pays one
# sweep (~2% of a compile), less than re-inferring inside the first fixed point as -O3 does.
_REFOLD = ("FoldShapes", "FoldConstants", "InlineConstantIf", "EliminateDeadNodes")
# After the fusions: equal weights become one, which makes nodes that read them equal too (each
# attention layer's fused mask Expand, say), so one of each is kept.
_FINISH = ("MergeDuplicateInitializers", "EliminateCommonSubexpressions", "EliminateDeadNodes",
           "InferShapes")
# Every level starts here. Names onnxruntime generated in a model it optimized are renamed while
# every one of them is still there to tell its bare base (gemm_input_shape) from a weight's name:
# after MergeDuplicateInitializers, which keeps the first of equal weights, the bare name may be
# all that is left of them, and onnxruntime, loading the output, generates it again.
_IMPORT = ("InferShapes", "ConstantToInitializer", "RenameOrtGeneratedInitializers")


@dataclass(frozen=True)
class Pipeline:
    name: str
    description: str
    steps: tuple[Step, ...]

    def pass_names(self) -> list[str]:
        names: list[str] = []
        for step in self.steps:
            for name in (step.passes if isinstance(step, FixedPoint) else (step,)):
                if name not in names:
                    names.append(name)
        return names


PIPELINES: dict[int, Pipeline] = {
    0: Pipeline("O0", "no passes: import, verify, export", ()),
    1: Pipeline("O1", "cleanup: constants to initializers, identities, no-ops, dead nodes, "
                "initializer names onnxruntime generated",
                _IMPORT + (FixedPoint(_CLEANUP),)),
    2: Pipeline("O2", "O1 + shape and constant folding, constant-condition If inlining and "
                "CSE to a fixed point, fusions, shared weights",
                _IMPORT + (FixedPoint(_FOLD), FixedPoint(("InferShapes",) + _REFOLD),
                           FixedPoint(_FUSE)) + _FINISH),
    # Elementwise chains become local functions last, once no rule needs to see inside them; -O3
    # only: onnxruntime inlines local functions when it loads a model, so on the CPU they change
    # nothing, but a target that runs a group as one kernel (and the cost model) sees the groups.
    3: Pipeline("O3", "O2 with shape inference re-run inside the fixed point, so folding "
                "sees shapes that only earlier folds reveal, Softplus and Mish as Exp and Log, "
                "STFT as a Conv, "
                "activations fused into FusedConv/FusedGemm, and elementwise chains into "
                "graphopt:: local functions",
                _IMPORT + (FixedPoint(("InferShapes",) + _FOLD), "InferShapes",
                           FixedPoint(_FUSE_ALL), "FuseElementwise") + _FINISH),
}

DEFAULT_LEVEL = 2


def lowest_level(pass_name: str) -> int | None:
    """The lowest -O level whose pipeline runs `pass_name` (None: none does by itself)."""
    return next((level for level, pipeline in sorted(PIPELINES.items())
                 if pass_name in pipeline.pass_names()), None)


def for_target(pipeline: Pipeline, target) -> Pipeline:
    """`pipeline` with the passes a target adds. On a CPU target, -O3 rewrites wide 3×3 convs as
    Winograd GEMMs (WinogradConv: it changes results in the last bits, so not at -O2), and with
    an NCHWc block (AVX2 or AVX-512F) -O2 and -O3 end by blocking conv nets into onnxruntime's
    NCHWc ops, which its CPU provider otherwise does at every session start. Both follow the
    fusions, whose patterns match plain ONNX ops, and precede elementwise grouping and the
    final cleanup; the layout comes last, so it blocks the convs Winograd left."""
    if target is None or pipeline.name not in ("O2", "O3"):
        return pipeline
    device = target.device(target.primary)
    if device.kind != "cpu":
        return pipeline
    added = (("WinogradConv",) if pipeline.name == "O3" else ()) \
        + (("LayoutNchwc",) if device.nchwc_block_size else ())
    if not added:
        return pipeline
    # Before FuseElementwise (-O3) too: a residual Add + Relu hidden in a local function would
    # keep LayoutNchwc from taking them into the blocked Conv (ResNet-50's .om 10% slower).
    steps = pipeline.steps
    at = steps.index("FuseElementwise") if "FuseElementwise" in steps else len(steps) - len(_FINISH)
    return Pipeline(f"{pipeline.name}+{target.name}",
                    pipeline.description + f"; for {target.name}: " + ", ".join(added),
                    steps[:at] + added + steps[at:])


PRECISION_PASSES = {"int8": "QuantizeInt8", "int4": "QuantizeInt4Weights"}


def with_precision(pipeline: Pipeline, options) -> Pipeline:
    """`pipeline` with the precision passes `options` ask for (ConvertPrecision, QuantizeInt8,
    QuantizeInt4Weights), after the fusions, whose patterns match the float graph, and before
    elementwise grouping, the target's layout pass and the final cleanup, which then see the
    converted graph. At -O0 and -O1 they run last, followed by dead-node removal and shape
    inference."""
    added: tuple[str, ...] = ()
    if options.quantize == "int8":  # first: its layers stay int8, the float rest converts
        added += (PRECISION_PASSES[options.quantize],)
    if options.precision != "keep":
        added += ("ConvertPrecision",)
    if options.quantize not in ("none", "int8"):
        added += (PRECISION_PASSES[options.quantize],)
    if not added:
        return pipeline
    steps = list(pipeline.steps)
    later = [steps.index(name) for name in ("FuseElementwise", "WinogradConv", "LayoutNchwc",
                                            "MergeDuplicateInitializers") if name in steps]
    if not later:
        steps += list(added) + ["EliminateDeadNodes", "InferShapes"]
    else:
        steps[min(later):min(later)] = list(added)
    return Pipeline(f"{pipeline.name}+{'+'.join(added)}", pipeline.description + "; then "
                    + ", ".join(added), tuple(steps))
