"""Calibration samples: read an .npz (a batch of samples per input) or a directory of .npz
files (one sample each), check them against the model's inputs, yield one feed dict at a time.

Layouts, for a model input `x` of rank R:
  * one file `calib.npz`: `x` has rank R + 1, samples along its first axis; or rank R when the
    input's first dim is 1 or symbolic, then each slice x[i:i+1] is a sample; but when every
    array has its input's rank, their first axes differ, and an input's first dim is a fixed
    size above 1 (a graph net's [nodes, 16] beside [2, edges]), the file is one sample;
  * a directory: every `*.npz` in it (sorted by name) is one sample, `x` of rank R.
Every non-initializer input needs an array, dims the model fixes must match, float values must
fit the input's type (a NaN or Inf among finite values is data: a missing value an Imputer
fills), and a float (or integer) array is cast to the input's float (or integer) type; anything
else is an error that names the file and the input.

An input whose first dim the model (or a shape profile) fixes at B > 1 takes samples of batch 1
too: B consecutive samples are stacked into one, the last batch wrapping around to the first
samples. So one calibration set serves every profile of `--dynamic-dims "batch:1,8"`.
Under a shape profile's compile (profile_samples), a directory whose files hold several shapes
calibrates on the files that fit the profile: one set of 16×16 and 32×24 images serves
`--dynamic-dims "H=16,W=16;H=32,W=24"`.
"""

from __future__ import annotations

import glob
import os
import tokenize
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from graphopt.errors import OptionError

if TYPE_CHECKING:
    from graphopt.passes.base import PassContext
from graphopt.ir import Graph
from graphopt.option_names import option


class CalibrationShapeError(OptionError):
    """Calibration samples of other shapes than the model's (or a shape profile's) inputs.
    `matched` counts the inputs of the sample that fitted before this one: of several shape
    profiles, the one that came closest names the real mismatch."""

    matched = 0


# Set while a shape profile compiles: its calibration keeps a directory's files that fit it,
# and adds them to this set (a file no profile used is refused after them all).
_PROFILE_SAMPLES: ContextVar[set | None] = ContextVar("graphopt_profile_samples", default=None)


# What numpy's .npy header parser raises for a header it cannot tokenize (cut mid-dict).
_BAD_HEADER = (SyntaxError, tokenize.TokenError)


@contextmanager
def profile_samples(used: set) -> Iterator[None]:
    """Within: a calibration directory's files of other shapes than the model's are left out,
    not refused, where some fit (they fit another shape profile); those used go into `used`."""
    token = _PROFILE_SAMPLES.set(used)
    try:
        yield
    finally:
        _PROFILE_SAMPLES.reset(token)


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: np.dtype
    shape: tuple  # ints, or None/str for dims the model leaves open


# The option a message names the data by, where the data came through another than
# --calibration (compare's --samples reads the same layouts).
_OPTION: ContextVar[str | None] = ContextVar("calibration_option", default=None)


@contextmanager
def read_as(flag: str) -> Iterator[None]:
    """Calibration data read inside the block is named in messages as `flag`'s."""
    token = _OPTION.set(flag)
    try:
        yield
    finally:
        _OPTION.reset(token)


def _option() -> str:
    return _OPTION.get() or option("calibration")


def calibration_label(path) -> str:
    """The calibration data as a message names it: `--calibration x.npz` from the command line,
    `calibration x.npz` from Python (or the option read_as names)."""
    return f"{_option()} {path}"


def model_inputs(graph: Graph) -> list[InputSpec]:
    """The inputs a caller feeds: graph inputs without an initializer."""
    specs = []
    for value in graph.inputs:
        if value.const is not None or value.dtype is None:
            continue
        shape = tuple(value.shape) if value.shape is not None else None
        specs.append(InputSpec(value.name, value.dtype.numpy, shape))
    return specs


