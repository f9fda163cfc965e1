"""One parse of a model file for several imports of it (the shape profiles of one compile)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from onnx import ModelProto

# The IR keeps each initializer's TensorProto (for lossless export) and no pass writes to one,
# so imports of one parsed proto share the weights' bytes: --dynamic-dims imports the model once
# per profile, and BERT-base with 6 profiles peaked at 3.54 GB of RSS with a parse each, 1.24 GB
# with one (the .om is the same, byte for byte).
_PARSES: ContextVar[dict | None] = ContextVar("graphopt_shared_parses", default=None)


@contextmanager
def shared_parses() -> Iterator[None]:
    """Inside the block, load_onnx parses each model file once (while it stays unchanged)."""
    token = _PARSES.set({})
    try:
        yield
    finally:
        _PARSES.reset(token)


def parsed(path: str, read: Callable[[str], ModelProto]) -> ModelProto:
    """`read(path)`, or inside shared_parses the proto an earlier call read from that file."""
    parses = _PARSES.get()
    if parses is None or not os.path.isfile(path):  # read says what is wrong with the path
        return read(path)
    info = os.stat(path)
    key = (os.path.realpath(path), info.st_size, info.st_mtime_ns, info.st_ino)
    if key not in parses:
        parses[key] = read(path)
    return parses[key]
