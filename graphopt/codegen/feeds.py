"""Feeds for an artifact's signature: seeded random inputs, checks against it, and .npz files;
sequences, maps and optionals as well as tensors."""

from __future__ import annotations

import math
import os
import zipfile
import zlib
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from graphopt.codegen.om_manifest import dtype_from_name, dtype_name
from graphopt.codegen.plain_feeds import only_str
from graphopt.errors import GraphoptError, InputError
from graphopt.input_files import refuse_device

if TYPE_CHECKING:  # imported where a proto is read: checking feeds needs no onnx import
    import onnx

# How many elements a random sequence gets: more than one, so that code meeting only the first
# element is still exercised.
RANDOM_SEQUENCE_LENGTH = 2


def numpy_dtype(dtype: str | None) -> np.dtype | None:
    """The numpy dtype of a manifest dtype name (bfloat16 and float8 through ml_dtypes); None
    when there is none."""
    if dtype is None:
        return None
    if dtype in _NUMPY_NAMED:
        return np.dtype(dtype)
    if dtype == "string":
        return np.dtype(object)  # as onnxruntime returns strings (and as onnx.helper maps them)
    from onnx import helper  # ml_dtypes' types, and those numpy has none for

    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(dtype_from_name(dtype)))
    except (KeyError, TypeError, ValueError):
        return None


# Manifest dtype names that are numpy's own names for the same type.
_NUMPY_NAMED = frozenset({"float32", "float64", "float16", "int8", "int16", "int32", "int64",
                          "uint8", "uint16", "uint32", "uint64", "bool", "complex64",
                          "complex128"})


def describe(entry: Mapping) -> str:
    """A signature entry as `float32[N,4]` (`?` for an unknown dtype or dim, `float32[?]` being
    of rank 1), `float32 of any shape` for an unknown rank, or the type of a value that is not a
    tensor (`seq(float32)`)."""
    if entry.get("type"):
        return entry["type"]
    shape = entry["shape"]
    if shape is None:
        return f"{entry['dtype'] or '?'} of any shape"
    return f"{entry['dtype'] or '?'}[{','.join('?' if d is None else str(d) for d in shape)}]"


def random_feeds(signature: list[Mapping], seed: int = 0,
                 images: Collection[str] = ()) -> dict[str, Any]:
    """Seeded arrays for a signature, drawn as numerics.random_feeds draws them: normal floats,
    integers in {0, 1} (safe as indices into any non-empty axis), random booleans; the inputs
    `images` names (those --insert-op-conf made) every pixel value 0-255. A sequence of
    tensors gets RANDOM_SEQUENCE_LENGTH of them, an optional tensor a present one.

    Raises InputError naming the input and dim when a shape is not fully static or a dtype has
    no numpy equivalent: there is no size to invent that the model would accept.
    """
    rng = np.random.default_rng(seed)
    return {entry["name"]: random_value(entry, rng, entry["name"] in images)
            for entry in signature}


def random_value(entry: Mapping, rng: np.random.Generator, pixels: bool = False) -> Any:
    """A random feed for one signature entry (see random_feeds)."""
    if not entry.get("type"):
        return _random_tensor(entry, rng, pixels)
    kind, element = parse_type(entry["type"]), entry.get("element")
    if kind[0] not in ("seq", "optional") or kind[1][0] != "tensor" or element is None:
        raise InputError(f"input {entry['name']!r} is {_a(entry['type'])}, so random data cannot "
                         "be made for it")
    element = {"name": entry["name"], **element}
    if element["shape"] is None or not all(isinstance(d, int) for d in element["shape"]):
        held = "its elements have" if kind[0] == "seq" else "the tensor it holds has"
        raise InputError(f"input {entry['name']!r} is {_a(entry['type'])} and {held} no static "
                         f"shape ({describe(element)}), so random data cannot be made for it")
    if kind[0] == "optional":
        return _random_tensor(element, rng)
    return [_random_tensor(element, rng) for _ in range(RANDOM_SEQUENCE_LENGTH)]


def _a(label: str) -> str:
    """A type label with its article: "a seq(float32)", "an optional(float32)"."""
    return f"{'an' if label[:1] in 'aeiou' else 'a'} {label}"


