"""Typed compile options, declared in one place; the CLI and the tuner fill this object."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from numbers import Integral, Real


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


@dataclass
class Options:
    level: int = 2                        # optimization level, -O0 … -O3
    disabled_passes: set[str] = field(default_factory=set)
    fold_size_limit: int = 1 << 20        # bytes: FoldConstants never materializes more per value
    max_iterations: int = 8               # fixed-point sweeps; then only ones that remove nodes
    input_shapes: dict[str, list[int]] = field(default_factory=dict)  # ATC-style pins
    # Structural verification after every pass; GRAPHOPT_VERIFY_PASSES=1 turns it on everywhere
    # (the test suite does).
    verify_structure: bool = field(default_factory=lambda: _env_flag("GRAPHOPT_VERIFY_PASSES"))
    dump_dir: str | None = None           # write the IR after import and after each pass
    dump_format: str = "text"             # dump files: "text" (printed IR), "onnx" or "both"
    allow_custom_ops: bool = False        # accept ops of domains no schema or function knows
    trace_rules: set[str] = field(default_factory=set)  # rules whose near-misses are reported
    nchwc_block_size: int = 0             # LayoutNchwc: 0 = this CPU's (16 AVX-512F, 8 AVX2); 8 or 16
    elementwise_max_group: int = 32       # FuseElementwise: most nodes in one fused group
    elementwise_epilogues: bool = False   # FuseElementwise: a Conv/MatMul/Gemm heads its group
    # Precision (pipelines.with_precision adds the passes these ask for).
    precision: str = "keep"               # ConvertPrecision mode; "keep": original dtypes
    precision_allow: set[str] = field(default_factory=set)  # op types converted under mixed
    precision_deny: set[str] = field(default_factory=set)   # op types kept in their dtype
    keep_dtype: set[str] = field(default_factory=set)       # node names kept in their dtype
    quantize: str = "none"                # "none", "int8" (QuantizeInt8), "int4" (QuantizeInt4Weights)
    calibration: str | None = None        # int8: an .npz file or a directory of them
    calibration_method: str = "minmax"    # int8: "minmax", "percentile", "entropy" or "mse"
    calibration_percentile: float = 99.999  # int8 percentile method: the clipping percentile
    per_channel: bool = True              # int8: per-output-channel weight scales
    activation_symmetric: bool = False    # int8: symmetric (int8) instead of asymmetric (uint8)
    quant_skip: set[str] = field(default_factory=set)  # int8/int4: node names or op types left float
    quant_keep_ends: bool = True          # int8: layers reading a graph input or writing an output stay float
    quant_keep_sensitive: bool = True     # int8: layers int8 rounding would drown stay float
    quant_equalize: bool = True           # int8: channel scales moved into the layers around them
    int4_group_size: int = 32             # int4: weights per scale along K (block-wise)
    int4_embeddings: bool = False         # int4: embedding tables too (GatherBlockQuantized)
    int4_accuracy_level: int = 0          # int4: MatMulNBits' accuracy_level (4: int8 activations)
    int4_method: str = "rtn"              # int4: "rtn" (rounding) or "gptq" (needs calibration)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def coerce(cls, name: str, value):
        """`value` as field `name` holds it (a list of names becomes a set), or ValueError
        saying what the field takes: set from Python (pass_options), a mistyped value would
        otherwise pass unnoticed (a string of names read as its characters, "no" as true)."""
        default = getattr(cls(), name)
        kind = next(f.type for f in fields(cls) if f.name == name)
        if default is None and kind == "str | None":
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ValueError(f"takes a path or None, not {value!r}")
            return None if value is None else os.fspath(value)
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError(f"takes True or False, not {value!r}")
        elif name == "fold_size_limit" and isinstance(value, str):  # "4M", as the keyword takes
            from graphopt.api_args import parse_size

            value = parse_size(value)  # ValueError saying what it takes
        elif isinstance(default, int):
            if isinstance(value, bool) or not isinstance(value, Integral):
                raise ValueError(f"takes an integer, not {value!r}")
            value = int(value)
        elif isinstance(default, float):
            if isinstance(value, bool) or not isinstance(value, Real):
                raise ValueError(f"takes a number, not {value!r}")
            value = float(value)
        elif isinstance(default, str):
            if not isinstance(value, str):
                raise ValueError(f"takes a string, not {value!r}")
        elif isinstance(default, dict) and not isinstance(value, dict):
            raise ValueError(f"takes a dict, not {value!r}")
        elif isinstance(default, set):
            if not isinstance(value, (set, frozenset, list, tuple)) \
                    or not all(isinstance(v, str) for v in value):
                raise ValueError(f"takes a list or set of names, not {value!r}")
            value = set(value)
        return value
