"""ATC's --input_fp16_nodes and --output_type: inputs fed as float16 and outputs given in float16
(or float32), by Casts at the model's edges before any pass. Under a precision mode its own
boundary Casts meet them and cancel, so a float16 compile reads and writes half directly."""

from __future__ import annotations

import json

from graphopt.errors import OptionError, UsageError
from graphopt.ir import DType, Model, Node, Value
from graphopt.ir.value import NO_METADATA
from graphopt.option_names import option
from graphopt.source_marks import IO_TYPES_KEY, cut_outputs, inserted_preprocessing, io_types

# --output-type's values, ATC's spelling: the dtype an output is given in. ATC's UINT8 needs a
# quantization scale nothing in the model states; it is refused.
OUTPUT_TYPES = {"FP16": DType.FLOAT16, "FP32": DType.FLOAT}
ALL = ""  # the output_type key of "every output"


def parse_fp16_inputs(spec) -> list[str]:
    """The input names `spec` gives: "a;b" (the command line's form) or a list of names."""
    names = _names(spec, "input_fp16_nodes")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise OptionError(f"{option('input_fp16_nodes')}: {', '.join(map(repr, twice))} "
                          "named twice")
    return names


def parse_output_type(spec) -> dict[str, str]:
    """{output: "FP16"|"FP32"} from "FP16" (every output), "y:FP16;node:1:FP32" (ATC's form,
    a tensor name or node:index each; a bare type among them is every other output's), or a
    dict of those; "" keys every output."""
    if isinstance(spec, dict):
        items = list(spec.items())
        if not items:  # as input_fp16_nodes=[] is: an empty ask is likely a mistake
            raise OptionError(f"{option('output_type')}: an empty dict names no output")
    elif isinstance(spec, str) and ":" not in spec and ";" not in spec:
        items = [(ALL, spec)]  # ATC's --output_type=FP16: every output
    else:
        # A bare FP16/FP32 among named outputs ("FP16;y:FP32") is the type of every other
        # output, as the dict form's "" key is; a bare name is still a name without a type.
        items = []
        for part in _names(spec, "output_type"):
            if ":" not in part:
                items.append((ALL, part) if part.upper() in OUTPUT_TYPES else (part, ""))
                continue
            name, kind = part.rsplit(":", 1)
            if not name.strip():  # ":FP16" would read as every output
                raise OptionError(f"{option('output_type')} {spec!r}: an empty name before "
                                  f"{':' + kind!r} (give FP16 or FP32 alone for every output)")
            items.append((name, kind))
    chosen: dict[str, str] = {}
    for name, kind in items:
        if not isinstance(name, str) or not isinstance(kind, str):
            raise OptionError(f"{option('output_type')}: expected names and FP16 or FP32, not "
                              f"{name!r}: {kind!r}")
        name, given = name.strip(), kind.strip()
        kind = given.upper()
        if kind not in OUTPUT_TYPES:
            got = f"{given!r}" if given else "no type"
            why = " (a uint8 output needs a quantization scale the model does not state)" \
                if kind == "UINT8" else ""
            raise UsageError(f"{option('output_type')} {name or 'every output'}: {got}; "
                              f"expected FP16 or FP32{why}")
        if name in chosen:
            what = f"{name!r} named" if name else "a type for every output given"
            raise OptionError(f"{option('output_type')}: {what} twice")
        chosen[name] = kind
    return chosen


def _names(spec, keyword: str) -> list[str]:
    if isinstance(spec, str):
        names = [name.strip() for name in spec.split(";")]
    elif isinstance(spec, (list, tuple)) and all(isinstance(name, str) for name in spec):
        names = [name.strip() for name in spec]
    else:
        raise OptionError(f"{option(keyword)}: expected \"a;b\" or a list of names, not "
                          f"{type(spec).__name__}")
    if not names or any(not name for name in names):
        raise OptionError(f"{option(keyword)} {spec!r}: an empty name (give names separated "
                          "by ';')")
    return names


def apply_io_types(model: Model, fp16_inputs: list[str] | None,
                   output_types: dict[str, str] | None, label: str) -> str:
    """Make the named float32 inputs take float16 and the named outputs the dtypes asked, with a
    Cast at each, and record them (source_marks.io_types); returns the compile's note."""
    graph = model.graph
    recorded = io_types(model.metadata_props)
    said = []
    images = inserted_preprocessing(model.metadata_props)
    for name in fp16_inputs or ():
        value = _float_input(graph, name, label, images)
        _cast_input(graph, value)
        recorded["inputs"][name] = "float16"
        said.append(f"input {name!r} takes float16")
    for value, dtype in _chosen_outputs(graph, output_types or {}, label,
                                        cut_outputs(model.metadata_props)):
        if value.dtype == dtype:
            continue
        name = _cast_output(graph, value, dtype)
        recorded["outputs"][name] = _DTYPE_NAMES[dtype]
        said.append(f"output {name!r} is {_DTYPE_NAMES[dtype]}")
    model.metadata_props[IO_TYPES_KEY] = json.dumps(recorded, sort_keys=True)
    if not said:
        if ALL in (output_types or {}) and not any(v.dtype in _DTYPE_NAMES for v in graph.outputs):
            listed = ", ".join(f"{v.name!r} ({_dtype_text(v)})" for v in graph.outputs)
            return (f"{option('output_type')}: the model has no float32 or float16 output to "
                    f"change; nothing changed (its outputs: {listed})")
        return (f"{option('output_type')}: every output named already has that type; "
                "nothing changed")
    return "; ".join(said)