def _random_tensor(entry: Mapping, rng: np.random.Generator, pixels: bool = False) -> np.ndarray:
    name, shape = entry["name"], entry["shape"]
    if shape is None:
        raise InputError(f"input {name!r} has an unknown rank, so random data cannot be made for it")
    for axis, dim in enumerate(shape):
        if not isinstance(dim, int):
            what = f"'{dim}'" if isinstance(dim, str) else "unknown"
            raise InputError(f"input {name!r} ({describe(entry)}) has a dynamic dim {axis} ({what}), "
                             "so random data cannot be made for it")
    dtype = np.dtype(object) if entry["dtype"] == "string" else numpy_dtype(entry["dtype"])
    if dtype is None:
        raise InputError(f"input {name!r} has dtype {entry['dtype'] or 'unknown'}, for which "
                         "numpy has no type to make random data with")
    return random_array(name, shape, dtype, rng, pixels)


# More than a random input may take: the draw is made in float64 (16 bytes per complex
# element) before the cast, and a typo'd --input-shape should not exhaust the machine.
RANDOM_INPUT_BYTES = 4 << 30
# numpy's limit on an array's dims (NPY_MAXDIMS): ONNX allows more.
NUMPY_MAX_RANK = 64


class BeyondNumpy(InputError):
    """An input of more dims than numpy arrays have: no data for it from Python at all."""


def random_array(name: str, shape: list[int], dtype: np.dtype,
                 rng: np.random.Generator, pixels: bool = False) -> np.ndarray:
    """Seeded data for input `name`: normal floats, 0/1 integers (safe as indices into any
    non-empty axis), random booleans, "a" strings; InputError when it would be too large.
    `pixels`: integers of every value 0-255 (an image --insert-op-conf's preprocessing takes:
    0/1 images hid errors only brighter pixels show)."""
    if len(shape) > NUMPY_MAX_RANK:
        raise BeyondNumpy(f"input {name!r} has rank {len(shape)}: numpy arrays have at most "
                         f"{NUMPY_MAX_RANK} dims, so no data can be made for it, read from an "
                         ".npz or fed from Python (onnxruntime's Python API takes numpy arrays)")
    count = math.prod(shape)
    if count * 16 > RANDOM_INPUT_BYTES:
        raise InputError(f"input {name!r} of shape {list(shape)} is too large for random data "
                         f"({count * np.dtype(dtype).itemsize / 2**30:.3g} GiB); give inputs or "
                         "a smaller shape")
    if dtype == object:
        return np.full(shape, "a", dtype=object)
    if dtype == np.bool_:
        data = rng.random(shape) < 0.5
    elif np.issubdtype(dtype, np.integer):
        data = rng.integers(0, 256 if pixels else 2, size=shape)
    elif np.issubdtype(dtype, np.complexfloating):
        data = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    else:
        data = rng.standard_normal(shape)
    # np.asarray: a 0-d draw comes back as a numpy scalar, which onnxruntime refuses.
    return np.asarray(data).astype(dtype)


def check_feeds(signature: list[Mapping], feeds: Mapping[str, Any],
                fixed: Collection[str] = ()) -> None:
    """Raise InputError on the first feed that does not fit the signature: a missing or unknown
    name, a wrong dtype, rank or static dim, a symbolic dim two inputs give different sizes,
    or a value of the wrong kind (an array for a sequence). (OmSession.run checks the same on
    every call; this lets a caller report a bad file before it times anything.) `fixed`: the
    source's inputs the artifact fixed (extra_fixed_inputs), named as such when fed."""
    expected = {entry["name"]: entry for entry in signature}
    for name in feeds:
        if name not in expected:
            raise unknown_input(name, expected, fixed)
    for name, entry in expected.items():
        if name not in feeds:
            if is_optional(entry):  # left out is empty, as onnxruntime takes it
                continue
            raise InputError(f"missing input {name!r} ({describe(entry)})")
        if entry.get("type"):
            fitted_value(entry, feeds[name])
        else:
            _check_tensor(entry, as_array(name, feeds[name], numpy_dtype(entry["dtype"])))
    clash = shared_dim_clash(shared_dims(signature),
                             {name: shape for name in expected if name in feeds
                              for shape in [fed_shape(expected[name], feeds[name])]
                              if shape is not None})
    if clash:
        raise InputError(clash)


