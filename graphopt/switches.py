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


def read_switch_file(path: str, option: str = "--switch-file") -> set[str]:
    """The set of passes the file switches off; errors name `option`."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise OptionError(f"{option} {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise OptionError(f"{option} {path}: not a UTF-8 text file") from None
    entries: dict[str, str] = {}
    if text.lstrip().startswith(("{", "[")):  # JSON; an array is a mistake to name
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise OptionError(f"{option} {path}: invalid JSON ({e})") from None
        if not isinstance(data, dict):
            raise OptionError(f"{option} {path}: expected a JSON object of pass: state, got "
                              f"{type(data).__name__}")
        entries = {str(k): _json_state(v) for k, v in data.items()}
    else:
        for number, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            name, colon, state = line.partition(":")
            if not colon and len(name.split()) > 1:
                raise OptionError(f"{option} {path}: line {number}: expected 'PassName: off' or "
                                  f"'PassName: on', got {line!r}")
            state = state.strip().lower() or "off"
            entries[name.strip()] = state
    for name, state in entries.items():
        if state not in ("on", "off"):
            raise OptionError(f"{option} {path}: pass {name}: state must be on or off, "
                              f"got '{state}'")
    check_pass_names(entries, f"{option} {path}")
    return {name for name, state in entries.items() if state == "off"}


def _json_state(value) -> str:
    """A JSON entry's state: "on"/"off" in any case, or true/false."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value).lower()
