"""The protobuf wire format of serialized ONNX, read without the onnx package (whose import
costs ~0.1 s per process): fields and varints, and the few fields the runtime reads at load
(main-graph initializers, node domains, initializer dims)."""

from __future__ import annotations

from collections.abc import Iterator

# Field numbers of onnx.proto3.
MODEL_GRAPH = 7
GRAPH_NODE, GRAPH_INITIALIZER = 1, 5
NODE_DOMAIN = 7
TENSOR_DIMS, TENSOR_NAME, TENSOR_RAW_DATA = 1, 8, 9
TENSOR_DOC_STRING, TENSOR_EXTERNAL_DATA, TENSOR_DATA_LOCATION = 12, 13, 14
ENTRY_KEY, ENTRY_VALUE = 1, 2
EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL

VARINT, I64, LEN, I32 = 0, 1, 2, 5


class WireError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


def varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at buf[pos] (before `end`), and the position after it."""
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise WireError("truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def fields(buf: bytes, start: int = 0, end: int | None = None
           ) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, value, field start, field end) of each field of the message in
    buf[start:end]; `value` is the integer of a varint, else where its bytes start (a LEN
    field's payload runs from `value` to `field end`)."""
    end = len(buf) if end is None else end
    pos = start
    while pos < end:
        first = pos
        key = buf[pos]  # one-byte keys and lengths, the common case, skip the general decoder
        if key < 0x80:
            pos += 1
        else:
            key, pos = varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == LEN:
            if pos >= end:
                raise WireError("truncated length")
            length = buf[pos]
            if length < 0x80:
                pos += 1
            else:
                length, pos = varint(buf, pos, end)
            value, pos = pos, pos + length
        elif wire == VARINT:
            value, pos = varint(buf, pos, end)
        elif wire == I64:
            value, pos = pos, pos + 8
        elif wire == I32:
            value, pos = pos, pos + 4
        else:  # groups (3, 4) and reserved types: not in onnx.proto
            raise WireError(f"unsupported wire type {wire}")
        if number == 0 or pos > end:
            raise WireError("field number 0 or a field past the end of its message")
        yield number, wire, value, first, pos


def submessages(buf: bytes, number: int, start: int = 0, end: int | None = None
                ) -> Iterator[tuple[int, int, int, int]]:
    """(payload start, payload end, field start, field end) of each LEN field `number`."""
    for field, wire, value, first, last in fields(buf, start, end):
        if field == number:
            if wire != LEN:
                raise WireError(f"field {number} is not length-delimited")
            yield value, last, first, last


_ONE_BYTE = tuple(bytes((value,)) for value in range(0x80))


def encode_varint(value: int) -> bytes:
    if 0 <= value < 0x80:  # keys and most lengths: the runtime encodes hundreds at a load
        return _ONE_BYTE[value]
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def len_field(number: int, payload: bytes) -> bytes:
    return encode_varint(number << 3 | LEN) + encode_varint(len(payload)) + payload


def text(buf: bytes, start: int, end: int) -> str:
    try:
        return buf[start:end].decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("a string field is not UTF-8") from None


def graph_span(model: bytes) -> tuple[int, int, int, int] | None:
    """Where the model's main graph lies (payload start and end, field start and end)."""
    found = None
    for span in submessages(model, MODEL_GRAPH):
        if found is not None:  # protobuf would merge repeated message fields: not graphopt's
            raise WireError("the model has its graph field twice")
        found = span
    return found


def node_domains(model: bytes) -> set[str]:
    """The domains of the main graph's nodes."""
    graph = graph_span(model)
    if graph is None:
        return set()
    domains = set()
    for node_start, node_end, _, _ in submessages(model, GRAPH_NODE, graph[0], graph[1]):
        domain = ""
        for start, end, _, _ in submessages(model, NODE_DOMAIN, node_start, node_end):
            domain = text(model, start, end)
        domains.add(domain)
    return domains


# An initializer of at least this many bytes is worth a look for its raw data (raw_data_spans).
LARGE_TENSOR_BYTES = 4096


def initializers_first(model: bytes) -> bytes:
    """`model` with its main-graph initializers at the head of the graph, those of
    LARGE_TENSOR_BYTES or more first: where raw_data_spans and a search for external
    references find them without walking the nodes. The same model to any protobuf reader
    (different fields may come in any order, and the other fields keep theirs); the bytes as
    they are when nothing moves."""
    graph = graph_span(model)
    if graph is None:
        return model
    start, end, field_start, field_end = graph
    large, small, rest = [], [], []
    for number, wire, value, first, last in fields(model, start, end):
        if number == GRAPH_INITIALIZER and wire == LEN:
            (large if last - value >= LARGE_TENSOR_BYTES else small).append(model[first:last])
        else:
            rest.append(model[first:last])
    payload = b"".join(large + small + rest)
    if payload == model[start:end]:
        return model
    return b"".join((model[:field_start], len_field(MODEL_GRAPH, payload), model[field_end:]))


def leading_initializers(model: bytes, start: int, end: int
                         ) -> Iterator[tuple[int, int, int, int]]:
    """(payload start, payload end, field start, field end) of the initializers at the head of
    the graph whose payload is model[start:end], up to its first other field."""
    for number, wire, value, first, last in fields(model, start, end):
        if number != GRAPH_INITIALIZER or wire != LEN:
            return
        yield value, last, first, last


def raw_data_spans(model: bytes, graph: tuple[int, int, int, int] | None = None
                   ) -> list[tuple[int, int]]:
    """Where the raw data of the large initializers at the head of the main graph (whose span
    graph_span gives, found here when not passed) lies, the form initializers_first writes:
    bytes that are tensor contents and nothing else, which a search for a key can skip. The
    walk stops at the first other field, so it costs nothing on a graph whose nodes come
    first."""
    graph = graph or graph_span(model)
    if graph is None:
        return []
    spans = []
    for start, end, _, _ in leading_initializers(model, graph[0], graph[1]):
        if end - start < LARGE_TENSOR_BYTES:
            break
        spans.extend((first, last) for field, kind, first, _, last in fields(model, start, end)
                     if field == TENSOR_RAW_DATA and kind == LEN)
    return spans


def initializer_dims(model: bytes) -> list[list[int]]:
    """The dims of each main-graph initializer."""
    graph = graph_span(model)
    if graph is None:
        return []
    shapes = []
    for start, end, _, _ in submessages(model, GRAPH_INITIALIZER, graph[0], graph[1]):
        dims: list[int] = []
        for number, wire, value, _, last in fields(model, start, end):
            if number != TENSOR_DIMS:
                continue
            if wire == VARINT:
                dims.append(value)
            elif wire == LEN:  # packed
                pos = value
                while pos < last:
                    dim, pos = varint(model, pos, last)
                    dims.append(dim)
        shapes.append(dims)
    return shapes
