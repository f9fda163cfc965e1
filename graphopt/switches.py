"""Pass switch files: which passes to turn off, as ATC's fusion switch file does for fusions.

Accepted forms, one pass per line (`#` starts a comment):

    FoldConstants: off
    EliminateCommonSubexpressions: on

or a JSON object `{"FoldConstants": "off"}` (or `false`). A bare name means off. `on` leaves a
pass as its -O level has it: a switch file turns passes off, it does not add a pass to a level.
"""

from __future__ import annotations

import json

from graphopt.errors import OptionError
from graphopt.passes.manager import check_pass_names

# A switch file names a few dozen passes: past this it is some other file (or /dev/zero).
MAX_BYTES = 1 << 20


def read_switch_file(path: str, option: str = "--switch-file") -> set[str]:
    """The set of passes the file switches off; errors name `option`, the file and the line
    (or JSON key) at fault."""
    where = f"{option} {path}"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:  # as every other input file's: not the OS's capitalized text
        raise OptionError(f"{where}: no such file") from None
    except OSError as e:
        raise OptionError(f"{where}: cannot read it: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise OptionError(f"{where}: over {MAX_BYTES >> 20} MiB, not a switch file")
    try:
        text = data.decode("utf-8-sig")  # a byte order mark, as Windows editors write, is no name
    except UnicodeDecodeError:
        raise OptionError(f"{where}: not a UTF-8 text file") from None
    entries = _json_entries(text, where) if text.lstrip().startswith(("{", "[")) \
        else _line_entries(text, where)
    seen: dict[str, str] = {}
    for name, state, place in entries:
        if name in seen:
            raise OptionError(f"{where}: {place}: {name} is switched already at {seen[name]}; "
                              "give each pass once")
        seen[name] = place
        if state.lower() not in ("on", "off"):
            raise OptionError(f"{where}: {place}: {name}: state must be on or off, got "
                              f"{state!r}")
        check_pass_names([name], f"{where}: {place}")
    return {name for name, state, _ in entries if state.lower() == "off"}


def _line_entries(text: str, where: str) -> list[tuple[str, str, str]]:
    """(name, state as written, "line N") of each `Name: state` or bare `Name` line."""
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, colon, state = line.partition(":")
        if not colon and len(name.split()) > 1:
            raise OptionError(f"{where}: line {number}: expected 'PassName: off' or "
                              f"'PassName: on', got {line!r}")
        entries.append((name.strip(), state.strip() or "off", f"line {number}"))
    return entries


def _json_entries(text: str, where: str) -> list[tuple[str, str, str]]:
    """(name, state, "key 'Name'") of each entry of a JSON object; a key given twice is
    refused, where json.loads would keep the last."""
    def pairs(items):
        names = [name for name, _ in items]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise OptionError(f"{where}: {', '.join(twice)} given twice; give each pass once")
        return dict(items)

    try:
        data = json.loads(text, object_pairs_hook=pairs)
    except (json.JSONDecodeError, RecursionError) as e:  # RecursionError: nested too deep
        raise OptionError(f"{where}: invalid JSON ({e})") from None
    if not isinstance(data, dict):
        raise OptionError(f"{where}: expected a JSON object of pass: state, got "
                          f"{type(data).__name__}")
    nested = [name for name, value in data.items() if isinstance(value, dict)]
    if nested:  # ATC's {"Switch": {"GraphFusion": {…}}} groups fusions by kind
        raise OptionError(f"{where}: key {nested[0]!r} holds an object; graphopt's switch file "
                          "lists passes and rules at the top level: {\"FuseLayerNorm\": "
                          "\"off\"}")
    return [(str(name), _json_state(value), f"key {name!r}") for name, value in data.items()]


def _json_state(value) -> str:
    """A JSON entry's state: "on"/"off" in any case, or true/false; anything else as written,
    for the message."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return value if isinstance(value, str) else json.dumps(value)