def is_optional(entry: Mapping) -> bool:
    """Whether a signature entry is an optional value, which a caller may leave out."""
    return str(entry.get("type") or "").startswith("optional(")


def fed_shape(entry: Mapping, value: Any) -> tuple | None:
    """The shape a feed gives the dims `entry` names (see shared_dims): a tensor's own, that of
    the tensor an optional holds; None for an empty optional, a sequence or a map."""
    if not entry.get("type"):
        return np.shape(value)
    return np.shape(value) if value is not None and _named_shape(entry) is not None else None


def _named_shape(entry: Mapping) -> list | None:
    """The shape whose dims an input names: a tensor's, or that of the tensor an optional
    holds (a sequence's elements may differ from each other)."""
    if not entry.get("type"):
        return entry.get("shape")
    if is_optional(entry) and "element" in entry:
        return entry["element"].get("shape")
    return None


def shared_dims(signature: list[Mapping]) -> dict[str, list[tuple[str, int]]]:
    """Each symbolic dim that several input axes name alike, with those (input, axis) pairs:
    ONNX means one size by one name, and a compile may rely on it (a fusion that reads the
    sequence length of one input for another's)."""
    uses: dict[str, list[tuple[str, int]]] = {}
    for entry in signature:
        for axis, dim in enumerate(_named_shape(entry) or ()):
            if isinstance(dim, str) and dim:
                uses.setdefault(dim, []).append((entry["name"], axis))
    return {dim: places for dim, places in uses.items() if len(places) > 1}


def shared_dim_clash(shared: Mapping[str, list[tuple[str, int]]],
                     shapes: Mapping[str, tuple]) -> str | None:
    """The first dim of `shared` (shared_dims) that the feeds' `shapes` give two sizes, said
    as an error message; None when they agree."""
    for dim, places in shared.items():
        first = None
        for name, axis in places:
            shape = shapes.get(name)
            if shape is None or axis >= len(shape):
                continue
            if first is None:
                first = (name, axis, shape[axis])
            elif shape[axis] != first[2]:
                return (f"input {name!r} has shape {list(shape)}: its dim {axis} is {dim!r}, "
                        f"which input {first[0]!r} gives as {first[2]} (its dim {first[1]}); "
                        f"inputs that name a dim alike must agree on its size")
    return None


def unknown_input(name: str, expected: Collection[str], fixed: Collection[str]) -> InputError:
    """The error for a feed of a name the artifact does not take; `fixed` as check_feeds'."""
    inputs = ", ".join(expected) or "(none)"
    if name in fixed:
        return InputError(f"input {name!r} is an initializer the source model lets a caller "
                          "override, which the .om fixed at its value when it was compiled (as "
                          f"ATC fixes weights); it takes no such feed. Its inputs are: {inputs}")
    return InputError(f"unknown input {name!r}; the model's inputs are: {inputs}")


def as_array(name: str, value: Any, dtype: np.dtype | None = None,
             where: str | None = None) -> np.ndarray:
    """`value` as an array; InputError naming the input when numpy cannot make one (a list of
    arrays of different shapes, say). A list, tuple or scalar becomes an array of the input's
    declared `dtype`, as onnxruntime makes one of it, where numpy's own reading of the values
    casts to it within its kind and range (Python floats to float32, ints to int32; not floats
    to ints, nor 300 to uint8), and an empty one always; anything else keeps numpy's dtype for
    the checks to refuse. `where` names the value in errors (default: input `name`)."""
    if isinstance(value, np.ndarray):
        return value
    where = where or f"input {name!r}"
    if value is None:  # numpy makes an object array of it, which read as a dtype mismatch
        raise InputError(f"{where} is None; it takes a tensor")
    try:
        # A string input's list stays objects: numpy reads a (str, Enum) member as the
        # first characters of its str(), 'Colo' for Color.RED.
        array = np.asarray(value, dtype=object if dtype == np.dtype(object) else None)
    except ValueError:
        raise InputError(f"{where} takes a tensor, not {_what(value)}") from None
    if array.size == 0 and dtype is not None:  # no values to lose: numpy's float64 is a guess
        return array.astype(dtype)
    # Only between numpy's own numbers: ml_dtypes' types (kind V) have no range to check.
    if dtype is None or array.dtype == dtype or not {array.dtype.kind, dtype.kind} <= set("biuf"):
        return array
    integers = array.dtype.kind in "iu" and dtype.kind in "iu"  # signs differ, values may not
    castable = integers or np.can_cast(array.dtype, dtype, "same_kind")
    cast = _lossless_cast(array, dtype) if castable else None
    if cast is None:
        raise InputError(f"{where} was given as {_what(value)} that numpy reads as "
                         f"{array.dtype}, which does not cast to {dtype} without loss; pass an "
                         f"array of {dtype}")
    return cast


