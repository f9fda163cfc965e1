"""Saving ONNX files whose large weights live in `<file>.data` next to them, streamed from the
IR, so a model past protobuf's 2 GB limit can be written without a second copy in memory."""

from __future__ import annotations

import os

from onnx import ModelProto, TensorProto

from graphopt.atomic import (atomic_files, atomic_write, atomic_write_bytes, destination,
                             is_special_file)
from graphopt.errors import GraphoptError, OptionError
from graphopt.ir.model import Model
from graphopt.ir.tensor import Tensor, retain_before_replacing, tensor_references
from graphopt.protowire import (GRAPH_INITIALIZER, LEN, MODEL_GRAPH, TENSOR_RAW_DATA,
                                encode_varint, graph_span)

THRESHOLD_ENV = "GRAPHOPT_EXTERNAL_DATA_THRESHOLD"
# Weights past this many bytes in all go to external data: well under protobuf's 2 GiB hard
# limit, leaving room for the graph itself and for whatever reads the file.
DEFAULT_THRESHOLD = 1 << 30
PAGE = 4096               # tensors of 1 MiB and up start on a page: onnxruntime can map them
SMALL_ALIGNMENT = 64


def threshold() -> int:
    """The weight bytes above which `save_onnx` writes external data: $GRAPHOPT_EXTERNAL_DATA_
    THRESHOLD (bytes) when set, else 1 GiB."""
    text = os.environ.get(THRESHOLD_ENV)
    if text is None or text == "":
        return DEFAULT_THRESHOLD
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise OptionError(f"{THRESHOLD_ENV}={text!r}: expected a number of bytes ≥ 0")
    return value


def weight_bytes(model: Model) -> int:
    """Bytes of the main graph's initializers."""
    return sum(v.const.nbytes for v in model.graph.initializers.values() if v.const is not None)


def save_onnx(model: Model | ModelProto, path: str | os.PathLike,
              external: bool | None = None, value_infos=True) -> None:
    """Write `model` to `path` atomically. With external data (`external=True`, or None and
    the weights past `threshold()`), every main-graph initializer of 1 KiB or more goes to
    `<path>.data` (its location is that file's name, so the pair moves together) and streams
    there tensor by tensor; the two files are replaced together (graphopt.atomic.atomic_files).
    `value_infos` is to_onnx's, for a graphopt Model."""
    path = os.fspath(path)
    if isinstance(model, ModelProto):
        if external is False or (external is None and model.ByteSize() <= threshold()):
            _write_proto(model, path)
            return
        from graphopt.ir.onnx_io import (
            load_onnx,  # keeps the proto's tensors, copies no data
        )

        model = load_onnx(model, user_model=False)
    from graphopt.ir.onnx_export import to_onnx

    if external is None:
        external = weight_bytes(model) > threshold()
    if not external:
        _write_inline(model, path, value_infos)
        return
    if is_special_file(destination(path)):
        raise OptionError(f"{path}: external data needs a file beside the model, and this is "
                          "a pipe or device; write the model to a file")
    # Named after `path` as given, beside it: through a link the model is written to the link's
    # target (graphopt.atomic) and the data beside the link, where onnx.save puts it and where
    # onnxruntime looks when the model is opened by the link's name.
    data_path = path + ".data"
    with tensor_references() as sources:
        proto = to_onnx(model, value_infos=value_infos)
        placed = _place(proto, os.path.basename(data_path), sources)
    _check_no_other_models_data(path, data_path, sources.values())
    serialized = _serialize(proto, path)
    placed_ids = {id(tensor) for _, tensor in placed}
    moved = [(offset, tensor) for offset, tensor in placed
             if tensor.streamable and tensor.reads(data_path)]
    for tensor in sources.values():
        if id(tensor) not in placed_ids and tensor.reads(data_path):
            tensor.numpy()  # inlined (a subgraph's): mapped before its file is replaced
    if moved:  # other tensors of the model (a partition's, say) may still read the old bytes
        retain_before_replacing(data_path)
    # Both files are replaced together or not at all: a model next to the other save's data
    # would load and compute with the wrong weights.
    with atomic_files([data_path, path]) as (data_file, model_file):
        for offset, tensor in placed:
            data_file.write(b"\0" * (offset - data_file.tell()))
            for chunk in tensor.iter_bytes():
                data_file.write(chunk)
        model_file.write(serialized)
    # A save over the file the model's own weights are read from (in place, -o = the input)
    # replaced it: those weights are now at their new offsets in the new file.
    for offset, tensor in moved:
        tensor.follow_move(data_path, offset)


def _check_no_other_models_data(path: str, data_path: str, tensors) -> None:
    """OptionError when the save would replace the data file of a model other than the one at
    `path` (in.onnx keeping its weights in out.onnx.data, say): this compile would still run,
    from the old file's mapped pages, but that model would no longer load. A save over the
    model's own files (-o = the input) is fine: model and data are replaced together."""
    for tensor in tensors:
        owner = tensor.source_model
        if owner is None or not tensor.reads(data_path):
            continue
        if os.path.realpath(owner) != os.path.realpath(path):
            raise OptionError(f"{path}: saving here replaces {data_path}, which holds the "
                              f"weights of {owner} (that model would no longer load); write "
                              "the output elsewhere")


