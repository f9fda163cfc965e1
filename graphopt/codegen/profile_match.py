"""Choosing an .om's shape profile for a run: the one whose input shapes the feeds have."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from graphopt.errors import InputError
from graphopt.option_names import option

Plan = TypeVar("Plan")
_MISSING = object()


def profiles_count(count: int) -> str:
    """`4 shape profiles`, `1 shape profile`: an artifact may well have one (one batch size)."""
    return f"{count} shape profile{'' if count == 1 else 's'}"


def dims_label(dims: Mapping[str, int]) -> str:
    """A profile's dims as people read them: `batch=4, seq=128`."""
    return ", ".join(f"{key}={value}" for key, value in dims.items())


class ProfileMatcher(Generic[Plan]):
    """Maps the input shapes of a run to its profile's plan. A profile whose inputs are all
    static is found by one dict lookup (the serving hot path); one that leaves a dim dynamic
    (a dim no profile pinned) matches any size there, and is tried in profile order after.
    A profile whose plan is None was not opened: inputs that fit it are refused, saying so."""

    def __init__(self, input_names: list[str], profiles: list[tuple[dict, Plan | None]]) -> None:
        self._names = tuple(input_names)
        self._exact: dict[tuple, Plan] = {}
        self._patterns: list[tuple[tuple, Plan]] = []
        self._labels: list[str] = []
        self._unopened: list[tuple[tuple, str]] = []  # (pattern, label): for the error only
        for entry, plan in profiles:
            shapes = {e["name"]: e["shape"] for e in entry["inputs"]}
            pattern = tuple(None if shapes[n] is None else tuple(
                d if isinstance(d, int) else None for d in shapes[n]) for n in self._names)
            if all(s is not None and None not in s for s in pattern):
                self._exact.setdefault(pattern, plan)
            else:
                self._patterns.append((pattern, plan))
            self._labels.append(f"{entry['name']} ({dims_label(entry['dims'])})")
            if plan is None:
                self._unopened.append((pattern, self._labels[-1]))

    def select(self, feeds: Mapping[str, Any]) -> Plan:
        """The plan for `feeds` (checked against the signature already); GraphoptError naming
        the shapes and the profiles when none fits."""
        # A sequence or optional input (a list, None) has no shape: its pattern is None.
        shapes = tuple(getattr(feeds[name], "shape", None) for name in self._names)
        plan = self._exact.get(shapes, _MISSING)
        if plan is _MISSING:
            plan = next((candidate for pattern, candidate in self._patterns
                         if _fits(pattern, shapes)), _MISSING)
        if plan is not None and plan is not _MISSING:
            return plan
        given = ", ".join(f"{n}{list(s)}" for n, s in zip(self._names, shapes) if s is not None)
        if plan is None:
            label = next(label for pattern, label in self._unopened if _fits(pattern, shapes))
            raise InputError(f"input shapes {given} fit shape profile {label}, which this "
                                "session did not open (load(..., profiles=[…]) chose which)")
        raise InputError(f"input shapes {given} fit none of the model's "
                            f"{len(self._labels)} shape profiles: {'; '.join(self._labels)} "
                            f"(compile with {option('dynamic_dims')} listing these sizes)")


def _fits(pattern: tuple, shapes: tuple) -> bool:
    """Whether input `shapes` fit a profile's `pattern` (None: a dim or input left open)."""
    return all(p is None or (len(p) == len(s) and all(d is None or d == g for d, g in zip(p, s)))
               for p, s in zip(pattern, shapes))
