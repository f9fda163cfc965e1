"""Evaluating constant nodes for FoldConstants in one onnxruntime session."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from graphopt import numerics
from graphopt.ir import DType, Model, Node, Tensor, Value
from graphopt.ir.onnx_export import node_to_proto


def is_castlike(node: Node) -> bool:
    return node.op_type == "CastLike" and node.is_onnx and node.input(1) is not None


def _node_proto(node: Node) -> onnx.NodeProto:
    """The node for the evaluation session; CastLike becomes a Cast so the type-only input
    need not be there."""
    proto = node_to_proto(node)
    if is_castlike(node):
        del proto.input[1:]
        del proto.attribute[:]
        proto.op_type = "Cast"
        proto.attribute.append(helper.make_attribute("to", int(node.input(1).dtype)))
        if node.attr("saturate") is not None:
            proto.attribute.append(helper.make_attribute("saturate", node.attr("saturate")))
    return proto


class EvalError(Exception):
    """onnxruntime could not evaluate the nodes; the message is its first line of complaint.
    `at_run`: the session was built and a kernel failed on these inputs, which it will do
    on the same inputs at inference too (not a missing kernel or an unfetchable type)."""

    def __init__(self, message: str, at_run: bool = False) -> None:
        super().__init__(message)
        self.at_run = at_run


# Constants this large go to the session as inputs, fed the arrays they are, not as
# initializers: an initializer is copied into the proto, again into its serialized bytes and
# again into onnxruntime's own tensor (4 GB at the peak to fold 768 MB of transposed weights).
_FED_BYTES = 1 << 20
# The element types numpy holds as onnxruntime reads them (not bfloat16, float8 or 4-bit).
_FEEDABLE = frozenset({DType.FLOAT, DType.FLOAT16, DType.DOUBLE, DType.INT8, DType.INT16,
                       DType.INT32, DType.INT64, DType.UINT8, DType.UINT16, DType.UINT32,
                       DType.UINT64, DType.BOOL})


def evaluate(model: Model, nodes: list[Node], feeds: dict[str, Tensor], wanted: list[Value]
             ) -> dict[int, Tensor]:
    """Run `nodes` in one onnxruntime session, constants in `feeds` as initializers (the large
    ones as inputs); return the data of `wanted` keyed by id(value)."""
    for node in nodes:
        _check_integer_division(node, feeds)
    graph = onnx.GraphProto(name="fold")
    graph.node.extend(_node_proto(n) for n in nodes)
    arrays_in = {}
    for name, tensor in feeds.items():
        array = tensor.numpy() if tensor.nbytes >= _FED_BYTES and tensor.dtype in _FEEDABLE \
            else None
        if array is not None and array.dtype.isnative:  # onnxruntime reads native order only
            graph.input.append(helper.make_tensor_value_info(name, int(tensor.dtype),
                                                             list(tensor.shape)))
            arrays_in[name] = array
        else:
            graph.initializer.append(tensor.to_proto(name))
    fetch_names, casts = [], {}
    for value in wanted:
        name = value.name
        if value.dtype == DType.BFLOAT16:  # the Python binding has no bfloat16: go through float
            name = value.name + "__fold_as_float"
            graph.node.append(helper.make_node("Cast", [value.name], [name],
                                               to=onnx.TensorProto.FLOAT))
            casts[name] = value.dtype
        fetch_names.append(name)
        graph.output.append(helper.make_empty_tensor_value_info(name))
    if model.ir_version < 4:  # initializers had to be graph inputs before IR 4
        graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                           for t in graph.initializer)
    # (make_model copies the graph: edits to `graph` after it would not reach the session.)
    proto = helper.make_model(graph, ir_version=model.ir_version, opset_imports=[
        helper.make_opsetid(domain, version) for domain, version in model.opset_imports.items()])
    try:
        session = numerics.session(proto)
    except Exception as e:  # noqa: BLE001 - any ORT failure means "cannot fold this way"
        raise EvalError(_first_line(e)) from None
    try:
        arrays = session.run(fetch_names, arrays_in)
    except UnicodeDecodeError as e:  # the kernel ran; its string result is not UTF-8
        raise EvalError(f"a string result is not UTF-8, which onnxruntime cannot return to "
                        f"Python ({e.reason} at byte {e.start})") from None
    except Exception as e:  # noqa: BLE001 - a kernel refused its inputs
        raise EvalError(_first_line(e), at_run=True) from None
    results = {}
    for value, name, array in zip(wanted, fetch_names, arrays):
        if not isinstance(array, np.ndarray):
            raise EvalError(f"%{value.name} is not a tensor")
        if name in casts:
            results[id(value)] = Tensor(array.astype(casts[name].numpy), dtype=casts[name])
        elif array.dtype == object:  # strings: bytes, as numpy_helper gives for loaded ones
            encoded = [v.encode() if isinstance(v, str) else v for v in array.ravel()]
            results[id(value)] = Tensor(np.array(encoded, dtype=object).reshape(array.shape),
                                        dtype=DType.STRING)
        else:
            results[id(value)] = Tensor(array)
    return results


def _check_integer_division(node: Node, feeds: dict[str, Tensor]) -> None:
    """EvalError for an integer Div or Mod that onnxruntime's kernel would run into the CPU's
    division trap, which ends the process (SIGFPE): a zero divisor, or Div of the type's least
    value by -1. A divisor (or, past -1, a dividend) computed in the same evaluation is not
    known yet: that too is an EvalError, and the caller's node-by-node evaluation has it."""
    if node.op_type not in ("Div", "Mod") or not node.is_onnx or len(node.inputs) < 2:
        return
    dividend, divisor = node.inputs[0], node.inputs[1]
    known = feeds.get(divisor.name) if divisor is not None else None
    if known is None:
        if divisor is not None and divisor.dtype is not None and divisor.dtype.is_integer:
            raise EvalError(f"the divisor of integer {node.op_type} '{node.name}' is computed "
                            "in the same evaluation")
        return
    d = known.numpy()
    if d.dtype.kind not in "iu":
        return
    if (d == 0).any():
        raise EvalError(f"integer {node.op_type} by zero", at_run=True)
    if node.op_type == "Div" and d.dtype.kind == "i" and (d == -1).any():
        top = feeds.get(dividend.name) if dividend is not None else None
        if top is None:
            raise EvalError(f"the dividend of integer Div '{node.name}' is computed in the "
                            "same evaluation")
        a, b = np.broadcast_arrays(top.numpy(), d)
        if ((a == np.iinfo(d.dtype).min) & (b == -1)).any():
            raise EvalError(f"integer Div of {np.iinfo(d.dtype).min} by -1 overflows "
                            f"{d.dtype}", at_run=True)


def _first_line(error: Exception) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__
