"""Pass switch files: which passes to turn off, as ATC's fusion switch file does for fusions.

Accepted forms, one pass per line (`#` starts a comment):

    FoldConstants: off
    EliminateCommonSubexpressions: on

or a JSON object `{"FoldConstants": "off"}`. A bare name means off.
"""

from __future__ import annotations

import json

from graphopt.errors import OptionError
from graphopt.passes.manager import check_pass_names


def read_switch_file(path: str) -> set[str]:
    """The set of passes the file switches off."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise OptionError(f"--switch-file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise OptionError(f"--switch-file {path}: not a UTF-8 text file") from None
    entries: dict[str, str] = {}
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise OptionError(f"--switch-file {path}: invalid JSON ({e})") from None
        entries = {str(k): str(v).lower() for k, v in data.items()}
    else:
        for number, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            name, _, state = line.partition(":")
            state = state.strip().lower() or "off"
            entries[name.strip()] = state
    for name, state in entries.items():
        if state not in ("on", "off"):
            raise OptionError(f"--switch-file {path}: pass {name}: state must be on or off, "
                              f"got '{state}'")
    check_pass_names(entries, f"--switch-file {path}")
    return {name for name, state in entries.items() if state == "off"}
