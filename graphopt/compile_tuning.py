"""The knowledge base in a compile: the subgraph decisions optimize(tuning_db=…) applies, as
`graphopt optimize --tuning-db` finds them, and the file save() takes the tilings from."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from graphopt.api_args import path
from graphopt.errors import OptionError
from graphopt.input_shapes import format_input_shapes
from graphopt.option_names import from_command_line, setting

if TYPE_CHECKING:
    from graphopt.compile_result import OptimizeResult


@dataclass(frozen=True)
class Decisions:
    """What a knowledge base holds for one compile: the tuned rewrite gate and pass options
    (None when it holds none), the study they came from, and the note to show."""

    gate: Any = None
    pass_options: dict | None = None
    study: str | None = None
    note: str = ""


_NO_DECISIONS = Decisions()
# The .om's extra section naming the subgraph study whose decisions the compile applied, the
# one `graphopt report` describes: the storage may hold several of the model (--study NAME).
EXTRA_SUBGRAPH_STUDY = "subgraph_study"


def tuned_decisions(tuning_db, model, target, level: int, pins: dict,
                    input_shapes) -> Decisions:
    """The knowledge base's subgraph decisions for this compile (empty without tuning_db),
    looked up as `graphopt optimize --tuning-db` does: by the model file's bytes (or the
    serialized model given in memory), the --input-shape text, the target and the level."""
    if tuning_db is None:
        return _NO_DECISIONS
    from graphopt.tuner.subgraph_lookup import decisions_for

    if target is None:  # before the file: with a target, a missing file is still refused
        raise OptionError("tuning_db applies what `graphopt tune` found for a target: give "
                          "target=")
    tuning_db = knowledge_base(tuning_db)
    if isinstance(model, (str, os.PathLike)):
        source = os.fspath(model)
    else:
        source = model if isinstance(model, bytes) else model.SerializeToString()
    shapes = input_shapes if isinstance(input_shapes, str) else (
        format_input_shapes(pins) if pins else None)
    return decisions_for(tuning_db, source, target.name, level, shapes)


def knowledge_base(tuning_db) -> str | None:
    """`tuning_db` as a str, refused when it names a file that does not exist (a URL is
    checked when it is opened)."""
    tuning_db = path(tuning_db, "tuning_db")
    if tuning_db is not None and "://" not in tuning_db and os.path.isdir(tuning_db):
        raise OptionError(f"{setting('tuning_db', tuning_db)}: is a directory, expected a "
                          "knowledge-base file")
    if tuning_db is not None and "://" not in tuning_db and not os.path.isfile(tuning_db):
        tune = "graphopt tune --tuning-db FILE" if from_command_line() else "graphopt tune"
        raise OptionError(f"{setting('tuning_db', tuning_db)}: no such knowledge base (`{tune}` "
                          "creates one)")
    return tuning_db


def record_tuning(result: "OptimizeResult", tuning_db, tuned) -> None:
    """Keep the knowledge base on the result (save takes its tilings from it) and say which
    subgraph decisions applied."""
    if tuning_db is None:
        return
    text = os.fspath(tuning_db)
    # A path is kept absolute: save() may run after a chdir, or in another process.
    result.tuning_db = text if "://" in text else os.path.abspath(text)
    result.tuned_study = tuned.study
    if tuned.note:
        result.notes.insert(0, tuned.note)


def applied_study(result: "OptimizeResult") -> dict:
    """The .om's extra section naming the subgraph study whose decisions the compile applied;
    empty when it applied none."""
    return {EXTRA_SUBGRAPH_STUDY: result.tuned_study} if result.tuned_study else {}
