"""Checks of the library's keyword arguments: a wrong type or value is an OptionError naming the
argument, as the command line's usage errors name the flag."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from numbers import Integral, Real
from typing import TYPE_CHECKING

from graphopt.errors import OptionError

if TYPE_CHECKING:
    from graphopt.partition.target import Target

_SIZE_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}

# onnxruntime starts every thread it is asked for: 100000 took 16 GB and ignored SIGTERM, and
# 3000 made a 1 ms BERT run take 2 s on 2 cores. The command line and the API bound it alike.
THREAD_LIMIT = 1024


def parse_size(text: str) -> int:
    """Bytes from "1048576", "512K", "4M", "1GiB" (powers of 1024). ValueError when not a size."""
    cleaned = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = _SIZE_UNITS.get(cleaned[-1:], 1)
    number = cleaned[:-1] if cleaned[-1:] in _SIZE_UNITS else cleaned
    try:
        size = int(float(number) * scale)
    except (ValueError, OverflowError):
        raise ValueError(f"'{text}' is not a size such as 1048576, 512K or 4M") from None
    if size < 0:
        raise ValueError(f"'{text}' is negative; give a size such as 512K or 4M")
    return size


def shown(value) -> str:
    """`value` as a message shows it: its repr, or its type where the repr is long (a dict of
    arrays given where a path goes)."""
    text = repr(value)
    return text if len(text) <= 80 else f"a {type(value).__name__} ({text[:60]}…)"


def names(value, what: str) -> list[str]:
    """A name or an iterable of names (None: none)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, Iterable) and not isinstance(value, (bytes, Mapping)):
        items = list(value)
        if all(isinstance(item, str) for item in items):
            return items
    raise OptionError(f"{what}: expected a name or a list of names, got {shown(value)}")


def path(value, what: str) -> str | None:
    """A file or folder path as a str (None stays None); bytes and file descriptors, which
    os.fspath and open() would also take, are refused."""
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        if isinstance(text, str) and text:
            return without_nul(text, what)
    raise OptionError(f"{what}: expected a path (str or os.PathLike), got {shown(value)}")


def without_nul(text: str | bytes, what: str) -> str | bytes:
    """`text` (a path-like's str or bytes), unless it holds a NUL, which no file name can
    (every os call raised a bare ValueError: embedded null byte)."""
    if ("\x00" if isinstance(text, str) else b"\x00") in text:
        raise OptionError(f"{what}: {text!r} holds a NUL character, which no path can")
    return text


def model(value, what: str, takes: str = "an .onnx path, a ModelProto or its bytes"):
    """A model argument as a path (str) or a ModelProto: serialized ONNX bytes are parsed, as
    graphopt.optimize takes them (InputError naming `what` when they are no ONNX model), and
    anything else is refused, saying what `what` `takes`."""
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(value, onnx.ModelProto):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        proto = onnx.ModelProto()
        try:
            proto.ParseFromString(bytes(value))
        except DecodeError as exc:
            from graphopt.errors import InputError

            raise InputError(f"{what}: the {len(value)} bytes given are not an ONNX model "
                             f"({exc})") from None
        from graphopt.ir.onnx_io import check_looks_like_model

        # b"" and a few stray bytes parse into an empty ModelProto, which onnxruntime would
        # then report as a model with no graph or no inputs.
        check_looks_like_model(proto, what, f"the {len(value)} bytes given are not an ONNX model")
        return proto
    if isinstance(value, (str, os.PathLike)):
        if os.fspath(value):
            return without_nul(os.fspath(value), what)
        raise OptionError(f"{what}: expected {takes}, got an empty path")
    # The type, not the value: a loaded OmSession or a dict of arrays says nothing by its repr.
    raise OptionError(f"{what}: expected {takes}, not {type(value).__name__}")


def feeds(value, what: str):
    """Input arrays as a tool takes them: a dict of name → array, an .npz path, or None."""
    if value is None or isinstance(value, Mapping):
        return value
    if isinstance(value, (str, os.PathLike)) and os.fspath(value):
        return value
    raise OptionError(f"{what}: expected a dict of input arrays or an .npz path, "
                      f"got {shown(value)}")


