"""A partition's external-data references read, checked and pointed into the artifact file on
the protobuf wire, as the runtime's load needs them: graphopt writes them on main-graph
initializers only, as location/offset/length. Anything else is left to om_weights' onnx-based
functions (`plain_references` returns None), which accept or refuse it as before."""

from __future__ import annotations

import re
from collections.abc import Iterable
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
    model holds no other reference (a node attribute's tensor, a subgraph's, a function's).
    The raw data of the large initializers at the head of the graph (where graphopt's writer
    puts them) is skipped: it holds tensor contents only, and is most of a small model's bytes."""
    try:
        graph = wire.graph_span(model)
        expected = _key_count(model, graph)
        if expected == 0:
            return []
        if graph is None:
            return None
        # Where graphopt's writer puts them: the initializers at the head of the graph.
        found = _references(model, wire.leading_initializers(model, graph[0], graph[1]))
        if len(found) != expected:  # then every initializer, wherever it is
            found = _references(model, wire.submessages(model, wire.GRAPH_INITIALIZER,
                                                         graph[0], graph[1]))
    except (wire.WireError, _NotPlain):
        return None
    return found if len(found) == expected else None


def _references(model: bytes, initializers: Iterable[tuple[int, int, int, int]]
                ) -> list[Reference]:
    found = []
    for start, end, first, last in initializers:
        if model.find(LOCATION_KEY, start, end) < 0:
            continue  # its bytes are in the model, or it has no "location" to count
        reference = _reference(model, (first, last), (start, end))
        if reference is not None:
            found.append(reference)
    return found


def _key_count(model: bytes, graph: tuple[int, int, int, int] | None) -> int:
    """How often LOCATION_KEY occurs in `model` outside the raw data protowire.raw_data_spans
    finds in its main graph (`graph`, its span)."""
    count, at = 0, 0
    for start, end in wire.raw_data_spans(model, graph) if graph is not None else ():
        count += model.count(LOCATION_KEY, at, start)
        at = end
    return count + model.count(LOCATION_KEY, at)


class _NotPlain(Exception):
    """A reference of a form graphopt does not write: onnx's parse judges it."""


# An external TensorProto as protobuf writes graphopt's: dims (field 1, varints) and data type
# (field 2), then the tag of its name (field 8); after the name, a doc_string (field 12) may
# come, then the external_data entries (field 13) location, offset and length, and
# data_location EXTERNAL (field 14). _written_form reads it with every length one byte.
_HEAD = re.compile(rb"(?:\x08[\x80-\xff]{0,9}[\x00-\x7f])*(?:\x10[\x00-\x7f])?\x42", re.DOTALL)
_LOCATION_ENTRY = b"\x0a\x08location\x12"  # an entry's key field, and the tag of its value
_NUMBERS = re.compile(rb"\x6a(.)\x0a\x06offset\x12(.)([0-9]{1,19})"
                      rb"\x6a(.)\x0a\x06length\x12(.)([0-9]{1,19})\x70\x01", re.DOTALL)
_DOC_STRING_TAG = wire.TENSOR_DOC_STRING << 3 | wire.LEN
_EXTERNAL_DATA_TAG = wire.TENSOR_EXTERNAL_DATA << 3 | wire.LEN


def _reference(model: bytes, field: tuple[int, int], payload: tuple[int, int]
               ) -> Reference | None:
    return _written_form(model, field, payload) or _any_form(model, field, payload)


def _written_form(model: bytes, field: tuple[int, int], payload: tuple[int, int]
                  ) -> Reference | None:
    """The reference of a tensor in the form the comment above _HEAD describes, read in a few
    steps instead of a walk of its fields (a load reads one per weight; walked, each costs
    ~25 µs); None for anything else, which _any_form reads."""
    start, end = payload
    head = _HEAD.match(model, start, end)
    if head is None:
        return None
    at = head.end()
    name_start = at + 1
    at = name_end = name_start + model[at] if at < end and model[at] < 0x80 else end
    if at + 2 <= end and model[at] == _DOC_STRING_TAG and model[at + 1] < 0x80:
        at += 2 + model[at + 1]
    kept_end = at
    if at + 14 > end or model[at] != _EXTERNAL_DATA_TAG \
            or model[at + 2:at + 13] != _LOCATION_ENTRY or model[at + 13] >= 0x80 \
            or model[at + 1] != 12 + model[at + 13]:
        return None
    location = model[at + 14:at + 14 + model[at + 13]]
    numbers = _NUMBERS.fullmatch(model, at + 14 + len(location), end)
    if numbers is None or LOCATION_KEY in location:
        return None
    offset_entry, offset_length, offset, length_entry, length_length, length = numbers.groups()
    if not (offset_length[0] == len(offset) and offset_entry[0] == 10 + len(offset)
            and length_length[0] == len(length) and length_entry[0] == 10 + len(length)):
        return None
    return Reference(wire.text(model, name_start, name_end), wire.text(location, 0, len(location)),
                     int(offset), int(length), field, ((start, kept_end),))


def _any_form(model: bytes, field: tuple[int, int], payload: tuple[int, int]
              ) -> Reference | None:
    name, location_field, entries, kept = "", None, {}, []
    for number, kind, value, first, last in wire.fields(model, *payload):
        if number not in (wire.TENSOR_DATA_LOCATION, wire.TENSOR_EXTERNAL_DATA):
            if kept and kept[-1][1] == first:  # one span for fields that follow each other
                kept[-1] = (kept[-1][0], last)
            else:
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


_DATA_LOCATION_TAG = wire.TENSOR_DATA_LOCATION << 3 | wire.VARINT
_EXTERNAL_LOCATION = bytes((_DATA_LOCATION_TAG, wire.EXTERNAL))
_KEY_TAG = wire.ENTRY_KEY << 3 | wire.LEN
_VALUE_TAG = wire.ENTRY_VALUE << 3 | wire.LEN


def _entry(model: bytes, start: int, end: int) -> tuple[str, str]:
    # Graphopt's form first, read in place: a key field then a value field, each shorter than
    # 128 bytes (one-byte lengths). A load reads three entries per weight.
    if end - start >= 4 and model[start] == _KEY_TAG and model[start + 1] < 0x80:
        key_end = start + 2 + model[start + 1]
        if key_end + 2 <= end and model[key_end] == _VALUE_TAG and model[key_end + 1] < 0x80 \
                and key_end + 2 + model[key_end + 1] == end:
            return wire.text(model, start + 2, key_end), wire.text(model, key_end + 2, end)
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
    location = _entry_field(b"location", file_name.encode())  # the same for every reference
    pieces = []
    at = graph_start
    for ref in sorted(references, key=lambda r: r.field):
        pieces.append(model[at:ref.field[0]])
        tensor = b"".join([*(model[first:last] for first, last in ref.kept), location,
                           _entry_field(b"offset", b"%d" % (data_offsets[ref.location] + ref.offset)),
                           _entry_field(b"length", b"%d" % ref.length), _EXTERNAL_LOCATION])
        pieces += (_INITIALIZER_TAG, wire.encode_varint(len(tensor)), tensor)
        at = ref.field[1]
    pieces.append(model[at:graph_end])
    graph = b"".join(pieces)
    return b"".join((model[:field_start], wire.len_field(wire.MODEL_GRAPH, graph),
                     model[field_end:]))


_INITIALIZER_TAG = wire.encode_varint(wire.GRAPH_INITIALIZER << 3 | wire.LEN)


def _entry_field(key: bytes, value: bytes) -> bytes:
    """A TensorProto's external_data field holding one key and its value."""
    if len(key) + len(value) < 0x7c:  # every length one byte: a reference's numbers
        return b"j%c\n%c%s\x12%c%s" % (len(key) + len(value) + 4, len(key), key, len(value), value)
    return wire.len_field(wire.TENSOR_EXTERNAL_DATA, wire.len_field(wire.ENTRY_KEY, key)
                          + wire.len_field(wire.ENTRY_VALUE, value))
