"""What a compiled model records of how the compile edited its source (--out-nodes,
--insert-op-conf, --input-fp16-nodes and --output-type) and of the values it rescaled (INT8's
channel equalization), in its metadata: read by compare, inspect and the random inputs."""

from __future__ import annotations

import json

from graphopt.option_names import option

# The outputs of the source a compile cut off (a JSON list): compare leaves them out of its
# verdict rather than fail them as lost. An .om keeps it in its manifest's extra.
CUT_KEY = "graphopt.outputs_cut"
# The preprocessing a compile inserted (a JSON object by input name). An .om keeps it in its
# manifest's extra.
PREPROCESS_KEY = "graphopt.preprocess"
# The input and output dtypes a compile changed ({"inputs": {name: dtype}, "outputs": {…}}).
IO_TYPES_KEY = "graphopt.io_types"
# The values that kept their names but hold their channels scaled (a JSON list): compare does
# not pair them with the source's values of those names. An .om keeps it in its extra.
RESCALED_KEY = "graphopt.rescaled_values"


def _props(props) -> dict:
    return props if hasattr(props, "get") else {p.key: p.value for p in props}


def rescaled_values(props) -> list[str]:
    """The values metadata `props` says a compile rescaled per channel."""
    try:
        names = json.loads(_props(props).get(RESCALED_KEY, "[]"))
    except ValueError:
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def record_rescaled(props: dict, names) -> None:
    """Add `names` to the rescaled values metadata `props` (a mapping) records."""
    props[RESCALED_KEY] = json.dumps(list(dict.fromkeys([*rescaled_values(props), *names])))


def cut_outputs(props) -> list[str]:
    """The source outputs metadata `props` (a mapping or a ModelProto's metadata_props) says
    a compile cut off."""
    try:
        names = json.loads(_props(props).get(CUT_KEY, "[]"))
    except ValueError:
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def inserted_preprocessing(props) -> dict:
    """The preprocessing metadata `props` records, by input name: {} when a compile inserted
    none."""
    try:
        recorded = json.loads(_props(props).get(PREPROCESS_KEY, "{}"))
    except ValueError:
        return {}
    return recorded if isinstance(recorded, dict) else {}


def frames_hint(exc: Exception, images: dict) -> str:
    """What to add to a feed file's refusal that names an input of `images` (inserted
    preprocessing's): the model takes frames now."""
    if not any(f"input {name!r} " in str(exc) for name in images):
        return ""
    return (f" ({option('insert_op_conf')} makes the model take uint8 frames: give them, not "
            "preprocessed tensors)")


def io_types(props) -> dict:
    """The input and output dtypes metadata `props` records a compile changed, as
    {"inputs": {name: dtype}, "outputs": {name: dtype}} (both empty when it changed none)."""
    try:
        recorded = json.loads(_props(props).get(IO_TYPES_KEY, "{}"))
    except ValueError:
        recorded = {}
    return _io_types(recorded)


def _io_types(recorded) -> dict:
    recorded = recorded if isinstance(recorded, dict) else {}
    return {side: {name: dtype for name, dtype in recorded.get(side, {}).items()
                   if isinstance(name, str) and dtype in ("float16", "float32")}
            if isinstance(recorded.get(side), dict) else {} for side in ("inputs", "outputs")}


def io_types_text(recorded: dict) -> str:
    """One line of what io_types (or extra_io_types) records."""
    parts = [f"{side[:-1]} {name!r} {dtype}" for side in ("inputs", "outputs")
             for name, dtype in recorded.get(side, {}).items()]
    return f"{option('input_fp16_nodes')}/{option('output_type')}: " + ", ".join(parts)


# The same records in an .om's manifest extra, under these keys.
EXTRA_CUT, EXTRA_PREPROCESS, EXTRA_IO_TYPES = "outputs_cut", "preprocess", "io_types"
# The source's overridable initializers, which an .om fixes: a feed for one is explained.
EXTRA_FIXED_INPUTS = "fixed_inputs"
EXTRA_RESCALED = "rescaled_values"


def extra_rescaled_values(extra: dict) -> list[str]:
    """rescaled_values of an .om's extra."""
    names = extra.get(EXTRA_RESCALED)
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def extra_io_types(extra: dict) -> dict:
    """io_types of an .om's extra (free-form: read defensively)."""
    return _io_types(extra.get(EXTRA_IO_TYPES))


def extra_cut_outputs(extra: dict) -> list[str]:
    """cut_outputs of an .om's extra (free-form: what is not a list of names is none)."""
    names = extra.get(EXTRA_CUT)
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def extra_fixed_inputs(extra: dict) -> list[str]:
    """The source model's inputs that an .om fixed at their initializers' values."""
    names = extra.get(EXTRA_FIXED_INPUTS)
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def extra_preprocessing(extra: dict) -> dict:
    """inserted_preprocessing of an .om's extra ({} where it is not an object)."""
    recorded = extra.get(EXTRA_PREPROCESS)
    return recorded if isinstance(recorded, dict) else {}


def preprocessing_text(recorded: dict) -> str:
    """One line of what `recorded` (inserted_preprocessing's, or an .om's extra "preprocess")
    says, read defensively: a manifest's extra is free-form."""
    parts = []
    for name, entry in recorded.items():
        entry = entry if isinstance(entry, dict) else {}
        steps = [f"{entry.get('input_format', '?')} {_size(entry.get('src_size'))}"]
        if entry.get("crop"):
            steps.append(f"crop {_size(entry.get('crop_size'))} at "
                         f"{_size(entry.get('crop_start'), ',')}")
        if "x_last" in entry:
            steps.append("X byte last" if entry.get("x_last") else "X byte first")
        if entry.get("swap_rb"):
            steps.append("U/V swapped" if entry.get("input_format") == "YUV420SP_U8"
                         else "R/B swapped")
        if "csc_matrix" in entry:
            steps.append(f"colour matrix {_numbers(entry.get('csc_matrix'))} / 256 on (x - "
                         f"{_numbers(entry.get('input_bias'))}), floored, + "
                         f"{_numbers(entry.get('output_bias'))}")
        steps.append(f"(x - {_numbers(entry.get('mean'))} - {_numbers(entry.get('min'))}) "
                     f"* {_numbers(entry.get('var_reci'))}")
        steps.append(f"to {entry.get('layout', '?')}")
        parts.append(f"{name!r}: " + ", ".join(steps))
    return "--insert-op-conf: " + "; ".join(parts)


def cut_text(names: list) -> str:
    """One line of the outputs a compile cut off: no longer outputs, though a kept one may
    still need what computes them."""
    return ("--out-nodes: the source's output(s) " + ", ".join(str(n) for n in names)
            + " are no longer outputs")


def _size(pair, separator: str = "x") -> str:
    return separator.join(str(v) for v in pair) if isinstance(pair, list) else "?"


def _numbers(values) -> str:
    if not isinstance(values, list):
        return "?"
    return "[" + ", ".join(f"{v:g}" if isinstance(v, (int, float)) else "?" for v in values) + "]"