def mapping(value, what: str) -> dict:
    """A dict of settings (None: empty)."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    raise OptionError(f"{what}: expected a dict, got {shown(value)}")


def size(value, what: str) -> int | None:
    """Bytes: an int ≥ 0 or a size text such as "4M" (None stays None)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return parse_size(value)
        except ValueError as exc:
            raise OptionError(f"{what}: {exc}") from None
    if not is_integer(value):
        raise OptionError(f"{what}: expected a number of bytes or a size such as '4M', "
                          f"got {shown(value)}")
    if value < 0:
        raise OptionError(f"{what} must be ≥ 0 bytes, got {value}")
    return int(value)


def tolerance(value, what: str) -> float | None:
    """A finite number ≥ 0 (None stays None): inf would turn a check off, nan fail it always."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Real):
        raise OptionError(f"{what}: expected a number, got {shown(value)}")
    # A numpy float32 1e-3 is 0.0010000000474974513 as a float: its shortest text is what
    # was meant, and what the reports then show.
    narrow = type(value).__module__ == "numpy" and getattr(value, "itemsize", 8) < 8
    number = float(str(value)) if narrow else float(value)
    if not math.isfinite(number) or number < 0:
        raise OptionError(f"{what}: expected a finite number ≥ 0, got {shown(value)}")
    return number


def cosine(value, what: str) -> float | None:
    """A cosine similarity to reach, from -1 to 1 (None stays None): above 1 no output could
    pass, and nan none ever would."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Real) or not -1 <= value <= 1:
        raise OptionError(f"{what} must be between -1 and 1, got {shown(value)}")
    return float(value)


def is_integer(value) -> bool:
    """An int or a NumPy integer, not a bool (which Python would take for 0 or 1)."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def integer(value, what: str) -> int:
    """An int, or a NumPy integer as an int."""
    if not is_integer(value):
        raise OptionError(f"{what}: expected an integer, got {shown(value)}")
    return int(value)


def seed(value, what: str) -> int:
    """A seed for random inputs: an integer ≥ 0 (or a NumPy one), which numpy's generator takes;
    numpy's own refusals of others name no argument (None would seed from the OS: unseeded)."""
    if not is_integer(value) or value < 0:
        raise OptionError(f"{what}: expected an integer ≥ 0, got {shown(value)}")
    return int(value)


def flag(value, what: str) -> bool:
    """True or False: a string such as "no" would otherwise read as true, and [] as false."""
    if not isinstance(value, bool):
        raise OptionError(f"{what}: expected True or False, got {shown(value)}")
    return value


def target(value) -> "Target | None":
    """A target name or profile path loaded; a loaded Target or None as given."""
    from graphopt.partition.target import Target

    if value is None or isinstance(value, Target):
        return value
    if isinstance(value, (str, os.PathLike)):
        from graphopt.partition import load_target

        return load_target(path(value, "target"))
    raise OptionError(f"target: expected a target name, a profile path or a Target, got "
                      f"{shown(value)}")


def check_run_options(verify, inputs, rtol, atol, memory_reorder, loaded_target) -> None:
    """What the command line refuses as a usage error, refused alike (OptionError)."""
    flag(verify, "verify")
    flag(memory_reorder, "memory_reorder")
    if inputs is not None:
        if not verify:
            raise OptionError("inputs: only used with verify=True")
        if not isinstance(inputs, (Mapping, str, os.PathLike)):
            raise OptionError(f"inputs: expected a dict of arrays or an .npz path, got "
                              f"{type(inputs).__name__}")
    tolerance(rtol, "rtol")
    tolerance(atol, "atol")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not verify:  # it would judge nothing, silently
            raise OptionError(f"{name}: only used with verify=True")
    if memory_reorder and loaded_target is None:
        raise OptionError("memory_reorder=True reorders the memory plans of a target's "
                          "partitions: give target=")


def instrument_list(value) -> tuple:
    """Instruments (graphopt.passes.instruments.Instrument or alike) as a tuple: a generator
    is read once, here, and each profile's compile of dynamic_dims sees them all."""
    items = tuple(value) if isinstance(value, Iterable) and not isinstance(value, (str, bytes)) \
        else None
    if items is None or any(not callable(getattr(item, hook, None)) for item in items
                            for hook in ("start", "after_pass", "finish")):
        raise OptionError(f"instruments: expected a list of Instrument objects "
                          f"(graphopt.passes.instruments), got {shown(value)}")
    return items
