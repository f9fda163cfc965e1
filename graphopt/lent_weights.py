"""Models for onnxruntime sessions that take their large weights from graphopt's own arrays."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
import onnxruntime as ort
from onnx import AttributeProto, ModelProto, TensorProto, numpy_helper

from graphopt.ir import Model, to_onnx
from graphopt.ir.onnx_io import node_tensors
from graphopt.ir.tensor import REFERENCE_PREFIX, Tensor, inline_tensors, tensor_references

# The element types onnxruntime's binding takes as numpy arrays; the others go as their bits.
_NUMPY_NATIVE = frozenset(np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128))

# The tensors lent within the `lending` blocks in force, innermost last, by the reference key
# their protos hold.
_LENT: ContextVar[tuple[dict[str, Tensor], ...]] = ContextVar("graphopt_lent_weights",
                                                              default=())


@contextmanager
def lending(lent: dict[str, Tensor] | None = None) -> Iterator[dict[str, Tensor]]:
    """Within the block, `lean_onnx` lends its weights into `lent` (a new dict by default, or
    the one an earlier block filled, to use its models again) and sessions find them there or
    in an enclosing block's. The dict keeps the tensors alive as long as it lives."""
    lent = {} if lent is None else lent
    token = _LENT.set((*_LENT.get(), lent))
    try:
        yield lent
    finally:
        _LENT.reset(token)


def _found(key: str) -> Tensor | None:
    """The tensor lent under `key`, from the innermost block in force holding it."""
    return next((lent[key] for lent in reversed(_LENT.get()) if key in lent), None)


def _lent(key: str, proto: TensorProto) -> Tensor:
    tensor = _found(key)
    if tensor is not None:
        return tensor
    raise RuntimeError(f"initializer '{proto.name}' names lent weights ({key}) that no "
                       "lending block in force holds: a lean model used after its block")


def lean_onnx(model: Model) -> ModelProto:
    """`to_onnx(model)` for onnxruntime to run, cheaply: within a `lending` block the main
    graph's weights of 1 KiB or more stay graphopt's arrays (mapped from the model's external
    data file where it has one), and the proto names them as external data, which
    `numerics.session` hands onnxruntime as OrtValues. Exporting a 784 MB model had copied
    every weight into protobuf, and each session had serialized them once more. Weights of
    nested graphs and Constant attributes are written with their data, since onnxruntime
    replaces only the main graph's initializers. Outside a block, `to_onnx(model)` as is."""
    blocks = _LENT.get()
    if not blocks:
        return to_onnx(model)
    with tensor_references() as references:
        proto = to_onnx(model)
    read = _read_names(proto)
    with inline_tensors():
        for tensor in _nested_tensors(proto):
            _inline_tensor(tensor, references)
        for tensor in proto.graph.initializer:  # onnxruntime drops those nothing reads
            if tensor.name not in read:
                _inline_tensor(tensor, references)
    main = {_key(t) for t in proto.graph.initializer}
    blocks[-1].update((key, tensor) for key, tensor in references.items() if key in main)
    return proto


def session_initializers(model: ModelProto) -> tuple[list[str], list[ort.OrtValue]]:
    """The names and OrtValues of `model`'s lent main-graph weights, for
    `SessionOptions.add_external_initializers`, which copies them into the session."""
    names, values = [], []
    for tensor in model.graph.initializer:
        key = _key(tensor)
        if key is None:
            continue
        names.append(tensor.name)
        values.append(_ort_value(_lent(key, tensor)))
    return names, values


def with_data(model: ModelProto) -> ModelProto:
    """`model` itself when no weight of it is lent, else a copy with every lent weight's data
    in it: for code that reads weights from the proto (nudging them, widening them)."""
    if not any(_key(t) for t in model.graph.initializer):
        return model
    copy = ModelProto()
    copy.CopyFrom(model)
    for index, tensor in enumerate(copy.graph.initializer):
        key = _key(tensor)
        if key is not None:
            with inline_tensors():
                copy.graph.initializer[index].CopyFrom(_lent(key, tensor).to_proto(tensor.name))
    return copy


def tensor_array(tensor: TensorProto) -> np.ndarray:
    """numpy_helper.to_array of `tensor`, a lent weight included."""
    key = _key(tensor)
    if key is None:
        return numpy_helper.to_array(tensor)
    return _lent(key, tensor).numpy()