@dataclass
class CalibrationData:
    """Validated samples; iterating yields one {input name: array} feed per sample, read lazily
    for a directory (only one sample's arrays are in memory at a time)."""

    path: str
    specs: list[InputSpec]
    files: list[str]        # directory layout: one file per sample
    batch: dict | None      # single-file layout: name -> array with samples along axis 0
    count: int
    stack: int = 1          # directory layout: files stacked into one batch (see the docstring)
    given: int = 0          # samples of batch 1 the data holds, when stacked into batches
    fixed: tuple = ()       # initializers the model lets a caller override: not fed here

    def __len__(self) -> int:
        return self.count

    @property
    def samples(self) -> int:
        """How many samples of batch 1 the data holds: as given, where they were stacked into
        the batches of a model fixed at batch B > 1; else one a feed (a first dim fixed above
        1 may be no batch at all: silero-vad's state is [2, 1, 128])."""
        return self.given or self.count

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self.batch is not None:
            for i in range(self.count):
                yield {s.name: _cast(self.batch[s.name][i], s, self.path) for s in self.specs}
            return
        for group in _groups(self.files, self.stack):
            samples = [_file_sample(file, self.specs, self.stack, fixed=self.fixed)
                       for file in group]
            yield {s.name: _joined(s.name, [sample[s.name] for sample in samples], group)
                   for s in self.specs}


def _joined(name: str, arrays: list[np.ndarray], files: list[str]) -> np.ndarray:
    """One batch of a directory's sample files: stacked along the batch axis, but a scalar
    input (silero-vad's sample rate `sr`) has none, and must be one value for the batch."""
    if len(arrays) == 1:
        return arrays[0]
    if np.ndim(arrays[0]) > 0:
        return np.concatenate(arrays)
    if any(not np.array_equal(a, arrays[0]) for a in arrays[1:]):
        raise OptionError(f"{_option()}: input '{name}' is a scalar, one value for "
                          f"a batch, and {files[0]} and the files batched with it give "
                          "different ones")
    return arrays[0]


