"""ATC-style shape profiles (`--dynamic-dims "batch:1,4,8;seq:128,512"`): parsing, and
expanding them against a model's dynamic input dims into one set of pinned shapes each."""

from __future__ import annotations

import itertools
import numbers
import re
from dataclasses import dataclass

from graphopt.codegen.profile_match import dims_label
from graphopt.errors import OptionError
from graphopt.input_shapes import container_kind
from graphopt.option_names import option
from graphopt.ir import Model

# Each profile is a whole compile and a set of sessions at load time; ATC takes up to 100.
MAX_PROFILES = 100
_AXIS_KEY = re.compile(r"(?P<input>.+)\[(?P<axis>\d+)\]\Z")


@dataclass(frozen=True)
class ShapeProfile:
    """One static shape set of a dynamic model: its name in the .om (`profile0`, …), the value
    of each dynamic dim, and the input shapes that pins (-1 where a dim stays dynamic)."""

    name: str
    dims: dict[str, int]
    input_shapes: dict[str, list[int]]

    @property
    def label(self) -> str:
        return dims_label(self.dims)


def parse_dynamic_dims(text: str) -> list[dict[str, int]] | dict[str, list[int]]:
    """Either `KEY:v1,v2,…;KEY:…` (every combination of the values: a cross product) or
    `KEY=v,KEY=v;KEY=v,KEY=v` (one profile per ';' group, listed). A KEY is a symbolic dim name
    of the model's inputs (`batch`) or an input's axis (`input_ids[1]`)."""
    entries = [e.strip() for e in text.split(";") if e.strip()]
    if not entries:
        raise OptionError(f"{option('dynamic_dims')}: no dims given "
                          "(e.g. \"batch:1,4,8;seq:128,512\")")
    if all("=" in e for e in entries):
        return [_parse_listed(entry) for entry in entries]
    grid: dict[str, list[int]] = {}
    for entry in entries:
        key, sep, values = entry.rpartition(":")
        key = key.strip()
        if not sep or not key or "=" in entry:
            raise OptionError(f"{option('dynamic_dims')}: '{entry}' is not DIM:V1,V2,… (e.g. "
                              "batch:1,4,8) — or write every entry as DIM=V,DIM=V for listed "
                              "profiles")
        if key in grid:
            raise OptionError(f"{option('dynamic_dims')}: dim '{key}' is given twice")
        grid[key] = [_dim_value(key, v) for v in values.split(",")]
    return grid


def _parse_listed(entry: str) -> dict[str, int]:
    profile: dict[str, int] = {}
    # Split on the commas between KEY=V pairs only: a key like `x[0]` has no comma in it.
    for pair in filter(None, (p.strip() for p in entry.split(","))):
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise OptionError(f"{option('dynamic_dims')}: '{pair}' in '{entry}' is not DIM=VALUE")
        if key in profile:
            raise OptionError(f"{option('dynamic_dims')}: dim '{key}' is given twice in '{entry}'")
        profile[key] = _dim_value(key, value)
    return profile


def _dim_value(key: str, text) -> int:
    if isinstance(text, bool):
        raise OptionError(f"{option('dynamic_dims')}: dim '{key}': {text!r} is not a dim size")
    # An integer (numpy's too) or its text; a float is refused, not truncated (1.5 is no size).
    if not isinstance(text, str) and not isinstance(text, numbers.Integral):
        raise OptionError(f"{option('dynamic_dims')}: dim '{key}': {text!r} is not an "
                          "integer")
    try:
        value = int(text.strip()) if isinstance(text, str) else int(text)
    except (TypeError, ValueError):
        raise OptionError(f"{option('dynamic_dims')}: dim '{key}': '{text}' is not an "
                          "integer") from None
    if value < 0:  # 0 is a size: a KV cache's past length at a decoder's first step
        raise OptionError(f"{option('dynamic_dims')}: dim '{key}': sizes must be ≥ 0, "
                          f"got {value}")
    if value > 2 ** 63 - 1:
        raise OptionError(f"{option('dynamic_dims')}: dim '{key}': sizes must be at most 2**63 - 1 "
                          f"(ONNX's int64), got {value}")
    return value


