"""A compile's checks: the input's ops and types, pinned shapes, onnxruntime loading its output."""

from __future__ import annotations

import re
from contextvars import ContextVar

from graphopt import numerics
from graphopt.deprecated_ops import EARLY_LAYER_NORM_HINT, replace_deprecated_ops
from graphopt.errors import InputError, ModelAtFault
from graphopt.ir import Model, to_onnx
from graphopt.ir.collector import heap_frozen
from graphopt.opcheck import check_kernel_dtypes, check_ops
from graphopt.operand_shapes import check_operand_shapes
from graphopt.option_names import option
from graphopt.passes.disputed_shapes import forget_disputed_sizes
from graphopt.passes.infer_shapes import drop_unfounded_declarations, record_type_bytes
from graphopt.spelled_defaults import spell_out_defaults


def check_input(model: Model, label: str, allow_custom_ops: bool = False,
                npu_bfloat16: bool = False) -> list[str]:
    """check_ops on the imported model (InputError naming the node at fault), keeping the
    static types its shape inference found: a static model is then typed in full, and the
    pipeline's InferShapes passes have nothing left to do. Deprecated ops onnxruntime still
    runs are rewritten first; returns the notes saying so. `npu_bfloat16`: the target's NPU
    runs bfloat16, so bfloat16 nodes are left to the placement's check."""
    notes = replace_deprecated_ops(model, label)
    spell_out_defaults(model)
    with heap_frozen():  # the IR is long-lived: no full collection should walk it again
        try:
            types = check_ops(model, label, allow_custom_ops)
        except InputError as exc:
            if "LayerNormalization" in str(exc) and any(
                    n.startswith("LayerNormalization at opset") for n in notes):
                raise InputError(f"{exc}; {EARLY_LAYER_NORM_HINT}") from None
            raise
        if types is not None:
            drop_unfounded_declarations(model, types)
            record_type_bytes(model, types, static_only=True)
            forget_disputed_sizes(model)  # onnxruntime's sizes: see disputed_shapes
        check_kernel_dtypes(model, label, skip_bfloat16=npu_bfloat16)
        check_operand_shapes(model, label)
    return notes + (custom_ops_note(model) if allow_custom_ops else [])


def custom_ops_note(model: Model) -> list[str]:
    """The note a compile that keeps custom ops gets: onnxruntime runs them only with their
    library registered, which graphopt's own runtime does not do (an .om holding them loads
    but fails at its first run)."""
    from graphopt.opcheck import known_op_domains

    known = known_op_domains() | {"ai.onnx"}
    functions = model.function_keys()
    custom = sorted({node.qualified_op for graph in model.graph.all_graphs() for node in graph
                     if node.domain not in known and (node.domain, node.op_type) not in functions})
    if not custom:
        return []
    shown = ", ".join(custom[:4]) + (f" and {len(custom) - 4} more" if len(custom) > 4 else "")
    return [f"custom op(s) {shown} kept as they are: onnxruntime runs them only in a session "
            "that registered their library, which graphopt's runtime (`graphopt run`, "
            "`compare`, `graphopt.load`) does not do, so an .om holding them cannot run there; "
            "write `-o model.onnx` and run it in your own session with the library registered"]


def overridable_initializers(model: Model) -> list[str]:
    """The graph inputs that carry an initializer a caller may override (ONNX IR ≥ 4)."""
    return model.graph.overridable_inputs()


def overridable_note(model: Model) -> list[str]:
    """The note a model with overridable initializers gets: what each output does with them."""
    names = overridable_initializers(model)
    if not names:
        return []
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return [f"{shown}: initializer(s) the model also lists as inputs, which ONNX lets a caller "
            "override: no pass folds them, optimized ONNX keeps them overridable, and an .om "
            "fixes them at their values (it takes no such feed), as ATC fixes weights"]


def check_pinned_shapes(model: Model, label: str, shapes: dict[str, list[int]]) -> None:
    """Strict shape inference again, on the pinned model: a pin the graph cannot take (a batch of
    3 added to a [2, 4] weight) would otherwise compile, infer_shapes being best effort, into
    an artifact onnxruntime refuses to load. InputError naming the node and the pins."""
    from graphopt.input_shapes import reshape_conflict
    from graphopt.opcheck import check_inference

    try:
        check_inference(model, label)
    except InputError as exc:
        raise InputError(f"{exc} (with the pinned shapes {_pins(shapes, model)})") from None
    conflict = reshape_conflict(model)
    if conflict:  # inference lets a static element count through that the kernel refuses
        raise InputError(f"{label}: {conflict} with the pinned shapes {_pins(shapes, model)}")


