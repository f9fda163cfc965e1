"""Targets and partitioning: which device runs each node, and the device subgraphs that result."""

from graphopt.partition.partitioner import Partition, Partitioning, partition
from graphopt.partition.placement import Placement, place
from graphopt.partition.target import Device, OpSupport, Target, builtin_targets, load_target

__all__ = [
    "Device", "OpSupport", "Partition", "Partitioning", "Placement", "Target", "builtin_targets",
    "load_target", "partition", "place",
]
