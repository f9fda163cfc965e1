"""Typed compile options, declared in one place; the CLI and the tuner fill this object."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class Options:
    level: int = 2                        # optimization level, -O0 … -O3
    disabled_passes: set[str] = field(default_factory=set)
    fold_size_limit: int = 1 << 20        # bytes: FoldConstants never materializes more per value
    max_iterations: int = 8               # cap on fixed-point repetitions of a pipeline group
    input_shapes: dict[str, list[int]] = field(default_factory=dict)  # ATC-style pins
    verify_structure: bool = False        # structural verification after every pass
    dump_dir: str | None = None           # write the IR after import and after each pass
    allow_custom_ops: bool = False        # accept ops of domains no schema or function knows

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