def read_calibration(path: str | os.PathLike, graph: Graph | list[InputSpec]) -> CalibrationData:
    """Open `path` (an .npz or a directory of them) as calibration data for `graph`'s inputs (or
    for the inputs `graph` lists, when it is a list of InputSpec)."""
    path = os.fspath(path)
    specs = graph if isinstance(graph, list) else model_inputs(graph)
    fixed = () if isinstance(graph, list) else tuple(graph.overridable_inputs())
    if not specs:
        raise OptionError(f"{calibration_label(path)}: the model has no inputs to feed")
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.npz")))
        if not files:
            raise OptionError(f"{calibration_label(path)}: the directory holds no .npz files "
                              "(one sample per file: np.savez(f, input_name=array, …))")
        used = _PROFILE_SAMPLES.get()
        if used is not None:
            fits = _fitting(files, specs, fixed)
            used.update(fits)  # not the files a profile none of whose fit had to refuse
            files = fits or files
        # Check the first file up front so a bad layout fails before any inference runs;
        # the others are checked as they are read.
        arrays = _load(files[0])
        _check_names(arrays, specs, files[0], fixed)
        stack = _stack_size(arrays, specs)
        _file_sample(files[0], specs, stack, arrays)
        return CalibrationData(path, specs, files, None, -(-len(files) // stack), stack,
                               len(files) if stack > 1 else 0, fixed)
    if not os.path.exists(path):
        raise OptionError(f"{calibration_label(path)}: no such file or directory")
    arrays = _load(path)
    _check_names(arrays, specs, path, fixed)
    batch, counts, given = {}, {}, 0
    scalars = {}  # a rank-0 input given once (a sample rate): the same in every sample
    firsts = {}   # each input's first sample
    for s in specs:
        array = arrays[s.name]
        if s.shape == () and array.ndim == 0:
            scalars[s.name] = array[None]
            continue
        if s.shape is not None and array.ndim == len(s.shape) and len(s.shape):
            array = array[:, None]  # [S, …] → S samples of [1, …]
        stack = _batch_of(s)
        if stack > 1 and array.ndim == len(s.shape) + 1 and array.shape[1] == 1:
            given = max(given, array.shape[0])
            array = _stacked(array, stack)
        if s.shape is not None and array.ndim != len(s.shape) + 1:
            raise OptionError(
                f"{calibration_label(path)}: "
                f"input '{s.name}' has shape {list(array.shape)}; expected "
                f"samples × {_shape_text(s.shape)} (rank {len(s.shape) + 1}), or the input's "
                "own shape when its first dim is 1 or symbolic")
        _check_finite(array, s, path)
        _check_integer_range(array, s, path)
        for i in range(min(1, array.shape[0])):
            try:
                firsts[s.name] = _checked(array[i], s, path)
            except CalibrationShapeError as exc:
                exc.matched = len(firsts)
                raise
        batch[s.name], counts[s.name] = array, array.shape[0]
    _refuse_empty(firsts, path)
    if len(set(counts.values())) > 1 and _no_common_sample_axis(arrays, specs):
        # A graph net's x of [nodes, features] beside edge_index of [2, edges]: the file is one
        # sample, as `--inputs` reads it.
        return _one_sample(path, specs, arrays)
    if len(set(counts.values())) > 1:
        raise OptionError(f"{calibration_label(path)}: inputs hold different sample counts "
                          f"({', '.join(f'{k}: {v}' for k, v in counts.items())}); for inputs "
                          "whose sizes differ from sample to sample (a bag of ids with its "
                          "offsets), give a directory of .npz files, one sample each")
    count = next(iter(counts.values()), 1)
    if count == 0:
        raise OptionError(f"{calibration_label(path)}: "
                          "no samples (the arrays' first axis is empty)")
    for s in specs:
        if s.name in scalars:  # as --inputs takes it: the scalar itself, checked like a sample
            _check_finite(scalars[s.name], s, path)
            _check_integer_range(scalars[s.name], s, path)
            _checked(scalars[s.name][0], s, path)
            batch[s.name] = np.repeat(scalars[s.name], count, axis=0)
    return CalibrationData(path, specs, [], batch, count, given=given)


def unused_files(path, used: set) -> list[str]:
    """The files of a calibration directory that no shape profile's compile took."""
    if not os.path.isdir(path):
        return []
    return [f for f in sorted(glob.glob(os.path.join(path, "*.npz"))) if f not in used]


def _fitting(files: list[str], specs: list[InputSpec], fixed: tuple) -> list[str]:
    """The files whose shapes fit `specs`: as a sample each, or as a batch-1 sample of the
    larger batch an input fixes, which B files stack into."""
    stacks = dict.fromkeys((1, *(_batch_of(s) for s in specs)))
    fits = []
    for file in files:
        for stack in stacks:
            try:
                _file_sample(file, specs, stack, fixed=fixed)
            except CalibrationShapeError:
                continue
            fits.append(file)
            break
    return fits


def _no_common_sample_axis(arrays, specs: list[InputSpec]) -> bool:
    """Whether every array has its input's own rank, the inputs' first dims differ, and one
    of them is a fixed size that its array has (edge_index's 2, a recurrent state's 1 beside
    a batch of 4 frames, as `--inputs` holds them): a first axis no samples are stacked
    along. Two batch dims of other names (torch's `*_dynamic_axes_1`) with unequal counts
    stay an error."""
    if not all(s.shape and np.asarray(arrays[s.name]).ndim == len(s.shape) for s in specs):
        return False
    fixed = any(isinstance(s.shape[0], int) and s.shape[0] >= 1
                and np.asarray(arrays[s.name]).shape[0] == s.shape[0] for s in specs)
    return fixed and len({s.shape[0] for s in specs}) > 1


def _one_sample(path: str, specs: list[InputSpec], arrays) -> CalibrationData:
    batch = {}
    for s in specs:
        _checked(np.asarray(arrays[s.name]), s, path)
        batch[s.name] = np.asarray(arrays[s.name])[None]
    _refuse_empty({name: array[0] for name, array in batch.items()}, path)
    return CalibrationData(path, specs, [], batch, 1)


def _batch_of(spec: InputSpec) -> int:
    """The batch B > 1 the input fixes as its first dim, or 1."""
    first = spec.shape[0] if spec.shape else None
    return first if isinstance(first, int) and first > 1 else 1


def _stacked(samples: np.ndarray, batch: int) -> np.ndarray:
    """[S, 1, …] samples as [ceil(S / batch), batch, …], the last wrapping to the first."""
    count = -(-len(samples) // batch)
    order = np.arange(count * batch) % len(samples)
    return samples[order].reshape(count, batch, *samples.shape[2:])


def _stack_size(arrays: dict, specs: list[InputSpec]) -> int:
    """How many batch-1 sample files make one sample of a directory (1: a file is a sample)."""
    sizes = {_batch_of(s) for s in specs if s.shape  # a scalar has no batch axis to stack
             and np.ndim(arrays[s.name]) == len(s.shape) and np.shape(arrays[s.name])[0] == 1}
    return max(sizes, default=1)


def _groups(files: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(files), size):
        group = files[start:start + size]
        yield group + files[: size - len(group)]  # the last group wraps to the first files


def _file_sample(file: str, specs: list[InputSpec], stack: int,
                 arrays: dict | None = None, fixed: tuple = ()) -> dict[str, np.ndarray]:
    """One directory file's arrays, checked; with `stack` > 1, each of batch 1, checked as
    1/stack of the input's batch."""
    if arrays is None:
        arrays = _load(file)
        _check_names(arrays, specs, file, fixed)
    out = {}
    for s in specs:
        spec = s
        if stack > 1 and _batch_of(s) == stack:
            spec = InputSpec(s.name, s.dtype, (1, *s.shape[1:]))
        try:
            out[s.name] = _checked(arrays[s.name], spec, file)
        except CalibrationShapeError as exc:
            exc.matched = len(out)
            raise
    _refuse_empty(out, file)
    return out


def check_calibration(path: str | os.PathLike, graph: Graph) -> CalibrationData:
    """read_calibration, with every file of a directory read and checked too, not only the
    first: the compile calls this before any pass runs, so that bad data fails at once with the
    file and input at fault rather than after the pipeline, inside the pass that reads it."""
    data = read_calibration(path, graph)
    for file in data.files[1:]:
        _file_sample(file, data.specs, data.stack, fixed=data.fixed)
    return data


def _load(file: str) -> dict[str, np.ndarray]:
    # Not a zip, numpy tries it as a pickle and says to "load it unsafely": never the advice.
    try:
        with open(file, "rb") as handle:
            head = handle.read(6)
    except OSError as e:  # a dangling link or a folder named *.npz in a directory of samples
        raise OptionError(f"{calibration_label(file)}: cannot read it "
                          f"({e.strerror or e})") from None
    if not head.startswith((b"\x93NUMPY", b"PK")):  # a damaged zip gets numpy's reason
        raise OptionError(f"{calibration_label(file)}: "
                          "not an .npz archive of named arrays (write one "
                          "with np.savez(path, input_name=array, …))")
    try:
        data = np.load(file, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, *_BAD_HEADER) as e:
        raise OptionError(f"{calibration_label(file)}: cannot read as .npz of named arrays "
                          f"({_unpickling(e)})") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise OptionError(f"{calibration_label(file)}: "
                          "one unnamed array (.npy); the inputs go in an "
                          ".npz by name: np.savez(path, input_name=array, …)")
    with data:
        arrays = {}
        twice = {n for n in data.files if data.files.count(n) > 1}
        if twice:  # numpy reads the last of them: which one was meant, nothing says
            raise OptionError(f"{calibration_label(file)}: '{sorted(twice)[0]}' is in it "
                              "twice (write the file with np.savez(path, input_name=array, …))")
        for name in data.files:
            # Members are read lazily: a damaged or pickled one fails here, not at np.load.
            try:
                arrays[name] = data[name]
            except (OSError, ValueError, EOFError, zipfile.BadZipFile, *_BAD_HEADER) as e:
                raise OptionError(f"{calibration_label(file)}: cannot read array '{name}' "
                                  f"({_unpickling(e)})") from None
            except MemoryError:  # a header declaring 2**40 elements over 64 bytes of data
                raise OptionError(f"{calibration_label(file)}: cannot read array '{name}' (its "
                                  "header declares more elements than memory holds)") from None
            if not isinstance(arrays[name], np.ndarray):  # numpy gives other members' bytes
                raise OptionError(f"{calibration_label(file)}: '{name}' in it is not an .npy "
                                  "array (write the file with np.savez(path, input_name=array, "
                                  "…))")
        return arrays


def _unpickling(error: Exception) -> str:
    """numpy's reason, unless it speaks of allow_pickle, a knob the user does not have."""
    if "pickle" not in str(error):
        return str(error)
    return ("it holds object arrays, which would need unpickling; strings go in as numpy's "
            "strings: np.array(values, dtype=str)")


def _check_names(arrays: dict, specs: list[InputSpec], file: str, fixed: tuple = ()) -> None:
    names = [s.name for s in specs]
    overridden = sorted(set(arrays) & set(fixed))
    if overridden:
        raise OptionError(f"{calibration_label(file)}: '{overridden[0]}' is an initializer the "
                          "model lets a caller override; calibration runs the model at its "
                          "value, as the compile takes it (an .om fixes it and takes no such "
                          "feed): drop it from the file")
    missing = [n for n in names if n not in arrays]
    if missing:
        raise OptionError(f"{calibration_label(file)}: no array for model input '{missing[0]}' "
                          f"(the file has: {', '.join(sorted(arrays)) or 'nothing'})")
    extra = sorted(set(arrays) - set(names))
    if extra:
        raise OptionError(f"{calibration_label(file)}: '{extra[0]}' is not an input of the model "
                          f"(inputs: {', '.join(names)})")


def _shape_text(shape) -> str:
    return "[" + ",".join(str(d) if isinstance(d, int) else (d or "?") for d in shape) + "]"


def _refuse_empty(sample: dict[str, np.ndarray], file: str) -> None:
    """An empty batch, as a single file's check says it (a directory's file was said to have
    shape [0, 3, 32, 32] where [1, 3, 32, 32] was expected): every input of the sample empty
    along its first axis. One input may be empty where its first dim is named (a CastLike's
    `like` input of shape [0]: it had been refused as "no samples")."""
    shaped = {name: np.shape(array) for name, array in sample.items() if np.ndim(array)}
    if not shaped or any(shape[0] for shape in shaped.values()):
        return
    if len(shaped) == 1:
        ((name, shape),) = shaped.items()
        raise OptionError(f"{calibration_label(file)}: no samples (input '{name}' has an "
                          f"empty first axis: shape {list(shape)})")
    listed = ", ".join(f"'{name}' {list(shape)}" for name, shape in shaped.items())
    raise OptionError(f"{calibration_label(file)}: no samples (every input has an empty first "
                      f"axis: {listed})")


def _checked(array: np.ndarray, spec: InputSpec, file: str) -> np.ndarray:
    if array.ndim and not array.shape[0] and spec.shape and isinstance(spec.shape[0], int) \
            and spec.shape[0] != 0:  # a fixed size of 1 or more, given empty
        raise OptionError(f"{calibration_label(file)}: no samples (input '{spec.name}' has an "
                          f"empty first axis: shape {list(array.shape)})")
    if spec.shape is not None:
        bad = array.ndim != len(spec.shape) or any(
            isinstance(d, int) and d != n for d, n in zip(spec.shape, array.shape))
        if bad:
            raise CalibrationShapeError(
                f"{calibration_label(file)}: input '{spec.name}' sample has shape "
                f"{list(array.shape)}; the model expects {_shape_text(spec.shape)}")
    _check_finite(array[None], spec, file)
    _check_integer_range(array, spec, file)
    return _cast(array, spec, file)


def _check_integer_range(array: np.ndarray, spec: InputSpec, file: str) -> None:
    """Refuse integers the input's integer type cannot hold (int64 token ids past 2³¹ for an
    int32 input, a negative id for a uint8 one): the cast wrapped them round to other ids, and
    the model calibrated on those without a word."""
    if array.dtype.kind not in "iu" or spec.dtype.kind not in "iu" or not array.size \
            or np.can_cast(array.dtype, spec.dtype):
        return
    info = np.iinfo(spec.dtype)
    low, high = array.min(), array.max()
    if low < info.min or high > info.max:
        value = low if low < info.min else high
        raise OptionError(f"{calibration_label(file)}: input '{spec.name}' holds {value}, beyond "
                          f"{spec.dtype} ({info.min} to {info.max}); calibration needs values "
                          "that fit the input's type")


def _check_finite(samples: np.ndarray, spec: InputSpec, file: str) -> None:
    """Refuse float data with no finite value at all, or with finite values beyond the input's
    float type (float64 data for a float32 input), in `samples` (stacked along axis 0): no
    range could be measured from it. A NaN or Inf among finite values is data (a missing value
    an Imputer fills): calibration measures ranges over the finite values."""
    if samples.dtype.kind != "f" or spec.dtype.kind != "f" or not samples.size:
        return
    finite = np.isfinite(samples)
    if not finite.any():
        raise OptionError(f"{calibration_label(file)}: input '{spec.name}' holds only NaN or Inf; "
                          "calibration needs finite values")
    if samples.dtype.itemsize <= spec.dtype.itemsize:
        return
    limit = np.finfo(spec.dtype).max
    beyond = (finite & (np.abs(samples) > limit)).reshape(len(samples), -1).any(axis=1)
    if beyond.any():
        where = f" sample {int(np.argmax(beyond))}" if len(samples) > 1 else ""
        raise OptionError(f"{calibration_label(file)}: "
                          f"input '{spec.name}'{where} holds values beyond "
                          f"{spec.dtype}; calibration needs them to fit the input's type")


def _cast(array: np.ndarray, spec: InputSpec, file: str) -> np.ndarray:
    array = np.asarray(array)  # a sample of a scalar input is a numpy scalar, not an array
    if array.dtype == spec.dtype:
        return array
    # A string input (object) is saved as numpy's fixed-width strings: an .npz holds no
    # object array, as `run --inputs` takes it too.
    same_kind = (array.dtype.kind == "f" and spec.dtype.kind == "f") or (
        array.dtype.kind in "iu" and spec.dtype.kind in "iu") or (
        array.dtype.kind in "US" and spec.dtype.kind == "O")
    if not same_kind:
        raise OptionError(f"{calibration_label(file)}: "
                          f"input '{spec.name}' is {array.dtype}; the model "
                          f"expects {spec.dtype}")
    return array.astype(spec.dtype)


def calibration_data(ctx: PassContext, graph):
    """The calibration data the compile read and checked, when it was read for these inputs,
    else read now: a single .npz of samples is loaded whole, so reading it once matters."""
    data = ctx.calibration
    if data is not None and data.path == os.fspath(ctx.options.calibration) \
            and data.specs == model_inputs(graph):
        return data
    return read_calibration(ctx.options.calibration, graph)