def dynamic_dims(model: Model) -> dict[str, list[tuple[str, int]]]:
    """The model's dynamic input dims: each key (a symbolic name, or `input[axis]` for an
    unnamed dim) with the (input, axis) places it stands for."""
    found: dict[str, list[tuple[str, int]]] = {}
    for value in model.graph.inputs:
        if value.is_constant or value.shape is None:
            continue
        for axis, dim in enumerate(value.shape):
            if isinstance(dim, str):
                found.setdefault(dim, []).append((value.name, axis))
            elif dim is None:
                found[f"{value.name}[{axis}]"] = [(value.name, axis)]
    return found


def expand_profiles(model: Model, spec, label: str = "<model>") -> list[ShapeProfile]:
    """The profiles `spec` (parse_dynamic_dims's result, the text itself, or the same forms from
    the API: {dim: [values]} or [{dim: value}, …]) makes for `model`."""
    if isinstance(spec, str):
        spec = parse_dynamic_dims(spec)
    if isinstance(spec, dict):
        grid = {str(k): _values(k, v) for k, v in spec.items()}
        if not grid:
            raise OptionError(f"{option('dynamic_dims')}: no dims given")
        combos = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    elif isinstance(spec, (list, tuple)) and all(isinstance(p, dict) for p in spec) and spec:
        combos = [{str(k): _dim_value(str(k), v) for k, v in p.items()} for p in spec]
    else:
        raise OptionError(f"dynamic_dims: expected 'DIM:V1,V2;…', {{dim: [values]}} or "
                          f"[{{dim: value}}, …], got {spec!r}")
    if len(combos) > MAX_PROFILES:
        # Listing the profiles one by one is no way around it: the limit counts profiles.
        fewer = ("list fewer values per dim, or name only the profiles you serve one by one "
                 "(DIM=V,DIM=V;…)" if isinstance(spec, dict) else "list fewer profiles")
        raise OptionError(f"{option('dynamic_dims')}: {len(combos)} profiles, more than "
                          f"{MAX_PROFILES} (each is a compile of its own; the limit holds for "
                          f"the combinations of DIM:V1,V2 and the listed DIM=V form alike): "
                          f"{fewer}")
    found = dynamic_dims(model)
    # name -> "" for a tensor of unknown rank, or what else it is ("a sequence": dims of the
    # tensors it holds, which no key names either)
    unranked = {v.name: container_kind(v) for v in model.graph.inputs
                if not v.is_constant and v.shape is None}
    keys = list(dict.fromkeys(k for combo in combos for k in combo))
    fixed = {(v.name, axis): dim for v in model.graph.inputs if not v.is_constant and v.shape
             for axis, dim in enumerate(v.shape) if isinstance(dim, int)}
    places = {key: _places(key, found, label, unranked, fixed) for key in keys}
    if any(set(combo) != set(keys) for combo in combos):
        same = next(((a, b) for i, a in enumerate(keys) for b in keys[i + 1:]
                     if set(places[a]) & set(places[b])), None)
        if same:  # "A=1;x[0]=2": one dim, named two ways in two profiles
            place = places[same[0]][0]
            raise OptionError(f"{option('dynamic_dims')}: '{same[1]}' and '{same[0]}' name "
                              f"the same dim, {place[0]}[{place[1]}]'s: name it one way in "
                              "every profile")
        raise OptionError(f"{option('dynamic_dims')}: every profile must set the same dims "
                          f"({', '.join(keys)})")
    keys = _merge_same_dims(keys, places, combos)
    if len({tuple(sorted(c.items())) for c in combos}) != len(combos):
        raise OptionError(f"{option('dynamic_dims')}: a profile is listed twice")
    ranks = {v.name: len(v.shape) for v in model.graph.inputs if v.shape is not None}
    profiles = []
    for index, combo in enumerate(combos):
        shapes: dict[str, list[int]] = {}
        for key, value in combo.items():
            for name, axis in places[key]:
                shapes.setdefault(name, [-1] * ranks[name])[axis] = value
        profiles.append(ShapeProfile(f"profile{index}", dict(combo), shapes))
    return profiles


