"""Targets and partitioning: which device runs each node, and the device subgraphs that result."""

from typing import TYPE_CHECKING

from graphopt.lazy import lazy_attributes

if TYPE_CHECKING:  # what type checkers and editors see; at run time, lazy_attributes below
    from graphopt.partition.partitioner import Partition, Partitioning, partition
    from graphopt.partition.placement import Placement, place
    from graphopt.partition.target import Device, OpSupport, Target, builtin_targets, load_target

__all__ = [
    "Device", "OpSupport", "Partition", "Partitioning", "Placement", "Target", "builtin_targets",
    "load_target", "partition", "place",
]

# Imported on first use: reading a target profile (`graphopt targets`, the CLI's option checks)
# needs neither the partitioner nor networkx.
__getattr__, __dir__ = lazy_attributes(__name__, {
    "Partition": "graphopt.partition.partitioner:Partition",
    "Partitioning": "graphopt.partition.partitioner:Partitioning",
    "partition": "graphopt.partition.partitioner:partition",
    "Placement": "graphopt.partition.placement:Placement",
    "place": "graphopt.partition.placement:place",
    "Device": "graphopt.partition.target:Device",
    "OpSupport": "graphopt.partition.target:OpSupport",
    "Target": "graphopt.partition.target:Target",
    "builtin_targets": "graphopt.partition.target:builtin_targets",
    "load_target": "graphopt.partition.target:load_target",
}, globals())
