"""Targets and partitioning: which device runs each node, and the device subgraphs that result."""

from importlib import import_module as _import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers and editors see; at run time, _API below
    from graphopt.partition.partitioner import Partition, Partitioning, partition
    from graphopt.partition.placement import Placement, place
    from graphopt.partition.target import Device, OpSupport, Target, builtin_targets, load_target

__all__ = [
    "Device", "OpSupport", "Partition", "Partitioning", "Placement", "Target", "builtin_targets",
    "load_target", "partition", "place",
]

# Imported on first use: reading a target profile (`graphopt targets`, the CLI's option checks)
# needs neither the partitioner nor networkx.
_API = {
    "Partition": "graphopt.partition.partitioner",
    "Partitioning": "graphopt.partition.partitioner",
    "partition": "graphopt.partition.partitioner",
    "Placement": "graphopt.partition.placement",
    "place": "graphopt.partition.placement",
    "Device": "graphopt.partition.target",
    "OpSupport": "graphopt.partition.target",
    "Target": "graphopt.partition.target",
    "builtin_targets": "graphopt.partition.target",
    "load_target": "graphopt.partition.target",
}


def __getattr__(name: str):
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'graphopt.partition' has no attribute {name!r}")
    value = getattr(_import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
