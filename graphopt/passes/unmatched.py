"""The note for names a user gave (nodes to skip or pin, op types) that match nothing in the
optimized graph, with the nearest names: fusions rename the nodes they replace."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from graphopt.option_names import option


def unmatched_note(checks: Iterable[tuple], source: frozenset[str] = frozenset(),
                   cut: frozenset[str] = frozenset()) -> str | None:
    """For each (option, entries, names it may match[, "op types"]), the entries outside those
    names, each with its nearest names; None when every entry matches. Entries marked as op
    types get a note that the graph has none (not that a fusion renamed a node). `source`, the
    node names of the model as imported, tells a node a fusion renamed from a name no node of
    the model ever had (a typo); without it the note gives both causes. `cut`, the names and
    op types of the nodes --out-nodes removed, tells those apart from both."""
    renamed, unknown, op_types, removed = [], [], [], []
    for name, entries, known, *kind in checks:
        for entry in sorted(set(entries) - known):
            if entry in cut:
                removed.append(f"{name} {entry!r}")
                continue
            near = _nearest(entry, known)
            text = f"{name} {entry!r}" + (f" (nearest: {', '.join(map(repr, near))})"
                                          if near else "")
            (op_types if kind == ["op types"] else
             renamed if not source or entry in source else unknown).append(text)
    parts = []
    if removed:
        parts.append("; ".join(removed) + f" {_verb(removed)} only what "
                     f"{option('out_nodes')} removed (the model ends before it)")
    if unknown:
        parts.append("; ".join(unknown) + f" {_verb(unknown)} nothing in the model")
    if renamed:
        why = ("whose fused nodes have new names" if source else
               "a misspelt name, or a node a fusion took in under a new name")
        parts.append("; ".join(renamed) + f" {_verb(renamed, 'matches', 'match')} nothing in "
                     f"the optimized graph, {why} ({option('dump_dir')} shows the names)")
    if op_types:
        parts.append("; ".join(op_types) + f" {_verb(op_types, 'matches', 'match')} no op of "
                     f"the optimized graph (a fusion may have taken it in: {option('dump_dir')} "
                     "shows the graph)")
    return "; ".join(parts) or None


def _verb(problems: list, one: str = "names", many: str = "name") -> str:
    return one if len(problems) == 1 else many


def _nearest(entry: str, known: set[str]) -> list[str]:
    """The two names nearest `entry`. An exporter's path-like name (`/features.1/conv.0/Conv`)
    is nearest the names in its deepest folder first, then by its last part: a fusion renames
    the Conv it takes after the node it took in (`…/conv.0.1/BatchNormalization/ConvBatchNorm/
    Conv`), which plain string likeness ranked below the folder's Clip."""
    parts = entry.split("/")
    if len(parts) > 2:
        def shared(name: str) -> tuple[int, float]:
            other = name.split("/")
            depth = next((i for i, (a, b) in enumerate(zip(parts, other)) if a != b),
                         min(len(parts), len(other)))
            return depth, difflib.SequenceMatcher(None, parts[-1], other[-1]).ratio()

        ranked = sorted(((shared(name), name) for name in known if "/" in name), reverse=True)
        near = [name for (depth, likeness), name in ranked[:2] if depth > 1 and likeness >= 0.5]
        if near:
            return near
        # Nothing in its folder is named like it: a fusion there took it in and was named after
        # the node it rooted at (`…/attn/Softmax` inside `…/attn/MatMul_1/ScaledDotProduct
        # Attention/MultiHeadAttention`), with the rule's names after: that one, not a name
        # like it anywhere in the graph (an unrelated MatMul had been offered).
        folder = [name for (depth, _), name in ranked if depth >= len(parts) - 1 > 1]
        fused = [name for name in folder if len(name.split("/")) > len(parts)]
        if fused:
            return fused[:2]
    return difflib.get_close_matches(entry, known, n=2, cutoff=0.6)


def op_spellings(node) -> set[str]:
    """The names an op-type list may give `node` (a graphopt.ir Node): its bare op type (any
    domain) and the `domain::Op` graphopt's own messages print for a contrib op."""
    return {node.op_type, node.qualified_op}


# The ops a fused node computes inside it, as the fusions that make it took them in:
# attention's Softmax, GELU's Erf or Tanh (and the tanh form's cube), a norm's statistics (an
# ATC user denies the ReduceMean, Pow, Sqrt and Div of the exported graph, which the
# LayerNormalization fused from them had taken in without a word).
_ATTENTION = frozenset({"Softmax", "MatMul"})
_NORM = frozenset({"ReduceMean", "Pow", "Sqrt", "Div"})
_ABSORBED = {
    "Attention": _ATTENTION, "MultiHeadAttention": _ATTENTION, "PackedAttention": _ATTENTION,
    "PackedMultiHeadAttention": _ATTENTION, "GroupQueryAttention": _ATTENTION,
    "Gelu": frozenset({"Erf"}), "BiasGelu": frozenset({"Erf"}),
    "FastGelu": frozenset({"Tanh", "Pow"}), "QuickGelu": frozenset({"Sigmoid"}),
    "LayerNormalization": _NORM, "SimplifiedLayerNormalization": _NORM,
    "SkipLayerNormalization": frozenset({"LayerNormalization", "Add"}) | _NORM,
    "SkipSimplifiedLayerNormalization": frozenset({"SimplifiedLayerNormalization", "Add"})
    | _NORM,
    "FusedConv": frozenset({"Conv"}), "FusedGemm": frozenset({"Gemm"}),
    "FusedMatMul": frozenset({"MatMul"}),
}
# Fused nodes of the default domain: the norms ONNX has ops of since opset 17 and 23.
_ONNX_FUSED = frozenset({"LayerNormalization", "RMSNormalization"})


def absorbed_ops(node) -> set[str]:
    """The op types a fused node computes inside (see _ABSORBED), with the activation a
    FusedConv or FusedGemm applies; empty for any other node."""
    if node.domain in ("", "ai.onnx"):
        return set(_NORM) if node.op_type in _ONNX_FUSED else set()
    if node.domain != "com.microsoft":
        return set()
    found = set(_ABSORBED.get(node.op_type, ()))
    activation = node.attr("activation", None) if node.op_type in ("FusedConv", "FusedGemm") \
        else None
    return found | ({activation} if activation else set())
