"""ATC-style `--input-shape "x:1,3,224,224;mask:1,128"`: parsing and pinning dynamic dims."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from graphopt.api_args import is_integer, mapping
from graphopt.errors import OptionError
from graphopt.dims import bound_dim
from graphopt.option_names import option

if TYPE_CHECKING:  # `run --input-shape` pins an .om's signature: no IR, no onnx
    from graphopt.ir import Model


MAX_DIM = 2 ** 63 - 1  # an ONNX dim is an int64


# trtexec's spellings: dims crossed (1x3x224x224), as onnxruntime's tools write them too, and
# inputs parted by commas ("ids:1,128,mask:1,128"), which read as one input "ids:1,128,mask".
_DIMS = r"-?\d+(?:\s*[,xX]\s*-?\d+)*"
_TRTEXEC_SEPARATOR = re.compile(rf"(:\s*{_DIMS})\s*,\s*(?=[A-Za-z_])")
_CROSSED_DIMS = re.compile(r"\s*-?\d+(?:\s*[xX]\s*-?\d+)+\s*")


def _atc_spelling(entry: str) -> str:
    """A trtexec-spelled entry in the ATC spelling graphopt reads: "a:2x8,b:2x4" → "a:2,8;b:2,4"."""
    parted = _TRTEXEC_SEPARATOR.sub(r"\1;", entry)
    return re.sub(rf":\s*({_DIMS})(?=;|$)",
                  lambda m: ":" + re.sub(r"\s*[xX,]\s*", ",", m.group(1)), parted)


def parse_input_shapes(text: str) -> dict[str, list[int]]:
    """`name:d0,d1,…` entries separated by ';' (a name may itself contain ':'; the last one
    splits). -1 keeps a dim dynamic."""
    shapes: dict[str, list[int]] = {}
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        name, sep, dims = entry.rpartition(":")
        name = name.strip()
        if not sep or not name:
            raise OptionError(f"{option('input_shapes')}: '{entry}' is not NAME:D0,D1,… (e.g. "
                              f"input:1,3,224,224)")
        # trtexec's spelling: inputs parted by commas ("ids:1,128,mask:1,128"), which would
        # read as one input named "ids:1,128,mask".
        if _TRTEXEC_SEPARATOR.search(name):
            raise OptionError(f"{option('input_shapes')}: '{entry}': inputs are separated by "
                              f"';', as in '{_atc_spelling(entry)}'")
        try:
            values = [int(d) for d in dims.split(",")] if dims.strip() else []
        except ValueError:
            hint = (f" (dims are separated by commas: {_atc_spelling(entry)})"
                    if _CROSSED_DIMS.fullmatch(dims) else "")
            raise OptionError(f"{option('input_shapes')}: '{entry}': dims must be integers, got "
                              f"'{dims}'{hint}") from None
        if name in shapes:
            raise OptionError(f"{option('input_shapes')}: input '{name}' is given twice")
        shapes[name] = values
    if not shapes:
        raise OptionError(f"{option('input_shapes')}: no shapes given")
    return validate_input_shapes(shapes)


def format_input_shapes(shapes: dict[str, list[int]]) -> str:
    """The --input-shape text of `shapes` ("x:1,3;mask:1,128"), what parse_input_shapes reads."""
    return ";".join(f"{name}:{','.join(map(str, dims))}" for name, dims in shapes.items())


def input_shapes_argument(value) -> dict[str, list[int]]:
    """An `input_shapes` keyword as the API takes it, checked: "x:1,3;m:1,128" text, a
    {name: dims} mapping, or None (no pins)."""
    if isinstance(value, str):
        return parse_input_shapes(value)
    return validate_input_shapes(mapping(value, option("input_shapes")))


def validate_input_shapes(shapes: dict) -> dict[str, list[int]]:
    """Check an {input: dims} mapping (from the API or the parser): integer dims ≥ -1."""
    checked: dict[str, list[int]] = {}
    for name, dims in shapes.items():
        if not isinstance(name, str) or not isinstance(dims, (list, tuple)):
            raise OptionError(f"{option('input_shapes')}: expected {{name: [dims]}}, got "
                              f"{name!r}: {dims!r}")
        if not all(is_integer(d) for d in dims):
            raise OptionError(f"{option('input_shapes')}: input '{name}': dims must be integers, "
                              f"got {list(dims)}")
        if any(d < -1 for d in dims):
            raise OptionError(f"{option('input_shapes')}: input '{name}': a dim must be ≥ 0 "
                              f"or -1 (dynamic), got {list(dims)}")
        if any(d > MAX_DIM for d in dims):
            raise OptionError(f"{option('input_shapes')}: input '{name}': a dim must be at most "
                              f"2**63 - 1 (ONNX's int64), got {list(dims)}")
        checked[name] = [int(d) for d in dims]
    return checked


def check_pins(shapes: dict[str, list[int]], signature: list[dict], label: str) -> None:
    """OptionError for a pin of `shapes` (validated) that names no input of `signature`
    (entries {"name", "shape"} of `label`'s inputs), gives another rank, or contradicts a dim
    the model fixes: the same refusals pin_input_shapes makes, for the tools that make random
    inputs from a model they do not import."""
    entries = {e["name"]: e for e in signature}
    for name, dims in shapes.items():
        entry = entries.get(name)
        if entry is None:
            raise OptionError(f"{option('input_shapes')}: {label} has no input {name!r} "
                              f"(inputs: {', '.join(entries) or 'none'})")
        shape = entry.get("shape")
        if shape is None:
            continue
        if len(shape) != len(dims):
            raise OptionError(f"{option('input_shapes')}: input '{name}' has rank {len(shape)} "
                              f"{_fmt(shape)}, got {len(dims)} dims {dims}")
        for axis, (current, pinned) in enumerate(zip(shape, dims)):
            if pinned != -1 and isinstance(current, int) and current != pinned:
                raise OptionError(f"{option('input_shapes')}: input '{name}' dim {axis} is fixed "
                                  f"to {current} by {label}, cannot pin it to {pinned}")


def pinned_signature(signature: list[dict], shapes: dict[str, list[int]],
                     label: str) -> list[dict]:
    """Signature entries (as check_pins takes them) with `shapes` pinned, and each symbolic dim
    pinned on one input bound wherever it appears, as pin_input_shapes pins a model."""
    # An optional or a sequence of tensors is pinned by the shape of the tensor it holds.
    held = [{**entry, "shape": entry["element"]["shape"]} if "element" in entry else entry
            for entry in signature]
    check_pins(shapes, held, label)
    bindings: dict[str, int] = {}
    for entry in held:
        for dim, pin in zip(entry.get("shape") or (), shapes.get(entry["name"], ())):
            if pin != -1 and isinstance(dim, str):
                if bindings.get(dim, pin) != pin:
                    raise OptionError(f"{option('input_shapes')}: dim '{dim}' pinned to both "
                                      f"{bindings[dim]} and {pin}")
                bindings[dim] = pin
    pinned = []
    for entry, view in zip(signature, held):
        shape, pins = view.get("shape"), shapes.get(entry["name"])
        if shape is None and pins is not None:  # the pins give an input of unknown rank its own
            shape = [None] * len(pins)
        if shape is not None:
            shape = [pins[axis] if pins and pins[axis] != -1
                     else bindings.get(dim, dim) if isinstance(dim, str) else dim
                     for axis, dim in enumerate(shape)]
        pinned.append({**entry, "element": {**entry["element"], "shape": shape}}
                      if "element" in entry else {**entry, "shape": shape})
    return pinned


def check_pins_fit_feeds(shapes: dict[str, list[int]], feeds: dict, where: str) -> None:
    """OptionError when given feeds (an --inputs file, `where`) contradict a pin: a compile
    pinned to one size and run on another would blame the compile for the feeds."""
    for name, dims in shapes.items():
        if name not in feeds or not hasattr(feeds[name], "shape"):
            continue
        got = list(feeds[name].shape)
        if len(got) != len(dims) or any(p not in (-1, g) for p, g in zip(dims, got)):
            raise OptionError(f"{option('input_shapes')} pins input '{name}' to {dims}, but "
                              f"{where} gives it shape {got}")


_CONTAINERS = {"sequence_type": "a sequence", "optional_type": "an optional",
               "map_type": "a map", "sparse_tensor_type": "a sparse tensor"}


def container_kind(value) -> str:
    """'a sequence', 'an optional'…, for an input of such a type; '' for a tensor."""
    tp = value.type_proto
    return _CONTAINERS.get(tp.WhichOneof("value"), "") if tp is not None else ""


def pin_input_shapes(model: Model, shapes: dict[str, list[int]]) -> None:
    """Fix the given inputs' dims; a symbolic dim pinned once is pinned wherever it appears, so
    the pin propagates to the other inputs, the outputs and every inferred intermediate."""
    from graphopt.source_marks import inserted_preprocessing

    graph = model.graph
    inputs = {v.name: v for v in graph.inputs if not v.is_constant}
    # An --insert-op-conf input takes the frame its config sizes: ATC's --input_shape names
    # the model's own shape there, which `graphopt atc` translates and optimize does not.
    frames = inserted_preprocessing(model.metadata_props).keys() & shapes.keys()
    signature = [{"name": name, "shape": value.shape} for name, value in inputs.items()]
    check_pins({name: shapes[name] for name in shapes.keys() - frames}, signature, "the model")
    for name in shapes:
        kind = container_kind(inputs[name])
        if kind:  # a compile's pin would size nothing: its type holds the element's shape
            raise OptionError(f"{option('input_shapes')}: input '{name}' is {kind}, not a "
                              "tensor: only tensor inputs can be pinned")
    try:
        check_pins({name: shapes[name] for name in frames}, signature,
                   f"{option('insert_op_conf')}'s uint8 frame")
    except OptionError as exc:
        raise OptionError(f"{exc} (with {option('insert_op_conf')}, {option('input_shapes')} "
                          "pins the frame such an input takes, not the model's own shape)"
                          ) from None
    bindings: dict[str, int] = {}
    for name, dims in shapes.items():
        value = inputs[name]
        old = value.shape or tuple(None for _ in dims)
        for current, pinned in zip(old, dims):
            if pinned != -1 and isinstance(current, str):
                if bindings.get(current, pinned) != pinned:
                    raise OptionError(f"{option('input_shapes')}: dim '{current}' pinned to both "
                                      f"{bindings[current]} and {pinned}")
                bindings[current] = pinned
        value.shape = tuple(d if p == -1 else p for d, p in zip(old, dims))
    for value in graph.all_values():
        if value.shape is not None and bindings and any(isinstance(d, str) for d in value.shape):
            # An exporter's expression of a pinned name (`floor(width/2)`) is evaluated too: left
            # as it was, -O1's placement named it as a dynamic shape the pin had fixed.
            value.shape = tuple(bound_dim(d, bindings) if isinstance(d, str) else d
                                for d in value.shape)


def fixed_dims_note(model: Model, shapes: dict[str, list[int]],
                    skip: frozenset[str] = frozenset()) -> str | None:
    """A note on the -1 pins of dims the model fixes, which stay fixed: -1 keeps a dynamic dim
    dynamic, where ATC's --input_shape asks for one (`x:-1,3,224,224` on a batch-1 export).
    `skip`: inputs whose shape a compile replaced (AIPP's images), pinned as fed."""
    inputs = {v.name: v for v in model.graph.inputs if not v.is_constant}
    fixed = [f"{name}[{axis}] = {dim}" for name, dims in shapes.items() if name not in skip
             for axis, (dim, pin) in enumerate(zip(getattr(inputs.get(name), "shape", None)
                                                   or (), dims))
             if pin == -1 and isinstance(dim, int)]
    if not fixed:
        return None
    more = f" and {len(fixed) - 4} more" if len(fixed) > 4 else ""
    return (f"{option('input_shapes')}: -1 keeps a dynamic dim dynamic, and the model fixes "
            f"{', '.join(fixed[:4])}{more}: those stay as the model fixes them")


def _fmt(shape) -> str:
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def reshape_conflict(model: Model) -> str | None:
    """The first Reshape of the main graph whose input has a static shape its constant target
    cannot hold (a pinned batch of 3 reaching a target of [1, 512]): ONNX's inference and
    onnxruntime's load both let it pass, and it fails at the first run. None when there is
    none."""
    import math

    # The main graph only: a branch the pinned inputs never take may hold a Reshape they
    # could not (silero-vad's other sample rate).
    for node in model.graph:
        if node.op_type != "Reshape" or len(node.inputs) < 2 or node.inputs[0] is None:
            continue
        dims, target = node.inputs[0].shape, _constant(node.inputs[1])
        if dims is None or target is None or not all(isinstance(d, int) for d in dims):
            continue
        target = [int(t) for t in target.reshape(-1)]
        if not node.attr("allowzero", 0):  # 0 copies the input's dim at that place
            target = [dims[i] if t == 0 and i < len(dims) else t for i, t in enumerate(target)]
        count, known = math.prod(dims), math.prod(t for t in target if t != -1)
        fits = (count == known if -1 not in target
                else target.count(-1) == 1 and known != 0 and count % known == 0)
        if not fits:
            return (f"node {node.label} (Reshape) cannot make its input of shape {_fmt(dims)} "
                    f"({count} elements) into {_fmt(target)}")
    return None


def _constant(value):
    """A value's data when it is fixed: an initializer's or a Constant node's."""
    if value is None:
        return None
    if value.producer is None:
        return value.constant()
    if value.producer.op_type == "Constant":
        tensor = value.producer.attr("value")
        return tensor.numpy() if hasattr(tensor, "numpy") else None
    return None