def check_compiled_loads(model: Model, label: str, shapes: dict[str, list[int]]) -> None:
    """InputError when onnxruntime refuses the compiled model that the pins made static (its
    caller knows it loaded the model before them). ONNX's inference does not see all that
    onnxruntime's does: silero-vad pinned to [1, 512] makes the If branch for the other
    sample rate, which those inputs never take, give its LSTM a rank-4 input once the shapes
    fold."""
    from graphopt.input_shapes import reshape_conflict

    conflict = reshape_conflict(model)  # a target folded from Concat/Shape only now
    if conflict:
        raise InputError(f"{label}: {conflict} with the pinned shapes {_pins(shapes, model)}: the "
                         "model fixes that size, so it cannot run at these shapes")
    refusal = onnxruntime_refusal(model)
    # A missing kernel is about types, which pins do not change: a bfloat16 compile for an
    # NPU the CPU provider has no kernels for (it runs where the CANN provider is).
    if refusal and _missing_kernel(refusal, model):
        return
    if refusal and onnxruntime_refusal(model, weightless=False):  # weights in place: surely
        branches = any(node.op_type in ("If", "Loop", "Scan") for node in model.graph.all_nodes())
        why = ("A pin can give a shape to a branch the inputs never take that it cannot have: "
               "leave such an input's dims open" if branches else
               "The model fixes a size these pins change (an export traced at one batch size "
               "or length keeps it in its Reshapes and weights): pin the sizes it was exported "
               "at, or leave those dims open")
        if "Op (Range)" in refusal:  # its bounds of shape [1], typed once the shapes are static
            why = ("onnxruntime's load-time inference refuses a Range whose bounds have shape "
                   "[1] once the pins make them static (the pins themselves fit): -O2 folds "
                   "such bounds into scalars, or leave those dims open")
        raise InputError(f"{label}: with the pinned shapes {_pins(shapes, model)}, onnxruntime "
                         f"cannot load the compiled model: {refusal}. {why} "
                         f"({_unpinned_advice()})")


def foreign_block_note(model: Model) -> str | None:
    """The note for a compile whose convs are blocked for another CPU's NCHWc block (a target
    profile's nchwc_block_size), None otherwise. onnxruntime here cannot check it: it runs such
    a model wrong without an error (the weights of 16 channels blocked by 8 have the shape it
    expects) or refuses it (it sizes the blocked outputs by its own block, which padded channel
    counts contradict where two meet: an -O3 Min of 36 channels, which the load check had
    called a graphopt bug)."""
    from graphopt.nchwc_block import foreign_block

    blocks = foreign_block(dict(model.metadata_props))
    if blocks is None:
        return None
    return (f"the compile's convs are in NCHWc blocks of {blocks[0]} channels (the target's "
            f"nchwc_block_size) and onnxruntime here blocks by {blocks[1] or 'nothing'}: it "
            f"runs only on a CPU that blocks by {blocks[0]}, and was not loaded here (an .om "
            "refuses to load on another CPU; an .onnx runs wrong on one, without an error)")


def check_runs_at_its_shapes(model: Model, label: str) -> None:
    """InputError when a Reshape of the compiled model's main graph cannot take the static
    shape its input has: onnxruntime loads such a model and fails at every run (a Reshape of
    [1, 4] to a fixed [3, 5]), so the compile would be an artifact that never runs."""
    from graphopt.input_shapes import reshape_conflict

    conflict = reshape_conflict(model)
    if conflict:
        raise InputError(f"{label}: {conflict}, so the model cannot run: onnxruntime loads it "
                         "and fails at every run")


def _unpinned_advice() -> str:
    """How to leave an input's dims open, in terms of the options that pinned them."""
    given = PIN_OPTIONS.get()
    advice = (f"no {option('dynamic_dims')} key on its dims" if "dynamic_dims" in given
              else f"no {option('input_shapes')} for it")
    return advice + (f", nor {option('input_shapes')}" if len(given) > 1 else "")


