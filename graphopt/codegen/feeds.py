"""Feeds for an artifact's signature: seeded random inputs, checks against it, and .npz files."""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Mapping

import numpy as np
from onnx import helper

from graphopt.atomic import atomic_write
from graphopt.codegen.om_manifest import dtype_from_name
from graphopt.errors import GraphoptError, InputError


def numpy_dtype(dtype: str | None) -> np.dtype | None:
    """The numpy dtype of a manifest dtype name; None when numpy cannot name it (bfloat16, …)."""
    if dtype is None:
        return None
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(dtype_from_name(dtype)))
    except (KeyError, TypeError, ValueError):
        return None


def describe(entry: Mapping) -> str:
    """A signature entry as `float32[N,4]` (`?` for an unknown dtype, rank or dim)."""
    shape = entry["shape"]
    dims = "?" if shape is None else ",".join("?" if d is None else str(d) for d in shape)
    return f"{entry['dtype'] or '?'}[{dims}]"


def random_feeds(signature: list[Mapping], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded arrays for a signature, drawn as numerics.random_feeds draws them: normal floats,
    integers in {0, 1} (safe as indices into any non-empty axis), random booleans.

    Raises InputError naming the input and dim when a shape is not fully static or a dtype has
    no numpy equivalent: there is no size to invent that the model would accept.
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    for entry in signature:
        name, shape = entry["name"], entry["shape"]
        if shape is None:
            raise InputError(f"input {name!r} has an unknown rank, so random data cannot be made for it")
        for axis, dim in enumerate(shape):
            if not isinstance(dim, int):
                what = f"'{dim}'" if isinstance(dim, str) else "unknown"
                raise InputError(f"input {name!r} ({describe(entry)}) has a dynamic dim {axis} ({what}), "
                                 "so random data cannot be made for it")
        if entry["dtype"] == "string":
            feeds[name] = np.full(shape, "a", dtype=object)
            continue
        dtype = numpy_dtype(entry["dtype"])
        if dtype is None:
            raise InputError(f"input {name!r} has dtype {entry['dtype'] or 'unknown'}, for which "
                             "numpy has no type to make random data with")
        if dtype == np.bool_:
            data = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer):
            data = rng.integers(0, 2, size=shape)
        elif np.issubdtype(dtype, np.complexfloating):
            data = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
        else:
            data = rng.standard_normal(shape)
        # np.asarray: a 0-d draw comes back as a numpy scalar, which onnxruntime refuses.
        feeds[name] = np.asarray(data).astype(dtype)
    return feeds


def check_feeds(signature: list[Mapping], feeds: Mapping[str, np.ndarray]) -> None:
    """Raise InputError on the first feed that does not fit the signature: a missing or unknown
    name, a wrong dtype, rank or static dim. (OmSession.run checks the same on every call; this
    lets a caller report a bad file before it times anything.)"""
    expected = {entry["name"]: entry for entry in signature}
    for name in feeds:
        if name not in expected:
            raise InputError(f"unknown input {name!r}; the model's inputs are: "
                             f"{', '.join(expected) or '(none)'}")
    for name, entry in expected.items():
        if name not in feeds:
            raise InputError(f"missing input {name!r} ({describe(entry)})")
        array = np.asarray(feeds[name])
        dtype = numpy_dtype(entry["dtype"])
        if entry["dtype"] == "string":
            ok = array.dtype.kind in "OUS"
        else:
            ok = dtype is None or array.dtype == dtype
        if not ok:
            raise InputError(f"input {name!r} has dtype {array.dtype}, expected {describe(entry)}")
        shape = entry["shape"]
        if shape is None:
            continue
        if array.ndim != len(shape):
            raise InputError(f"input {name!r} has shape {list(array.shape)} (rank {array.ndim}), "
                             f"expected {describe(entry)}")
        for axis, (got, want) in enumerate(zip(array.shape, shape)):
            if isinstance(want, int) and got != want:
                raise InputError(f"input {name!r} has shape {list(array.shape)}, expected "
                                 f"{describe(entry)} (dim {axis} must be {want})")


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The named arrays of an .npz (np.savez(path, x=…)); InputError naming the file otherwise.
    Never unpickles: object arrays are refused."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected an .npz file")
    if not zipfile.is_zipfile(path):
        raise InputError(f"{path}: not an .npz archive of named arrays "
                         "(write one with np.savez(path, input_name=array, …))")
    arrays = {}
    try:
        with np.load(path, allow_pickle=False) as data:
            for name in data.files:
                arrays[name] = data[name]
    except ValueError as exc:
        # numpy's message for object arrays mentions allow_pickle, a knob the user does not have.
        reason = "it holds object arrays, which would need unpickling" if "pickle" in str(exc) else exc
        raise InputError(f"{path}: cannot read as .npz ({reason})") from None
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise InputError(f"{path}: cannot read as .npz ({exc})") from None
    return arrays


def save_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> None:
    """Write arrays to an .npz atomically: `path` ends up complete or as it was.

    Written entry by entry rather than with np.savez(**arrays) so that any tensor name works,
    including ones that collide with np.savez's own parameters ("file", "allow_pickle").
    """
    path = os.fspath(path)
    try:
        with atomic_write(path) as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as zf:
            for name, array in arrays.items():
                array = np.asanyarray(array)
                if array.dtype == object and all(isinstance(v, str) for v in array.flat):
                    array = array.astype(str)  # onnxruntime returns strings as objects; store them plainly
                with zf.open(f"{name}.npy", "w", force_zip64=True) as entry:
                    np.lib.format.write_array(entry, array, allow_pickle=False)
    except ValueError as exc:  # write_array refuses object arrays without pickling
        raise GraphoptError(f"cannot write {path}: {exc}") from None
    except OSError as exc:
        raise GraphoptError(f"cannot write {path}: {exc.strerror or exc}") from None
