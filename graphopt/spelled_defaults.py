"""Attribute defaults that ONNX's shape inference reads otherwise than the spec and onnxruntime,
spelled out at import so that both size the op alike; and a split that onnxruntime reads
otherwise than the spec, written in the form both read alike."""

from __future__ import annotations

from graphopt.ir import Model

# STFT's `onesided` defaults to 1 in the spec, and onnxruntime returns frame_length / 2 + 1
# frequency bins without it; onnx 1.23's inference takes 0 and sizes all frame_length of them
# (16 where onnxruntime gives 9). Written out, inference agrees, and the spectrum and what an
# audio front end computes from it (a mel MatMul, a Log) keep static shapes.
_DEFAULTS = {"STFT": {"onesided": 1}}


def spell_out_defaults(model: Model) -> int:
    """Write the attributes of _DEFAULTS that a node leaves unset, at their spec defaults, and
    drop the unit splits of _drops_unit_split; returns how many nodes changed. It changes no
    result: onnxruntime reads the same values."""
    written = 0
    for node in model.graph.all_nodes():
        defaults = _DEFAULTS.get(node.op_type) if node.is_onnx else None
        for name, value in (defaults or {}).items():
            if node.attr(name) is None:
                node.set_attr(name, value)
                written += 1
        if _drops_unit_split(node):
            split = node.input(1)
            node.set_inputs(node.inputs[:1])
            _forget_if_unread(split)
            written += 1
    return written


def _drops_unit_split(node) -> bool:
    """A SplitToSequence with keepdims=0 and a constant scalar split of 1, as the TorchScript
    exporter writes torch.unbind: onnxruntime drops the split axis from each piece, the spec
    and ONNX's inference ignore keepdims once a split is given and keep it ([1, 17] where
    onnxruntime returns [17]). Without the split, the pieces are the same size-1 slices, and
    both drop the axis."""
    if node.op_type != "SplitToSequence" or not node.is_onnx or node.attr("keepdims", 1) != 0:
        return False
    split = node.input(1)
    value = split.constant() if split is not None else None
    return value is not None and value.ndim == 0 and int(value) == 1


def _forget_if_unread(value) -> None:
    """Remove a constant nothing reads any more (onnxruntime warns of unused initializers)."""
    if value.uses or value.is_graph_output or value.is_input:
        return
    if value.producer is not None and value.producer.op_type == "Constant":
        value.producer.graph.remove(value.producer)
    elif value.graph is not None and value.graph.initializers.get(value.name) is value:
        value.graph.remove_initializer(value)
