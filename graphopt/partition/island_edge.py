"""The host-bound edge of a device island: its nodes whose results reach only the host. Where
handing such an edge back saves more in copies than the device saves on it, the partitioner
does so before judging the island itself: an SSD detector's post-processing took 90
per-class Gathers of one score tensor, and a Greater of each, into its backbone's island, 90
small outputs that each paid a copy's latency, and the whole island (backbone and head) had
gone back to the host with them.

The edge grows in layers from the island's host side, as deep as it goes: layer 1 is the nodes
whose outputs only the host reads, layer k adds those read only by the host and the layers
before. Each
layer's gain is the copies of what the edge now sends the host, less the copies of what it
would read from the rest of the island, less the time the device saves on it; the best layer
that leaves the island something wins (the Greaters alone save no copy, the Gathers with
them all but one; the classifier before them only costs).
"""

from __future__ import annotations

from collections.abc import Callable

from graphopt.ir import Node, Value
from graphopt.partition.estimate import transfer_seconds, value_bytes

def host_edge(work: list[Node], owner: dict, index: int, on_host: Callable[[int | None], bool],
              target, reads: Callable[[Node], list[Value]], top_level: Callable[[Node], Node],
              device_saves: Callable[[list[Node]], float]) -> tuple[list[Node], float, float]:
    """(the best host-bound edge of island `index`, the seconds handing it to the host saves,
    the seconds of that the device would save on it: negative where the device is slower) or
    ([], 0.0, 0.0) when no edge saves any; the copies the edge costs on the device are the
    two added. `on_host(cluster)`: whether a cluster (None: the
    caller, or no cluster) is on the host side; `device_saves(nodes)`: the seconds the
    device saves on them."""
    def to_host(value: Value) -> bool:  # crosses to the host now, for another reader
        return value.is_graph_output or any(
            owner.get(top_level(use.node)) != index and on_host(owner.get(top_level(use.node)))
            for use in value.uses)

    def read_only_by(value: Value, edge: set[int]) -> bool:
        return all((owner.get(top_level(use.node)) != index
                    and on_host(owner.get(top_level(use.node))))
                   or id(top_level(use.node)) in edge for use in value.uses)

    def qualifies(node: Node, edge: set[int]) -> bool:
        outs = [v for v in node.outputs if v is not None and (v.uses or v.is_graph_output)]
        return bool(outs) and not node.subgraphs() and all(read_only_by(v, edge) for v in outs)

    in_island = {id(n) for n in work}
    edge: set[int] = set()
    members: list[Node] = []
    sent: dict[int, float] = {}     # copies the edge sends the host now: saved once it goes
    fetched: dict[int, float] = {}  # copies it would read from the rest of the island
    saves = 0.0                     # what the device saves on the edge
    best, best_gain, best_saves = [], 0.0, 0.0
    layer = [n for n in work if qualifies(n, edge)]
    # Layer by layer, as deep as the edge goes, each computed from the last one's inputs and
    # every sum kept as it grows: one partition round per island, in time linear in the edge.
    while layer:
        edge.update(id(n) for n in layer)
        members += layer
        if len(members) == len(work):
            break  # the whole island: judging that is the partitioner's own round
        saves += device_saves(layer)
        for node in layer:
            for value in node.outputs:
                if value is None:
                    continue
                fetched.pop(id(value), None)  # made on the host side from now on
                if to_host(value):
                    sent[id(value)] = transfer_seconds(value_bytes(value), target)
            for value in reads(node):
                if not value.is_weight and owner.get(value.producer) == index \
                        and id(value.producer) not in edge and not to_host(value):
                    fetched[id(value)] = transfer_seconds(value_bytes(value), target)
        if len(fetched) < len(sent):  # fewer copies; as many or more gain no latency
            gain = sum(sent.values()) - sum(fetched.values()) - saves
            if gain > best_gain:
                best, best_gain, best_saves = list(members), gain, saves
        candidates = {id(v.producer): v.producer for n in layer for v in reads(n)
                      if v.producer is not None and id(v.producer) in in_island
                      and id(v.producer) not in edge}
        layer = [n for n in candidates.values() if qualifies(n, edge)]
    order = {id(n): k for k, n in enumerate(work)}
    return sorted(best, key=lambda n: order[id(n)]), best_gain, best_saves