def check_loads(model: Model, label: str, given: bytes, device: str = "") -> str | None:
    """InputError when onnxruntime cannot load the compiled model where it loads the original
    (`given`, weightless_bytes of the model as given): a model it loads but cannot run, or a
    rewrite gone wrong. A note when it loads neither: the model as given is one onnxruntime
    refuses, and so will the output be (a kernel it lacks for the original's types too: a
    bf16 Attention's Expand; the compile had passed without a word). None when it loads. A
    kernel missing for the compile alone is about types, which the CPU provider may lack for a
    device's compile (bfloat16), and is left to the artifact's runtime. `device` names the
    provider an NPU target's artifact runs on, where it may load."""
    refusal = onnxruntime_refusal(model)
    if refusal and not _missing_kernel(refusal, model):
        # Some kernels take only constant weights, which the weightless check passes as inputs.
        refusal = onnxruntime_refusal(model, weightless=False)
    if not refusal:
        return None
    original = numerics.load_refusal(given)
    if _missing_kernel(refusal, model) and original is None:
        return None
    if original is None:
        # Either a model onnxruntime loads but can never run (a Reshape to a size its data
        # does not have), whose contradiction folding made static, or a rewrite gone wrong.
        basic = numerics.load_refusal(given, level="basic")
        if basic is not None and _innermost(basic) == _innermost(refusal):
            # Its own optimizer, which infers shapes into the branches, refuses the original
            # too: the model is what breaks once shapes are known, not graphopt's rewrite.
            raise ModelAtFault(f"{label}: onnxruntime loads the original only with its graph "
                             f"optimizations off (ORT_DISABLE_ALL; at ORT_ENABLE_BASIC: "
                             f"{basic}); graphopt infers and folds shapes as that optimizer "
                             f"does, and the compiled model meets the same refusal: {refusal}. "
                             "The model is at fault (a node that cannot take the shapes "
                             "inference gives it), not a rewrite")
        raise InputError(f"{label}: onnxruntime cannot load the compiled model, where it loads "
                         f"the original: {refusal}. If the original runs, this is a graphopt "
                         "bug (--disable-pass on the pass that made the node, or -O0, compiles "
                         "without it); a model onnxruntime loads but cannot run fails so once "
                         "its shapes fold")
    where = f"; {device} may load it" if device else ""
    return (f"{UNLOADABLE_NOTE}, nor its compile: {refusal} (the output will not load on "
            f"this onnxruntime's CPU provider{where})")


def _innermost(refusal: str) -> str:
    """What onnxruntime's refusal says last, after the nodes and error kinds that lead to it
    ("First input tensor must have rank 3"): two refusals alike there are the same fault."""
    return refusal.rsplit("] ", 1)[-1].strip()


def _missing_kernel(refusal: str, model: Model) -> bool:
    """Whether onnxruntime's CPU provider refuses the model for a kernel it lacks: none for an
    op's types (NOT_IMPLEMENTED), or, where it has none for a function op's bfloat16 (Clip),
    the bfloat16 its expansion's ops refuse: the type error then names an op the model does not
    hold (Clip's body's Where). Both are the CPU provider's gaps, which the device a compile
    targets does not share, and are left to the artifact's runtime."""
    if "NOT_IMPLEMENTED" in refusal:
        return True
    found = re.search(r"Type Error: Type 'tensor\(bfloat16\)' of input parameter \(.*?\) "
                      r"of operator \((\w+)\)", refusal)
    return found is not None and found.group(1) not in {
        node.op_type for node in model.graph.all_nodes()}


# How check_loads' note starts: `optimize -q` still prints it, as a warning.
UNLOADABLE_NOTE = "onnxruntime cannot load the model as given"


def _pins(shapes: dict[str, list[int]], model: Model) -> str:
    """The pinned input shapes as --input-shape writes them, with the sizes `model` has where a
    pin keeps a dim (-1): a shape profile's pins keep the dims the model fixes, which were
    quoted as -1 (x:3,-1 of an x[B, 4])."""
    inputs = {v.name: v.shape for v in model.graph.inputs}
    quoted = []
    for name, dims in shapes.items():
        shape = inputs.get(name) or ()
        sizes = [held if pinned == -1 and isinstance(held, int) else pinned
                 for pinned, held in zip(dims, [*shape, *[None] * (len(dims) - len(shape))])]
        quoted.append(f"{name}:{','.join(map(str, sizes))}")
    return ";".join(quoted)


# The options that pinned the input shapes of the compile under way, as the user gave them:
# a shape profile's compile (compile_profiles) sets them, since its pins come from
# --dynamic-dims, and advice to drop an --input-shape the user never gave misleads.
PIN_OPTIONS: ContextVar[tuple[str, ...]] = ContextVar("PIN_OPTIONS", default=("input_shapes",))


def weightless_bytes(model: Model) -> bytes | None:
    """The model serialized with weights above 1 KiB as graph inputs of their type and shape,
    as onnxruntime_refusal has onnxruntime judge it; None past protobuf's 2 GiB."""
    return numerics.serialized(to_onnx(model, weights_as_inputs_above=1024, value_infos=False))


def onnxruntime_refusal(model: Model, weightless: bool = True) -> str | None:
    """Why onnxruntime refuses to load `model` (None when it loads it, or when it cannot be
    asked: a model past protobuf's 2 GiB with its weights), as a session without graph
    optimizations sees it. `weightless`: weights above 1 KiB are passed as graph inputs of
    their type and shape, so the check copies no weight and costs milliseconds (a kernel that
    needs a constant weight, MatMulNBits', then refuses what it would load)."""
    data = numerics.serialized(to_onnx(model, weights_as_inputs_above=1024 if weightless
                                       else None))
    return numerics.load_refusal(data) if data is not None else None