def _lossless_cast(array: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    """`array` as `dtype` when every value survives: integers in range, no finite value made
    infinite (70000 in float16), no integer rounded (16777217 in float32); None otherwise.
    Rounding a float to a narrower float (0.1 to float32) is what a float input means."""
    if dtype.kind in "iu" and array.size:
        limits = np.iinfo(dtype)
        if not (limits.min <= array.min() and array.max() <= limits.max):
            return None
    with np.errstate(over="ignore", invalid="ignore"):
        cast = array.astype(dtype)
    if dtype.kind == "f" and (np.isinf(cast) & np.isfinite(array)).any():
        return None
    if dtype.kind == "f" and array.dtype.kind in "iu" and \
            not np.array_equal(cast.astype(array.dtype), array):
        return None
    return cast


def strings_for_onnxruntime(array: np.ndarray) -> np.ndarray:
    """A str array (numpy's fixed-width `<U`, as a list of str or an .npz gives) as an object
    array: onnxruntime reads a `<U` element only up to its first NUL character, so "a\x00b"
    would reach the model as "a". An object array's str subclasses become the str they hold:
    onnxruntime takes each element's str(), which for a `(str, Enum)` member is 'Color.RED',
    not 'red' (check_strings has refused any element that is no str)."""
    if array.dtype.kind == "U":
        return array.astype(object)
    if array.dtype.kind == "O" and not only_str(array):
        plain = np.empty(array.shape, dtype=object)
        plain.flat[:] = [str.__str__(item) for item in array.flat]
        return plain
    return array


def _check_tensor(entry: Mapping, array: np.ndarray, where: str | None = None) -> None:
    where = where or f"input {entry['name']!r}"
    dtype = numpy_dtype(entry["dtype"])
    if entry["dtype"] == "string":
        ok = array.dtype.kind in "OU"
        check_strings(array, where)
    else:
        ok = dtype is None or array.dtype == dtype or same_bits(array, dtype)
    if not ok:
        raise dtype_mismatch(where, array, dtype, entry)
    shape = entry["shape"]
    if shape is None:
        return
    if array.ndim != len(shape):
        raise InputError(f"{where} has shape {list(array.shape)} (rank {array.ndim}), "
                         f"expected {describe(entry)}")
    for axis, (got, want) in enumerate(zip(array.shape, shape)):
        if isinstance(want, int) and got != want:
            raise InputError(f"{where} has shape {list(array.shape)}, expected "
                             f"{describe(entry)} (dim {axis} must be {want})")


def dtype_mismatch(where: str, array: np.ndarray, dtype: np.dtype | None,
                   entry: Mapping) -> InputError:
    """The error for a feed of the wrong dtype; one that differs only in byte order says so
    (an array read from a big-endian file prints as >f4, which a float32 input does not name)."""
    swapped = dtype is not None and array.dtype.byteorder not in "=|" \
        and array.dtype.newbyteorder("=") == dtype
    hint = f" (its bytes are big-endian: pass array.astype({dtype.str!r}))" if swapped else ""
    return InputError(f"{where} has dtype {array.dtype}{hint}, expected {describe(entry)}")


def check_strings(array: np.ndarray, where: str) -> None:
    """InputError for bytes fed to a string input: onnxruntime reads a bytes array (dtype S)
    past its buffer, which returned other strings or failed at random, and turns a bytes
    object into the text of its repr ("b'a'")."""
    hint = "give str, decoded from UTF-8 (np.char.decode(array, 'utf-8'))"
    if array.dtype.kind == "S":
        raise InputError(f"{where} takes strings, not bytes (dtype {array.dtype}): {hint}")
    if array.dtype.kind == "O" and not only_str(array):
        for index, item in enumerate(array.flat):
            if not isinstance(item, str):
                raise InputError(f"{where} takes strings; element {index} is of type "
                                 f"{type(item).__name__}" + (f": {hint}" if isinstance(item, bytes)
                                                             else ""))


def same_bits(array: np.ndarray, dtype: np.dtype) -> bool:
    """Whether `array` holds `dtype`'s bits under numpy's plain void type: what an .npz gives
    back for a bfloat16 or float8 array, since numpy knows those only through ml_dtypes."""
    return (array.dtype.kind == "V" and array.dtype.names is None
            and dtype.type.__module__.split(".")[0] == "ml_dtypes"
            and array.dtype.itemsize == dtype.itemsize)


# --- values that are not tensors: sequences, maps, optionals ------------------------------

# onnxruntime names two element types as C does; the manifest names floats by width.
_ORT_DTYPES = {"float": "float32", "double": "float64"}


def parse_type(text: str) -> tuple:
    """A value type as nested tuples, from onnxruntime's spelling (`seq(tensor(float))`) or
    graphopt's label (`seq(float32)`): ("tensor", dtype), ("seq", element), ("optional",
    element), ("map", key dtype, value type), or ("unknown", text)."""
    text = text.strip()
    head, paren, rest = text.partition("(")
    if not paren:
        return ("tensor", _ORT_DTYPES.get(text, text))
    inner = rest[:-1] if rest.endswith(")") else rest
    if head == "tensor":
        return ("tensor", _ORT_DTYPES.get(inner, inner))
    if head in ("seq", "optional"):
        return (head, parse_type(inner))
    if head == "map":
        key, _, value = inner.partition(",")
        return ("map", _ORT_DTYPES.get(key.strip(), key.strip()), parse_type(value))
    return ("unknown", text)


def type_label(kind: tuple) -> str:
    """A parsed type as graphopt shows it: `float32`, `seq(float32)`, `map(int64,float32)`,
    `optional(seq(float32))`."""
    tag = kind[0]
    if tag in ("tensor", "unknown"):
        return kind[1]
    if tag == "map":
        return f"map({kind[1]},{type_label(kind[2])})"
    return f"{tag}({type_label(kind[1])})"


def proto_type(type_proto: onnx.TypeProto) -> tuple:
    """An ONNX TypeProto as parse_type's tuples."""
    which = type_proto.WhichOneof("value")
    if which in ("tensor_type", "sparse_tensor_type"):
        return ("tensor", dtype_name(getattr(type_proto, which).elem_type) or "?")
    if which == "sequence_type":
        return ("seq", proto_type(type_proto.sequence_type.elem_type))
    if which == "optional_type":
        return ("optional", proto_type(type_proto.optional_type.elem_type))
    if which == "map_type":
        map_type = type_proto.map_type
        return ("map", dtype_name(map_type.key_type) or "?", proto_type(map_type.value_type))
    return ("unknown", "?")


def typed_entry(value_info: onnx.ValueInfoProto) -> dict:
    """A signature entry ({"name", "dtype", "shape"}); for a value that is not a tensor, whose
    dtype and shape are None, also its "type" label and, for a sequence or optional of tensors,
    the "element" ({"dtype", "shape"}) it holds."""
    import onnx

    from graphopt.codegen.om_write import _signature_entry

    entry = _signature_entry(value_info)
    if value_info.type.WhichOneof("value") in (None, "tensor_type", "sparse_tensor_type"):
        return entry
    entry["type"] = type_label(proto_type(value_info.type))
    held = _held_tensor(value_info.type)
    if held is not None:
        element = _signature_entry(onnx.ValueInfoProto(name=value_info.name, type=held))
        entry["element"] = {"dtype": element["dtype"], "shape": element["shape"]}
    return entry


def typed_inputs(model: onnx.ModelProto) -> list[dict]:
    """typed_entry of each input a caller feeds (om_write.input_signature, with types)."""
    from graphopt.codegen.om_write import graph_inputs

    fed = set(graph_inputs(model))
    return [typed_entry(info) for info in model.graph.input if info.name in fed]


def overridable_inputs(model: onnx.ModelProto | None) -> set[str]:
    """The initializers a caller of `model` may override: those it lists as inputs (IR ≥ 4)."""
    if model is None or model.ir_version < 4:
        return set()
    listed = {vi.name for vi in model.graph.input}
    return {init.name for init in model.graph.initializer if init.name in listed}


def _held_tensor(type_proto: onnx.TypeProto) -> onnx.TypeProto | None:
    """The tensor type a sequence or optional of tensors holds; None for any other type."""
    which = type_proto.WhichOneof("value")
    if which not in ("sequence_type", "optional_type"):
        return None
    held = getattr(type_proto, which).elem_type
    return held if held.WhichOneof("value") == "tensor_type" else None


def npz_holds(entry: Mapping) -> bool:
    """Whether an .npz can hold a feed for `entry`: a tensor or an optional tensor can, a
    sequence or map cannot."""
    if not entry.get("type"):
        return True
    kind = parse_type(entry["type"])
    return kind[0] == "optional" and kind[1][0] == "tensor"


def value_label(value: Any) -> str:
    """The type of a value onnxruntime returned, labelled as type_label does, for where no
    declared type is at hand: a sequence's elements and a map's values are named by the first
    one (`?` when empty), None is `optional(None)`."""
    if value is None:
        return "optional(None)"
    if isinstance(value, (list, tuple)):
        return f"seq({value_label(value[0]) if len(value) else '?'})"
    if isinstance(value, Mapping):
        if not value:
            return "map(?,?)"
        key, item = next(iter(value.items()))
        return f"map({_dtype_label(np.asarray(key))},{value_label(item)})"
    return _dtype_label(np.asarray(value))


def output_label(value: Any, declared: str | None = None) -> str:
    """The type label of an output value: for a sequence or map its `declared` type (which
    names a ZipMap's float values float32 where Python holds float), else value_label's."""
    if declared and isinstance(value, (list, tuple, Mapping)):
        kind = parse_type(declared)
        while kind[0] == "optional":
            kind = kind[1]
        if kind[0] in ("seq", "map"):
            return type_label(kind)
    return value_label(value)


def _dtype_label(array: np.ndarray) -> str:
    if array.dtype.kind in "OUS":
        return "string"
    from onnx import helper

    try:
        return dtype_name(helper.np_dtype_to_tensor_dtype(array.dtype)) or str(array.dtype)
    except (KeyError, TypeError, ValueError):
        return str(array.dtype)


def fitted_value(entry: Mapping, value: Any) -> Any:
    """`value` as onnxruntime takes it for `entry`, a value that is not a tensor (a sequence as
    a list of arrays, a map as a dict); InputError naming the input when it does not fit."""
    element = entry.get("element") or {}
    return _fitted(f"input {entry['name']!r}", parse_type(entry["type"]), value,
                   element.get("shape"))


def _fitted(where: str, kind: tuple, value: Any, shape: list | None) -> Any:
    tag = kind[0]
    if tag == "optional":
        return None if value is None else _fitted(where, kind[1], value, shape)
    if tag == "seq":
        if not isinstance(value, (list, tuple)):
            raise InputError(f"{where} takes a {type_label(kind)} (a list), not {_what(value)}")
        return [_fitted(f"{where} element {i}", kind[1], item, shape)
                for i, item in enumerate(value)]
    if tag == "map":
        if not isinstance(value, Mapping):
            raise InputError(f"{where} takes a {type_label(kind)} (a dict), not {_what(value)}")
        return dict(value)
    if tag == "unknown":
        return value
    array = value if isinstance(value, np.ndarray) else _fitted_array(where, value, kind[1])
    _check_tensor({"name": where, "dtype": kind[1], "shape": shape}, array, where)
    return strings_for_onnxruntime(array)


def _fitted_array(where: str, value: Any, dtype: str) -> np.ndarray:
    """A tensor inside an optional or a sequence as an array, a list too (as a plain tensor
    input takes one)."""
    if value is None or isinstance(value, Mapping):
        raise InputError(f"{where} takes a tensor, not {_what(value)}")
    return as_array("", value, numpy_dtype(dtype), where=where)


def _what(value: Any) -> str:
    if value is None:
        return "None"
    words = f"{value.dtype} array" if isinstance(value, np.ndarray) else type(value).__name__
    return f"{'an' if words[:1].lower() in 'aeiou' else 'a'} {words}"  # an int, an int64 array


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The named arrays of an .npz (np.savez(path, x=…)); InputError naming the file otherwise.
    Never unpickles: object arrays are refused."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected an .npz file")
    refuse_device(path)
    if not zipfile.is_zipfile(path):
        raise InputError(_not_npz(path))
    from graphopt.codegen.om_read import is_om

    # An .om is a zip too: its manifest.json had read as an input of that name.
    if is_om(path):
        raise InputError(_not_npz(path, "it is a graphopt .om artifact"))
    import tokenize  # numpy's header parser raises its TokenError

    arrays = {}
    try:
        with np.load(path, allow_pickle=False) as data:
            twice = {n for n in data.files if data.files.count(n) > 1}
            if twice:  # numpy reads the last of them: which one was meant, nothing says
                raise InputError(_not_npz(path, f"{sorted(twice)[0]!r} is in it twice"))
            for name in data.files:
                arrays[name] = data[name]
                if not isinstance(arrays[name], np.ndarray):  # numpy gives other files' bytes
                    raise InputError(_not_npz(path, f"{name!r} in it is not an .npy array"))
    except ValueError as exc:
        # numpy's message for object arrays mentions allow_pickle, a knob the user does not have.
        reason = "it holds object arrays, which would need unpickling" if "pickle" in str(exc) else exc
        hint = ""
        if "dtype descriptor" in str(exc):  # an ml_dtypes float8_e5m2 saved as it is: '<f1'
            hint = ("; numpy cannot read such an array back, as an ml_dtypes float8_e5m2 saved "
                    "as it is: store its raw bits, np.savez(path, x=array.view('V1')), as run "
                    "--outputs does")
        raise InputError(f"{path}: cannot read as .npz ({reason}{hint})") from None
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error, SyntaxError,
            tokenize.TokenError) as exc:  # the last two: a header numpy cannot parse
        raise InputError(f"{path}: cannot read as .npz ({exc})") from None
    except MemoryError:  # a header declaring 2**40 elements over 64 bytes of data
        raise InputError(f"{path}: cannot read as .npz (an array's header declares more "
                         "elements than memory holds)") from None
    return arrays


