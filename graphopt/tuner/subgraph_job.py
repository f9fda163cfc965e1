"""A subgraph tuning job (model, target, level, pins, objective) and the names of its studies:
the model's identity is its bytes and its pinned input shapes."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

from graphopt.errors import OptionError
from graphopt.tuner.subgraph_space import GRANULARITIES


OBJECTIVES = ("estimate", "measured")


@dataclass(frozen=True)
class SubgraphJob:
    """What a trial needs to rebuild its compile (and a worker process its objective)."""

    model_path: str
    target: str
    level: int = 2
    input_shapes: str | None = None       # ATC style, as --input-shape takes it
    objective: str = "estimate"
    tuning_db: str | None = None          # tuned tilings for the estimate's cube kernels
    repeat: int = 20                      # measured: timed runs per candidate
    threads: int | None = None            # measured: onnxruntime intra-op threads
    granularity: str = "rule"             # subgraph_space.GRANULARITIES
    allow_custom_ops: bool = False        # keep ops of unknown domains, as optimize's does
    # sha256 over the serialized model when it was given in memory (a knowledge-base lookup
    # from graphopt.optimize): its identity then, in place of the file's.
    model_digest: Any = field(default=None, repr=False, compare=False)


def model_key(job: SubgraphJob, legacy: bool = False) -> str:
    """A study's model identity: the model file's bytes and the pinned input shapes, these in
    one spelling (`x:1,3;y:1,2` in name order) so that the same pins written in another order
    or with spaces find the same study. `legacy`: the key of a study an earlier graphopt
    named by the pins' text as given."""
    digest = (job.model_digest or _file_digest(job.model_path)).copy()
    pins = job.input_shapes or ""
    digest.update(json.dumps(pins if legacy else _canonical_pins(pins)).encode())
    return digest.hexdigest()[:16]


def _canonical_pins(pins) -> str:
    """The --input-shape pins (text or mapping) as sorted `name:dims` text; the text as given
    when it does not parse (the compile refuses it with the reason)."""
    from graphopt.input_shapes import (format_input_shapes, parse_input_shapes,
                                       validate_input_shapes)

    if not pins:
        return ""
    try:
        shapes = parse_input_shapes(pins) if isinstance(pins, str) else \
            validate_input_shapes(pins)
    except OptionError:
        return pins if isinstance(pins, str) else json.dumps(pins, sort_keys=True)
    return format_input_shapes(dict(sorted(shapes.items())))


# A lookup names a study per objective, granularity and level: the file is read once for all.
_FILE_DIGESTS: dict[tuple, Any] = {}


def _file_digest(path: str):
    """sha256 over the file's bytes, kept while its size and modification time hold."""
    info = os.stat(path)
    key = (os.path.realpath(path), info.st_size, info.st_mtime_ns, info.st_ino)
    digest = _FILE_DIGESTS.get(key)
    if digest is None:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        if len(_FILE_DIGESTS) > 64:
            _FILE_DIGESTS.clear()
        _FILE_DIGESTS[key] = digest
    return digest


# The user attribute of a subgraph study naming the job it tunes (its default study name).
STANDS_FOR = "stands_for"


def study_name_for(job: SubgraphJob, target_name: str, legacy: bool = False) -> str:
    fine = "" if job.granularity == "rule" else f"+{job.granularity}"
    return (f"subgraph/{target_name}/{model_key(job, legacy)}/O{job.level}/"
            f"{job.objective}{fine}")


def study_names(job: SubgraphJob, target_name: str) -> list[str]:
    """The names a study of `job` may have: today's, then an earlier graphopt's."""
    return list(dict.fromkeys(study_name_for(job, target_name, legacy)
                              for legacy in (False, True)))


def checked_target(job: SubgraphJob):
    """The job's target, once its options agree with each other (OptionError otherwise)."""
    from graphopt.partition import load_target

    if job.objective not in OBJECTIVES:
        raise OptionError(f"--objective {job.objective}: use one of {', '.join(OBJECTIVES)}")
    if job.granularity not in GRANULARITIES:
        raise OptionError(f"--granularity {job.granularity}: use one of "
                          f"{', '.join(GRANULARITIES)}")
    target = load_target(job.target)
    if job.objective == "measured" and target.device(target.primary).kind != "cpu":
        raise OptionError(f"--objective measured times onnxruntime on this machine's CPU: it "
                          f"needs a CPU target, not {target.shown} (use --objective estimate)")
    return target
