"""The runtime's hot-path test: are these feeds plainly what the signature declares?"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np


class _Input(NamedTuple):
    name: str
    dtype: np.dtype
    static: tuple | None  # the whole shape when every dim is a number
    rank: int
    fixed: tuple  # (axis, size) of each numbered dim, when some dim is symbolic
    strings: bool  # an object array of str elements, as onnxruntime takes and gives strings


class PlainFeeds(NamedTuple):
    """What `plain` compares feeds with: built once per session from its signature."""

    inputs: tuple
    # (input, axis, input, axis) of dims that one symbolic name gives two inputs (or two axes
    # of one), each pair against the first place the name occurs.
    shared: tuple


def plain_feeds(expected: Mapping[str, tuple[Mapping, Any]],
                shared: Mapping[str, list[tuple[str, int]]]) -> PlainFeeds | None:
    """The test for a signature of tensors of known rank (`expected`: name → (entry, numpy
    dtype), `shared`: feeds.shared_dims); None when some input is anything else (a sequence,
    map or optional, a tensor of unknown rank or dtype), which only the general checks take."""
    inputs = []
    for name, (entry, dtype) in expected.items():
        shape = entry.get("shape")
        if "type" in entry or dtype is None or shape is None:
            return None
        numbered = [isinstance(dim, int) for dim in shape]
        inputs.append(_Input(name, dtype, tuple(shape) if all(numbered) else None, len(shape),
                             tuple((axis, dim) for axis, dim in enumerate(shape)
                                   if numbered[axis]), entry["dtype"] == "string"))
    pairs = tuple((first[0], first[1], name, axis) for places in shared.values()
                  for first in places[:1] for name, axis in places[1:])
    return PlainFeeds(tuple(inputs), pairs)


def plain(feeds: Any, spec: PlainFeeds) -> bool:
    """Whether `feeds` is a dict of exactly the declared inputs as numpy arrays of their
    dtypes, ranks and numbered dims, agreeing on every shared symbolic dim: feeds the general
    checks would pass unchanged. numpy's dtypes are singletons: `is` settles the usual case
    without numpy's comparison code, which a run's kernels have evicted from the caches by the
    next call."""
    inputs = spec.inputs
    if type(feeds) is not dict or len(feeds) != len(inputs):
        return False
    for name, dtype, static, rank, fixed, strings in inputs:
        array = feeds.get(name)
        if type(array) is not np.ndarray or (array.dtype is not dtype and array.dtype != dtype):
            return False
        if strings and not only_str(array):  # bytes would reach the model as "b'…'"
            return False
        shape = array.shape
        if static is not None:
            if shape != static:
                return False
            continue
        if len(shape) != rank:
            return False
        for axis, size in fixed:
            if shape[axis] != size:
                return False
    for name, axis, other, other_axis in spec.shared:
        if feeds[name].shape[axis] != feeds[other].shape[other_axis]:
            return False
    return True


def only_str(array: np.ndarray) -> bool:
    """Whether every element of an object array is exactly a str, in one C-level pass (a loop
    of isinstance took twice as long, more than onnxruntime's own run of a LabelEncoder over
    200,000 rows). A subclass is left to the general checks, which pass on the str it holds."""
    return set(map(type, array.flat)) <= {str}


__all__ = ["PlainFeeds", "only_str", "plain", "plain_feeds"]
