"""The host-bound edge of a device island: its nodes whose results reach only the host. Where
handing such an edge back saves more in copies than the device saves on it, the partitioner
does so before judging the island itself: an SSD detector's post-processing took 90
per-class Gathers of one score tensor, and a Greater of each, into its backbone's island, 90
small outputs that each paid a copy's latency, and the whole island (backbone and head) had
gone back to the host with them.

The edge grows in layers from the island's host side: layer 1 is the nodes whose outputs
only the host reads, layer k adds those read only by the host and the layers before. Each
layer's gain is the copies of what the edge now sends the host, less the copies of what it
would read from the rest of the island, less the time the device saves on it; the best layer
that leaves the island something wins (the Greaters alone save no copy, the Gathers with
them all but one; the classifier before them only costs).
"""

from __future__ import annotations

from collections.abc import Callable

from graphopt.ir import Node, Value
from graphopt.partition.estimate import transfer_seconds, value_bytes

MAX_LAYERS = 8  # post-processing chains are short; the layers beyond only cost time here


def host_edge(work: list[Node], owner: dict, index: int, on_host: Callable[[int | None], bool],
              target, reads: Callable[[Node], list[Value]], top_level: Callable[[Node], Node],
              device_saves: Callable[[list[Node]], float]) -> tuple[list[Node], float]:
    """(the best host-bound edge of island `index`, the seconds handing it to the host saves)
    or ([], 0.0) when no edge saves any. `on_host(cluster)`: whether a cluster (None: the
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

    edge: set[int] = set()
    best, best_gain = [], 0.0
    members = []
    for _ in range(MAX_LAYERS):
        layer = [n for n in work if id(n) not in edge and not n.subgraphs()
                 and (outs := [v for v in n.outputs
                               if v is not None and (v.uses or v.is_graph_output)])
                 and all(read_only_by(v, edge) for v in outs)]
        if not layer:
            break
        edge.update(id(n) for n in layer)
        members += layer
        if len(members) == len(work):
            break  # the whole island: judging that is the partitioner's own round
        sent = {id(v): v for n in members for v in n.outputs if v is not None and to_host(v)}
        fetched = {id(v): v for n in members for v in reads(n)
                   if not v.is_weight and owner.get(v.producer) == index
                   and id(v.producer) not in edge and not to_host(v)}
        if len(fetched) >= len(sent):
            continue  # as many copies or more: no layer gains by latency alone
        gain = sum(transfer_seconds(value_bytes(v), target) for v in sent.values()) \
            - sum(transfer_seconds(value_bytes(v), target) for v in fetched.values()) \
            - device_saves(members)
        if gain > best_gain:
            best, best_gain = list(members), gain
    order = {id(n): k for k, n in enumerate(work)}
    return sorted(best, key=lambda n: order[id(n)]), best_gain
