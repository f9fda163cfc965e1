"""RenameOrtGeneratedInitializers: initializers that carry names onnxruntime generated get names
its generator cannot hand out again.

onnxruntime names the initializers some of its graph transformers add with its node-name
generator (Graph::GenerateNodeName, by its behaviour in onnxruntime 1.32): `base` itself, else
`base_token_<N>`, N from a counter that every name the session generates advances. It checks a
candidate against node names and the names it gave out, never against values: a node named
`gemm_input_shape` makes it move on, an initializer of that name does not. A model onnxruntime
optimized keeps those initializers; when a later session fuses again (its extended level's
MatMulAddFusion, or its basic level's on a graph graphopt changed), the counter starts over and
the new initializer can take a name an old one holds: the session fails with
"AddInitializedOrtValue Attempt to replace the existing tensor". Bases seen so far:

    MatMulAddFusion  gemm_input_shape, gemm_output_shape   (Reshapes around a 3-D MatMul+Add)
    ReshapeFusion    <Reshape node name>_new_shape          (`_new_shape` for an unnamed node)

onnxruntime's ConstantSharing, which runs before its fusions, often frees such names by chance
(of equal shapes it keeps another); MergeDuplicateInitializers keeps the first of equal weights,
often the bare one, and leaves it nothing to share.

Taken for onnxruntime's: a name with a `_token_<N>` part, every name that is the same without
its `_token_<N>` parts (the bare base beside `base_token_3`), and the bases above, which a
model with a single such fusion holds alone. This pass runs before anything merges or removes
initializers, while the whole family is still there to be seen. Renamed:

    gemm_input_shape_token_12              ->  gemm_input_shape_12
    gemm_output_reshape_token_5_new_shape  ->  gemm_output_reshape_5_new_shape_1
    gemm_input_shape                       ->  gemm_input_shape_1  (the next free suffix)

Names that are part of the signature (graph inputs and outputs) stay; so do computed values,
which onnxruntime names with a generator that checks values.
"""

from __future__ import annotations

import re

from graphopt.ir import Graph, Model
from graphopt.passes.base import Pass, PassContext, PassResult, register

_TOKEN = re.compile(r"_token_(\d+)(?=_|\Z)")
_BASES = frozenset({"gemm_input_shape", "gemm_output_shape"})
_SUFFIXES = ("_new_shape",)


@register
class RenameOrtGeneratedInitializers(Pass):
    name = "RenameOrtGeneratedInitializers"
    description = "rename initializers that carry names onnxruntime's name generator wrote " \
                  "(base_token_N, their base), which it would write again"

    # Asks no rewrite gate: a name changes no output.
    def run(self, model: Model, ctx: PassContext) -> PassResult:
        result = PassResult()
        families = {_TOKEN.sub("", v.name) for v in model.graph.all_values()
                    if _TOKEN.search(v.name)}
        for graph in list(model.graph.all_graphs()):
            for value in list(graph.initializers.values()):
                # A sparse initializer's name lives in its proto too; onnxruntime adds none.
                if value.is_input or value.is_graph_output or value.sparse_const is not None \
                        or not _generated(value.name, families):
                    continue
                old = value.name
                value.name = _unclaimed(graph, _TOKEN.sub(r"_\1", old), families)
                del graph.initializers[old]
                graph.initializers[value.name] = value
                result.count("initializer")
        return result


def _generated(name: str, families: set[str]) -> bool:
    return bool(_TOKEN.search(name)) or name in families or name in _BASES \
        or name.endswith(_SUFFIXES)


def _unclaimed(graph: Graph, stem: str, families: set[str]) -> str:
    """A name no value of the model has, which onnxruntime's generator would not produce."""
    while True:
        name = graph.fresh_name(stem)
        if not _generated(name, families):
            return name