def _not_npz(path: str, why: str = "") -> str:
    return (f"{path}: not an .npz archive of named arrays ({why + '; ' if why else ''}write one "
            "with np.savez(path, input_name=array, …))")


def inputs_npz(path: str | os.PathLike, flag: str = "--inputs") -> dict[str, np.ndarray]:
    """load_npz for a command's option: its InputError names the option too, as in
    "--inputs x.npz: no such file" (a command may read several files)."""
    try:
        return load_npz(path)
    except InputError as exc:
        raise InputError(f"{flag} {exc}") from None


def save_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> None:
    """Write arrays to an .npz atomically: `path` ends up complete or as it was.

    Written entry by entry rather than with np.savez(**arrays) so that any tensor name works,
    including ones that collide with np.savez's own parameters ("file", "allow_pickle").
    """
    from graphopt.atomic import atomic_write  # tempfile: not needed by a process that only loads

    path = os.fspath(path)
    try:
        with atomic_write(path) as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as zf:
            for name, array in arrays.items():
                array = np.asanyarray(array)
                if array.dtype == object and all(isinstance(v, str) for v in array.flat):
                    array = array.astype(str)  # onnxruntime returns strings as objects; store them plainly
                elif array.dtype.type.__module__.startswith("ml_dtypes"):
                    # bfloat16 and the float8s as raw bits, which any numpy reads (float8_e5m2
                    # would otherwise get the descr '<f1', which numpy cannot read back).
                    array = array.view(np.dtype(f"V{array.dtype.itemsize}"))
                with zf.open(f"{name}.npy", "w", force_zip64=True) as entry:
                    np.lib.format.write_array(entry, array, allow_pickle=False)
    except ValueError as exc:  # write_array refuses object arrays without pickling
        raise GraphoptError(f"cannot write {path}: {exc}") from None
    except OSError as exc:
        raise GraphoptError(f"cannot write {path}: {exc.strerror or exc}") from None
