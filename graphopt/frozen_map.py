"""`FrozenMap`: a read-only mapping that pickles, which `types.MappingProxyType` does not."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


class FrozenMap(Mapping):
    """A read-only view of its own copy of `items`: assignment raises, as for a
    MappingProxyType, and an OptimizeResult holding one can still go to another process."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping | Any = ()):
        self._items = dict(items)

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self) -> Iterator:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key) -> bool:
        return key in self._items

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"

    def __reduce__(self):
        return FrozenMap, (self._items,)