def _place(proto: ModelProto, location: str, sources: dict[str, Tensor]
           ) -> list[tuple[int, Tensor]]:
    """Point the main graph's referenced initializers at `location` (offsets in order, aligned)
    and read every other reference back inline; returns (offset, tensor) in file order."""
    placed, end = [], 0
    for tensor in proto.graph.initializer:
        source = _source(tensor, sources)
        if source is None:
            continue
        alignment = PAGE if source.nbytes >= 1 << 20 else SMALL_ALIGNMENT
        offset = end + (-end % alignment)
        del tensor.external_data[:]
        for key, value in (("location", location), ("offset", str(offset)),
                           ("length", str(source.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        placed.append((offset, source))
        end = offset + source.nbytes
    # Subgraph initializers and tensor attributes stay inline: not every runtime resolves
    # external data there.
    _inline_nested(proto, sources)
    return placed


def _source(tensor: TensorProto, sources: dict[str, Tensor]) -> Tensor | None:
    if tensor.data_location != TensorProto.EXTERNAL:
        return None
    location = next((e.value for e in tensor.external_data if e.key == "location"), None)
    return sources.get(location)


def tensor_protos(proto: ModelProto, main_initializers: bool = True):
    """Every TensorProto of the model: every graph's tensor attributes, the subgraphs'
    initializers, and the main graph's unless `main_initializers` is False."""
    graphs = [proto.graph]
    while graphs:
        graph = graphs.pop()
        if main_initializers or graph is not proto.graph:
            yield from graph.initializer
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                if attr.HasField("g"):
                    graphs.append(attr.g)
                graphs.extend(attr.graphs)


def _nested_tensors(proto: ModelProto):
    return tensor_protos(proto, main_initializers=False)


def _serialize(proto: ModelProto, path: str) -> bytes:
    try:
        return proto.SerializeToString()
    except ValueError as e:  # protobuf refuses messages past 2 GB
        raise GraphoptError(f"{path}: model too large to serialize ({e}); its weights may be "
                            "in external data: save(…, external_data=True)") from None


def _write_inline(model: Model, path: str, value_infos=True) -> None:
    """Write the model with its weights inline, one weight in memory at a time: the model is
    serialized without the main graph's initializers, and they stream into its graph field
    after the other fields (protobuf reads fields in any order), each as its description then
    its raw_data. Serializing the whole ModelProto had held every weight twice more, besides
    the IR's own copy (1.2 GB for BERT-base's 0.4 GB)."""
    from graphopt.ir.onnx_export import to_onnx

    with tensor_references() as sources:
        proto = to_onnx(model, value_infos=value_infos)  # weights as references, not copies
        _inline_nested(proto, sources)
        weights = []  # (serialized description or whole small tensor, streamed source)
        for tensor in proto.graph.initializer:
            source = _source(tensor, sources)
            described = source.described(tensor.name) if source is not None else tensor
            weights.append((described.SerializeToString(), source))
        del proto.graph.initializer[:]
    head = _serialize(proto, path)
    graph = graph_span(head)
    if graph is None:  # a graph of nothing at all: no weights either
        atomic_write_bytes(path, head)
        return
    start, end, field_start, field_end = graph
    messages = [len(meta) + (0 if source is None else
                             len(_raw_header(source.nbytes)) + source.nbytes)
                for meta, source in weights]
    graph_size = end - start + sum(len(_field_header(GRAPH_INITIALIZER, n)) + n
                                   for n in messages)
    if len(head) - (field_end - field_start) + len(_field_header(MODEL_GRAPH, graph_size)) \
            + graph_size >= 1 << 31:
        raise GraphoptError(f"{path}: model too large to serialize (past 2 GB); its weights "
                            "may be in external data: save(…, external_data=True)")
    with atomic_write(path) as out:
        out.write(head[:field_start])
        out.write(_field_header(MODEL_GRAPH, graph_size))
        out.write(head[start:end])
        for (meta, source), size in zip(weights, messages):
            out.write(_field_header(GRAPH_INITIALIZER, size))
            out.write(meta)
            if source is not None:
                out.write(_raw_header(source.nbytes))
                for chunk in source.iter_bytes():
                    out.write(chunk)
        out.write(head[field_end:])


def _field_header(number: int, size: int) -> bytes:
    return encode_varint(number << 3 | LEN) + encode_varint(size)


def _raw_header(size: int) -> bytes:
    return _field_header(TENSOR_RAW_DATA, size)


def _inline_nested(proto: ModelProto, sources: dict[str, Tensor]) -> None:
    """Read the referenced tensors of subgraphs and attributes back inline."""
    for tensor in _nested_tensors(proto):
        source = _source(tensor, sources)
        if source is not None:
            del tensor.external_data[:]
            tensor.data_location = TensorProto.DEFAULT
            tensor.raw_data = b"".join(bytes(c) for c in source.iter_bytes())


def _write_proto(proto: ModelProto, path: str) -> None:
    atomic_write_bytes(path, _serialize(proto, path))
