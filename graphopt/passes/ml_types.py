"""Output types of the ai.onnx.ml ops ONNX's shape inference leaves untyped, from their spec.

scikit-learn's exports end in these ops (a Normalizer, a tree ensemble's scores); untyped, the
Cast or Identity after them cannot be judged a no-op, and nothing downstream is typed either.
Each rule maps a node to [(output index, dtype, shape)]; a dim it cannot tell is None.
"""

from __future__ import annotations

from graphopt.ir import DType, Node


def _rows(node: Node) -> tuple | None:
    """(N,): the batch dim of X ([N, C], or [C] as one row), or None when X's rank is not one
    of those (unknown)."""
    shape = node.inputs[0].shape
    if shape is None or len(shape) not in (1, 2):
        return None
    return (shape[0],) if len(shape) == 2 else (1,)


def _same_as_input(dtype: DType | None = None):
    """Y of X's shape, in `dtype` (X's own when None)."""
    def rule(node: Node) -> list:
        x = node.inputs[0]
        return [(0, dtype or x.dtype, x.shape)]
    return rule


def _scores(targets_attr: str | None, default: int | None):
    """Y float [N, targets], the targets count from an attribute (or `default`)."""
    def rule(node: Node) -> list:
        rows = _rows(node)
        if rows is None:
            return []
        targets = node.attr(targets_attr, default) if targets_attr else default
        return [(0, DType.FLOAT, (*rows, targets if isinstance(targets, int) else None))]
    return rule


def _classifier(node: Node) -> list:
    """Y the labels [N] (int64 or string, by which class label list the node has), Z the
    float scores [N, classes]: a binary classifier's column count differs between runtimes
    (and an SVM's with its mode), so its classes dim stays unknown; a tree ensemble or linear
    classifier of more classes scores each of its labels (onnxruntime's, at every ai.onnx.ml
    opset), which pinned shapes had left open ([64, ?] for what runs as [64, 3])."""
    rows = _rows(node)
    if rows is None:
        return []
    names = (node.attr("classlabels_strings") or node.attr("classlabels_int64s")
             or node.attr("classlabels_ints") or ())
    classes = len(names) if len(names) > 2 and node.op_type != "SVMClassifier" else None
    labels = DType.STRING if node.attr("classlabels_strings") else DType.INT64
    return [(0, labels, rows), (1, DType.FLOAT, (*rows, classes))]


ML_TYPED_BY_RULE = {
    "Normalizer": _same_as_input(DType.FLOAT),
    "Scaler": _same_as_input(DType.FLOAT),
    "Binarizer": _same_as_input(),
    "Imputer": _same_as_input(),
    "LinearRegressor": _scores("targets", 1),
    "TreeEnsembleRegressor": _scores("n_targets", None),
    "SVMRegressor": _scores(None, 1),
    "TreeEnsembleClassifier": _classifier,
    "LinearClassifier": _classifier,
    "SVMClassifier": _classifier,
}


# The element types the spec fixes for outputs ONNX's inference leaves untyped, by op:
# (output index, dtype); a classifier's labels take the type of its class label list. The
# dtypes of ML_TYPED_BY_RULE's rules, for protos, before any inference has run.
_SPEC_DTYPES = {"Normalizer": ((0, DType.FLOAT),), "Scaler": ((0, DType.FLOAT),),
                "LinearRegressor": ((0, DType.FLOAT),),
                "TreeEnsembleRegressor": ((0, DType.FLOAT),), "SVMRegressor": ((0, DType.FLOAT),),
                "TreeEnsembleClassifier": ((1, DType.FLOAT),),
                "LinearClassifier": ((1, DType.FLOAT),), "SVMClassifier": ((1, DType.FLOAT),)}


def declare_spec_types(graph) -> None:
    """Declare, in an onnx GraphProto about to go through ONNX's shape inference, the element
    type of each output of the ai.onnx.ml ops in _SPEC_DTYPES that the graph leaves untyped.
    onnx 1.23's inference dereferences a null type where a LabelEncoder reads such an output
    (a scikit-learn RandomForest exported with decision_path=True): the process died of
    SIGSEGV, with no message, where onnxruntime runs the model."""
    from onnx import helper

    known = {info.name for info in (*graph.input, *graph.output, *graph.value_info)}
    for node in graph.node:
        if node.domain != "ai.onnx.ml" or node.op_type not in _SPEC_DTYPES:
            continue
        typed = list(_SPEC_DTYPES[node.op_type])
        if node.op_type.endswith("Classifier"):
            # As _classifier reads it: an empty list is none (onnxruntime then gives int64).
            strings = any(a.name == "classlabels_strings" and a.strings for a in node.attribute)
            typed.append((0, DType.STRING if strings else DType.INT64))
        for index, dtype in typed:
            name = node.output[index] if index < len(node.output) else ""
            if name and name not in known:
                graph.value_info.append(helper.make_tensor_value_info(name, int(dtype), None))
                known.add(name)