_DTYPE_NAMES = {DType.FLOAT16: "float16", DType.FLOAT: "float32"}


def _dtype_text(value: Value) -> str:
    if value.type_proto is not None:  # a ZipMap's seq(map(int64,float32)), an optional…
        from graphopt.ir.printer import format_type

        return f"a {format_type(value)}, not a tensor"
    return value.dtype.name.lower() if value.dtype is not None else "untyped"


def _float_input(graph, name: str, label: str, images: dict) -> Value:
    """The feedable float32 input `name`, which a float16 one will replace (`images`: the
    inputs --insert-op-conf made take uint8 images, inserted_preprocessing's record)."""
    feedable = {value.name: value for value in graph.inputs if not value.is_weight}
    value = feedable.get(name)
    if value is None:
        known = ", ".join(map(repr, feedable)) or "none"
        raise OptionError(f"{label}: {option('input_fp16_nodes')} {name!r}: the model has no "
                          f"such input (its inputs: {known})")
    if name in images:  # its dtype alone read as if the model took uint8 there
        raise OptionError(f"{label}: {option('input_fp16_nodes')} {name!r}: the input takes "
                          f"{option('insert_op_conf')}'s uint8 images, which its preprocessing "
                          "turns into float32 inside the model; name it in one option only")
    if value.dtype != DType.FLOAT:
        raise OptionError(f"{label}: {option('input_fp16_nodes')} {name!r}: the input is "
                          f"{_dtype_text(value)}; only float32 inputs can take float16")
    if value.is_graph_output:
        raise OptionError(f"{label}: {option('input_fp16_nodes')} {name!r}: the input is also "
                          "an output of the model")
    return value


def _cast_input(graph, value: Value) -> None:
    """Replace input `value` by a float16 one of its name, Cast to float32 for its readers."""
    index = graph.inputs.index(value)
    name = value.name
    value.name = graph.fresh_name(f"{name}_fp32")
    value.is_input = False
    half = Value(name, DType.FLOAT16, value.shape)
    half.graph, half.is_input = graph, True
    half.doc_string, half.metadata_props = value.doc_string, value.metadata_props
    graph.inputs[index] = half
    first = graph.nodes()[0] if len(graph) else None
    cast = graph.make_node("Cast", [half], {"to": int(DType.FLOAT)}, dtype=DType.FLOAT,
                           shape=value.shape, before=first,
                           name=graph.fresh_node_name(f"{name}_to_fp32"))
    value.replace_all_uses_with(cast.output)


def _chosen_outputs(graph, output_types: dict[str, str], label: str, cut: list[str]):
    """(graph output, dtype) for each output `output_types` names, and for ALL every float
    output no name gives; one output named twice (by two spellings) is refused, as it would be
    cast twice or take the first type given. `cut`: the source's outputs --out-nodes cut."""
    from graphopt.out_nodes import resolve_tensor

    for name in output_types:
        if name in cut:  # "no tensor … has that name", of an output the user sees in the source
            raise OptionError(f"{label}: {option('output_type')} {name!r}: {option('out_nodes')} "
                              "cut that output of the source model")
    named = {name: resolve_tensor(graph, name, label, "output_type")
             for name in output_types if name != ALL}
    first: dict[int, str] = {}
    for name, value in named.items():
        if id(value) in first:  # "y:FP16;head:0:FP32": the first would have won unsaid
            raise OptionError(f"{label}: {option('output_type')} names output {value.name!r} "
                              f"twice ({first[id(value)]!r} and {name!r})")
        first[id(value)] = name
    chosen = []
    for name, kind in output_types.items():
        # An output graph.output lists twice is one tensor: one Cast gives it for both.
        values = [named[name]] if name != ALL else list({
            id(v): v for v in graph.outputs
            if v.dtype in _DTYPE_NAMES and id(v) not in first}.values())
        for value in values:
            said = f"{name!r}" if name != ALL else f"{kind} (every output): {value.name!r}"
            if not value.is_graph_output:
                raise OptionError(f"{label}: {option('output_type')} {said}: not an output of "
                                  "the model (--out-nodes makes a tensor one)")
            if value.dtype not in _DTYPE_NAMES:
                before = (f" ({option('out_nodes')} can make the tensor it is built from an "
                          "output)") if value.type_proto is not None else ""
                raise OptionError(f"{label}: {option('output_type')} {said}: the output is "
                                  f"{_dtype_text(value)}; only float32 and float16 outputs "
                                  f"change type{before}")
            if value.is_input:
                raise OptionError(f"{label}: {option('output_type')} {said}: the output is "
                                  "also an input of the model")
            chosen.append((value, OUTPUT_TYPES[kind]))
    return chosen


def _cast_output(graph, value: Value, dtype: DType) -> str:
    """Give output `value`'s name, doc and metadata to a Cast of it to `dtype`."""
    name = value.name
    value.name = graph.fresh_name(f"{name}_{value.dtype.short}")
    out = Value(name, dtype, value.shape)
    out.doc_string, out.metadata_props = value.doc_string, value.metadata_props
    value.doc_string, value.metadata_props = "", NO_METADATA
    graph.append(Node("Cast", [value], {"to": int(dtype)}, outputs=[out],
                      name=graph.fresh_node_name(f"{name}_to_{dtype.short}")))
    graph.outputs = [out if o is value else o for o in graph.outputs]
    return name