def lent_tensor(tensor: TensorProto) -> Tensor | None:
    """The Tensor a lent weight's reference stands for, found in the blocks in force; None for
    any other tensor: graphopt's import then takes the lent tensor itself, no copy made."""
    key = _key(tensor)
    return None if key is None else _found(key)


def lend_external(model: ModelProto, path: str) -> None:
    """Within a `lending` block: the main graph's initializers that `model`, read from `path`
    without its external data, keeps in external files become lent weights, mapped from those
    files when a session or an import reads them; the caller loads the other tensors' data
    (`external_tensors` lists them). Locations are checked as graphopt's import checks them
    (InputError). Outside a block, nothing changes."""
    blocks = _LENT.get()
    if not blocks:
        return
    from graphopt.ir.onnx_io import checked_external

    read = _read_names(model)
    with tensor_references() as references:
        for index, tensor in enumerate(model.graph.initializer):
            if tensor.data_location != TensorProto.EXTERNAL or _key(tensor) is not None \
                    or tensor.name not in read:
                continue
            described = TensorProto()
            described.CopyFrom(tensor)  # the Tensor keeps it: the model's own is rewritten
            mapped = checked_external(described, path, f"initializer '{tensor.name}'")
            model.graph.initializer[index].CopyFrom(mapped.to_proto(tensor.name))
    blocks[-1].update(references)


def external_tensors(model: ModelProto) -> Iterator[TensorProto]:
    """The tensors of `model` that keep their data in an external file, lent ones aside: what
    onnx.external_data_helper.load_external_data_for_tensor loads."""
    for tensor in _all_tensors(model):
        if tensor.data_location == TensorProto.EXTERNAL and _key(tensor) is None:
            yield tensor


def _read_names(model: ModelProto) -> set[str]:
    """The names the main graph's initializers may go by where something reads them: any
    node's input (in nested graphs too, which read the main graph's by name) and the graph's
    inputs and outputs. onnxruntime drops an initializer outside these at load, and refuses
    an OrtValue handed in for it."""
    names = {v.name for v in (*model.graph.input, *model.graph.output)}
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            names.update(node.input)
            for attribute in node.attribute:
                if attribute.type == AttributeProto.GRAPH:
                    graphs.append(attribute.g)
                elif attribute.type == AttributeProto.GRAPHS:
                    graphs.extend(attribute.graphs)
    return names


def _all_tensors(model: ModelProto) -> Iterator[TensorProto]:
    """Every tensor of `model`, the main graph's initializers first."""
    yield from model.graph.initializer
    yield from _nested_tensors(model)


def _nested_tensors(model: ModelProto) -> Iterator[TensorProto]:
    """Every tensor of `model` but the main graph's initializers: attributes', and those of
    nested graphs and functions."""
    yield from node_tensors(model.graph.node)
    for function in model.functions:
        yield from node_tensors(function.node)


def is_lent(tensor: TensorProto) -> bool:
    """Whether `tensor` is a lent weight's reference, whose data `tensor_array` reads."""
    return _key(tensor) is not None


def _key(tensor: TensorProto) -> str | None:
    if tensor.data_location != TensorProto.EXTERNAL:
        return None
    for entry in tensor.external_data:
        if entry.key == "location" and entry.value.startswith(REFERENCE_PREFIX):
            return entry.value
    return None


def _inline_tensor(tensor: TensorProto, references: dict[str, Tensor]) -> None:
    key = _key(tensor)
    if key is not None:
        tensor.CopyFrom(references[key].to_proto(tensor.name or None))


def _ort_value(tensor: Tensor) -> ort.OrtValue:
    """An OrtValue over the tensor's data, no copy made (onnxruntime copies it at session
    creation); element types numpy lacks (bfloat16, float8) go as their bits."""
    array = np.ascontiguousarray(tensor.uncached_numpy())
    if array.dtype in _NUMPY_NATIVE:  # ml_dtypes' float8 types say kind "f" too
        return ort.OrtValue.ortvalue_from_numpy(array)
    bits = array.view(np.dtype(f"u{array.dtype.itemsize}"))
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, int(tensor.dtype))
