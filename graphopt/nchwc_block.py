"""The NCHWc block size: this CPU's (MLAS's), the installed onnxruntime's, and whether a model
blocked by graphopt's LayoutNchwc can run here. Light on imports: the runtime asks it at load."""

from __future__ import annotations

import functools
import os

from graphopt.cache_dir import cache_dir

CPUINFO = "/proc/cpuinfo"
BLOCK_SIZES = (8, 16)  # MLAS: 8 floats with AVX2, 16 with AVX-512F
METADATA_KEY = "graphopt.nchwc_block_size"  # the block a model was rewritten for


def detect_block_size(cpuinfo: str = CPUINFO) -> int:
    """MLAS's NCHWc block size on this CPU from the kernel's flags: 16 with avx512f, 8 with avx2,
    0 when neither (or no /proc/cpuinfo: not Linux). MLAS also blocks by 8 with SSE2 only, and
    recent builds by a NEON block on ARM64; LayoutNchwc does not target those."""
    flags: set[str] = set()
    try:
        # Up to the first CPU's flags only: the kernel writes the file as it is read, and on a
        # machine of hundreds of cores the whole of it takes milliseconds (a load asks this).
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags.update(line.partition(":")[2].split())
                    break
    except OSError:
        return 0
    return 16 if "avx512f" in flags else 8 if "avx2" in flags else 0


# The probe: y = Conv(x[1, 3, 4, 4], k[1, 3, 1, 1] of ones), opset 17, as onnx.helper serializes it
# (tests/test_layout_nchwc.py rebuilds it): the runtime asks at load, without importing onnx.
PROBE_MODEL = bytes.fromhex(
    "08083a6f0a0f0a01780a016b1201792204436f6e76120570726f62652a1b0801080308010801100142016b4a0c"
    "0000803f0000803f0000803f5a1b0a017812160a14080112100a0208010a0208030a0208040a020804621b0a01"
    "7912160a14080112100a0208010a0208010a0208040a02080442040a001011")


@functools.cache
def onnxruntime_block_size() -> int:
    """The block the installed onnxruntime uses on this CPU (0: none), read back from its own
    NCHWc transformer: a one-filter conv's weight comes out padded to one block.

    The answer is remembered in the cache folder (PROBES_FILE), keyed by onnxruntime's library
    and this CPU's block, so that only the first process on a machine pays for the probe
    (~8 ms of a new process's first load of a blocked model: the session and a temporary
    file)."""
    key = _probe_key()
    remembered = _remembered(key)
    if remembered is not None:
        return remembered
    block = _probe()
    _remember(key, block)
    return block


def _probe() -> int:
    import tempfile

    import onnxruntime as ort

    from graphopt import protowire

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # "hardware specific" warning: expected here
    with tempfile.TemporaryDirectory(prefix="graphopt-nchwc-probe-") as tmp:
        options.optimized_model_filepath = os.path.join(tmp, "probe.onnx")
        ort.InferenceSession(PROBE_MODEL, options, providers=["CPUExecutionProvider"])
        with open(options.optimized_model_filepath, "rb") as f:
            probe = f.read()
    if "com.microsoft.nchwc" not in protowire.node_domains(probe):
        return 0
    return max(dims[0] for dims in protowire.initializer_dims(probe) if len(dims) == 4)


PROBES_FILE = "nchwc-block.json"  # in $XDG_CACHE_HOME/graphopt (default ~/.cache/graphopt)
_KEPT_PROBES = 16  # answers kept, for as many onnxruntime installs on one machine


def _probes_path() -> str:
    return os.path.join(cache_dir(), PROBES_FILE)


def _probe_key() -> str:
    """What the probe's answer depends on: the onnxruntime build (its version, and its native
    library's path, size and modification time, which change with any reinstall) and the block
    this CPU's flags allow."""
    import onnxruntime as ort
    from onnxruntime.capi import onnxruntime_pybind11_state as native

    library = native.__file__
    try:
        info = os.stat(library)
    except OSError:
        return ""
    return f"{ort.__version__}|{library}|{info.st_size}|{info.st_mtime_ns}|{detect_block_size()}"


def _remembered(key: str) -> int | None:
    if not key:
        return None
    import json

    try:
        with open(_probes_path(), encoding="utf-8") as f:
            block = json.load(f).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return block if type(block) is int and block in (0, *BLOCK_SIZES) else None


def _remember(key: str, block: int) -> None:
    """Add the answer to the file, best effort: an unwritable cache costs the next process a
    probe, nothing more."""
    if not key:
        return
    import json

    from graphopt.atomic import atomic_write_bytes, scratch_writes

    path = _probes_path()
    try:
        with open(path, encoding="utf-8") as f:
            known = json.load(f)
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    known.pop(key, None)
    known = dict(list(known.items())[-(_KEPT_PROBES - 1):] + [(key, block)])
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with scratch_writes():  # a cache, not one of the command's outputs to name
            atomic_write_bytes(path, json.dumps(known, indent=1).encode("utf-8"))
    except OSError:
        pass


def foreign_block(metadata: dict[str, str]) -> tuple[int, int] | None:
    """(the block a model LayoutNchwc rewrote is in, onnxruntime's here) when they differ; None
    when the model is not blocked or runs here."""
    wanted = metadata.get(METADATA_KEY)
    here = onnxruntime_block_size() if wanted else 0
    if not wanted or int(wanted) == here:
        return None
    return int(wanted), here


def block_mismatch(metadata: dict[str, str]) -> str | None:
    """Why a model LayoutNchwc rewrote cannot run on this machine's onnxruntime, or None. A
    model blocked by another size loads and runs there, silently wrong, so a runtime loading
    blocked models should ask this first."""
    blocks = foreign_block(metadata)
    if blocks is None:
        return None
    return (f"the model is in NCHWc blocks of {blocks[0]} channels but onnxruntime blocks by "
            f"{blocks[1] or 'nothing'} on this CPU, which would give wrong results: compile it "
            "again for this CPU")
