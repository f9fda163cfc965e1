"""A partition's external-data references read, checked and pointed into the artifact file on
the protobuf wire, as the runtime's load needs them: graphopt writes them on main-graph
initializers only, as location/offset/length. Anything else is left to om_weights' onnx-based
functions (`plain_references` returns None), which accept or refuse it as before."""

from __future__ import annotations

from typing import NamedTuple

from graphopt import protowire as wire
from graphopt.codegen.om_weights import LOCATION_KEY, check_reference


class Reference(NamedTuple):  # not a dataclass: its generated code costs ~1 ms at import
    """One main-graph initializer's external data, and where its bytes lie in the model."""

    tensor: str        # the initializer's name
    location: str      # a weights member, e.g. "weights/p0.bin"
    offset: int
    length: int
    field: tuple[int, int]  # where the initializer's field lies in the model bytes
    kept: tuple[tuple[int, int], ...]  # its TensorProto's fields but the reference's


def plain_references(model: bytes) -> list[Reference] | None:
    """The external references of `model`'s main-graph initializers, when those are all the
    model holds and each has graphopt's form (the keys location, offset and length, once each,
    numbers where numbers go); None otherwise.

    A reference anywhere must name its file under the key "location", and protobuf stores
    strings as they are: when the bytes hold no other "location" than the keys read here, the
    model holds no other reference (a node attribute's tensor, a subgraph's, a function's)."""
    expected = model.count(LOCATION_KEY)
    if expected == 0:
        return []
    try:
        graph = wire.graph_span(model)
        if graph is None:
            return None
        found = []
        for start, end, first, last in wire.submessages(model, wire.GRAPH_INITIALIZER,
                                                        graph[0], graph[1]):
            if model.find(LOCATION_KEY, start, end) < 0:
                continue  # its bytes are in the model, or it has no "location" to count
            reference = _reference(model, (first, last), (start, end))
            if reference is not None:
                found.append(reference)
    except (wire.WireError, _NotPlain):
        return None
    return found if len(found) == expected else None


class _NotPlain(Exception):
    """A reference of a form graphopt does not write: onnx's parse judges it."""


def _reference(model: bytes, field: tuple[int, int], payload: tuple[int, int]
               ) -> Reference | None:
    name, location_field, entries, kept = "", None, {}, []
    for number, kind, value, first, last in wire.fields(model, *payload):
        if number not in (wire.TENSOR_DATA_LOCATION, wire.TENSOR_EXTERNAL_DATA):
            kept.append((first, last))
        if number == wire.TENSOR_NAME and kind == wire.LEN:
            name = wire.text(model, value, last)
        elif number == wire.TENSOR_DATA_LOCATION and kind == wire.VARINT:
            location_field = value
        elif number == wire.TENSOR_EXTERNAL_DATA and kind == wire.LEN:
            key, text = _entry(model, value, last)
            if key in entries:
                raise _NotPlain
            entries[key] = text
        elif number in (wire.TENSOR_NAME, wire.TENSOR_DATA_LOCATION, wire.TENSOR_EXTERNAL_DATA):
            raise _NotPlain  # a field of the wrong wire type: onnx's parser will say what
    if not entries and location_field != wire.EXTERNAL:
        return None
    if location_field != wire.EXTERNAL or set(entries) != {"location", "offset", "length"}:
        raise _NotPlain
    try:
        offset, length = int(entries["offset"]), int(entries["length"])
    except ValueError:
        raise _NotPlain from None
    if LOCATION_KEY in entries["location"].encode():
        raise _NotPlain  # the count of "location" bytes would not tell references apart
    return Reference(name, entries["location"], offset, length, field, tuple(kept))


def _entry(model: bytes, start: int, end: int) -> tuple[str, str]:
    key = value = ""
    for number, kind, field_start, _, last in wire.fields(model, start, end):
        if kind != wire.LEN or number not in (wire.ENTRY_KEY, wire.ENTRY_VALUE):
            raise _NotPlain
        if number == wire.ENTRY_KEY:
            key = wire.text(model, field_start, last)
        else:
            value = wire.text(model, field_start, last)
    return key, value


def check(references: list[Reference], sizes: dict[str, int]) -> None:
    """BadReference unless every reference lies inside a weights member (`sizes`)."""
    for ref in references:
        check_reference(ref.tensor, ref.location, ref.offset, ref.length, sizes)


def repointed(model: bytes, references: list[Reference], file_name: str,
              data_offsets: dict[str, int]) -> bytes:
    """`model` with each reference naming `file_name` (the artifact, in its folder) at its file
    offset; `data_offsets` maps each weights member to where its bytes start in the file. Only
    the referencing initializers are re-encoded; every other byte is copied as it is."""
    if not references:
        return model
    graph_start, graph_end, field_start, field_end = wire.graph_span(model)
    graph = bytearray()
    at = graph_start
    for ref in sorted(references, key=lambda r: r.field):
        graph += model[at:ref.field[0]]
        graph += wire.len_field(wire.GRAPH_INITIALIZER,
                                _located_tensor(model, ref, file_name, data_offsets))
        at = ref.field[1]
    graph += model[at:graph_end]
    return b"".join((model[:field_start], wire.len_field(wire.MODEL_GRAPH, bytes(graph)),
                     model[field_end:]))


def _located_tensor(model: bytes, ref: Reference, file_name: str,
                    data_offsets: dict[str, int]) -> bytes:
    payload = bytearray()
    for first, last in ref.kept:
        payload += model[first:last]
    for key, value in (("location", file_name),
                       ("offset", str(data_offsets[ref.location] + ref.offset)),
                       ("length", str(ref.length))):
        entry = wire.len_field(wire.ENTRY_KEY, key.encode()) + \
            wire.len_field(wire.ENTRY_VALUE, value.encode())
        payload += wire.len_field(wire.TENSOR_EXTERNAL_DATA, entry)
    payload += wire.encode_varint(wire.TENSOR_DATA_LOCATION << 3 | wire.VARINT) + \
        wire.encode_varint(wire.EXTERNAL)
    return bytes(payload)