def _places(key: str, found: dict[str, list[tuple[str, int]]], label: str,
            unranked: dict[str, str], fixed: dict | None = None) -> list[tuple[str, int]]:
    """Where `key` (a symbolic name, or `input[axis]` for any dynamic dim) is in the inputs;
    `unranked` are the inputs without a shape, whose dims no key can name; `fixed`: the
    (input, axis) → size of the dims the model fixes, named as such."""
    if key in found:
        return found[key]
    match = _AXIS_KEY.match(key)
    if match:
        place = (match["input"], int(match["axis"]))
        for spots in found.values():
            if place in spots:  # a named dim there is that dim everywhere it appears
                return list(spots)
        if place in (fixed or {}):  # an export traced at one size: ATC's -1 cannot open it
            raise OptionError(f"{option('dynamic_dims')}: {label} fixes {key} at "
                              f"{fixed[place]}: a profile cannot give it another size; export "
                              "the model with that axis dynamic (torch.onnx.export's "
                              f"dynamic_axes) ({_describe(found, unranked)})")
    raise OptionError(f"{option('dynamic_dims')}: {label} has no dynamic input dim '{key}' "
                      f"({_describe(found, unranked)})")


def _values(key, values) -> list[int]:
    if isinstance(values, (numbers.Integral, str)):
        values = [values]
    if isinstance(values, (bytes, dict)) or not hasattr(values, "__iter__"):
        raise OptionError(f"{option('dynamic_dims')}: dim '{key}': expected a size or a list "
                          f"of sizes, got {values!r}")
    result = [_dim_value(str(key), v) for v in values]
    if not result:
        raise OptionError(f"{option('dynamic_dims')}: dim '{key}' has no values")
    if len(set(result)) != len(result):
        raise OptionError(f"{option('dynamic_dims')}: dim '{key}' lists a value twice: {result}")
    return result


def _merge_same_dims(keys: list[str], places: dict[str, list[tuple[str, int]]],
                     combos: list[dict[str, int]]) -> list[str]:
    """The keys with those that name one dim (x[0] and y[0] of a shared `batch`) made one, the
    first, in `combos` too: ATC's --dynamic_batch_size gives every -1 dim the batch size, so
    each profile of a model whose inputs share their batch names it twice, with one size."""
    kept: list[str] = []
    for key in keys:
        same = next((k for k in kept if set(places[k]) & set(places[key])), None)
        if same is None:
            kept.append(key)
            continue
        differ = next((c for c in combos if c[key] != c[same]), None)
        if differ is not None:
            place = places[same][0]
            raise OptionError(f"{option('dynamic_dims')}: '{key}' and '{same}' name the same "
                              f"dim, {place[0]}[{place[1]}]'s (inputs that share a dim name "
                              f"share its size), and a profile gives them {differ[key]} and "
                              f"{differ[same]}: give it once")
        for combo in combos:
            del combo[key]
    return kept


def _describe(places: dict[str, list[tuple[str, int]]], unranked: dict[str, str]) -> str:
    # An input without a shape has dims of its own, just none a key can name: it is not static.
    # The profiles are read off the model as given, so an --input-shape pin does not give
    # them dims to name: it gives one shape, for a compile of its own.
    tensors = [name for name, kind in unranked.items() if not kind]
    names = ", ".join(f"'{name}'" for name in tensors)
    notes = [f"input{'s' * (len(tensors) > 1)} {names} of unknown rank (no shape in the "
             f"model), whose dims no key can name; {option('input_shapes')} can pin "
             "a shape for one compile"] if tensors else []
    notes += [f"input '{name}' is {kind}, whose tensors' dims no key can name"
              for name, kind in unranked.items() if kind]
    unknown = "; ".join(notes)
    if not places:
        return unknown or "its inputs are all static"
    where = [f"{key} ({', '.join(f'{n}[{a}]' for n, a in spots)})" for key, spots in places.items()]
    return "its dynamic dims: " + "; ".join(where) + (f"; {unknown}" if unknown else "")
