"""The report's graph picture: a layered DAG layout (longest-path layers, barycenter order)
drawn as SVG, nodes coloured by partition, long linear chains and rows of like branches
collapsed on big graphs.

    layer 0   [input x]            edges run top to bottom; an edge spanning several layers
                  │                 bends through one invisible point per layer it crosses
    layer 1   [Conv]──┐             (Sugiyama's dummy nodes), so the ordering sweeps see it
                  │   │             and it never cuts through a box
    layer 2   [Relu]  │
                  │   │
    layer 3   [Add]◀──┘
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass, field

import networkx as nx

from graphopt.markup import escape, unbroken
from graphopt.tools.report_data import INPUT, OUTPUT, GraphData, OpNode

# Partition fills, in execution order; chosen to stay apart for the few partitions a model has.
PALETTE = ("#9ecae1", "#fdae6b", "#a1d99b", "#bcbddc", "#fc9272", "#fdd0a2", "#c7e9c0",
           "#dadaeb", "#f7b6d2", "#c6dbef")
IO_FILL = "#ffffff"

NODE_W, NODE_H = 136, 24
LAYER_GAP = 26        # vertical space between two layers
NODE_SEP, DUMMY_SEP = 14, 6
MARGIN = 12
SWEEPS = 6            # barycenter passes (down and up count one each)
BIG_GRAPH = 60        # op nodes above which linear chains are collapsed
CHAIN_MIN = 3         # the shortest chain worth collapsing into one box
SIBLINGS_MIN = 4      # the fewest like boxes side by side worth drawing as one
MAX_BOXES = 400       # boxes drawn at most; the rest are left out with a note


def partition_colours(partitions: list[tuple[str, str]]) -> dict[str, str]:
    """A fill per partition: the palette, then pastel hues a golden angle apart, distinct for
    the first hundred partitions and more (a model that falls back to the host many times has
    dozens)."""
    return {name: PALETTE[i] if i < len(PALETTE) else _pastel(i - len(PALETTE))
            for i, (name, _) in enumerate(partitions)}


def _pastel(index: int) -> str:
    """The index-th extra fill: hue steps of 137.5° never land on the same hue twice, and the
    lightness alternates so that neighbours in hue still differ; hex for SVG and CSS."""
    red, green, blue = colorsys.hls_to_rgb((index * 0.381966) % 1.0,
                                           (0.78, 0.70, 0.86)[index % 3], 0.55)
    return "#" + "".join(f"{round(c * 255):02x}" for c in (red, green, blue))


@dataclass
class Box:
    """What one drawn box stands for: a node, or a collapsed chain of nodes; on a big graph,
    `copies` of it side by side (the per-class branches of a detector's post-processing),
    whose heads `others` lists."""

    id: str
    members: list[OpNode]
    layer: int = 0
    x: float = 0.0
    copies: int = 1
    others: list[OpNode] = field(default_factory=list)

    @property
    def head(self) -> OpNode:
        return self.members[0]


@dataclass
class Layout:
    boxes: dict[str, Box]
    edges: list[tuple[str, str, list[str], list[tuple[float, float]]]]  # src, dst, tensors, bends
    width: float
    height: float
    notes: list[str] = field(default_factory=list)


def _chains(g: nx.DiGraph, nodes: dict[str, OpNode]) -> list[list[str]]:
    """Maximal runs u→v→… where each link is the only edge out of u and into v, within one
    partition: they draw as one box without losing any branching."""
    def linkable(u: str, v: str) -> bool:
        return (g.out_degree(u) == 1 and g.in_degree(v) == 1
                and nodes[u].partition == nodes[v].partition
                and nodes[u].op not in (INPUT, OUTPUT) and nodes[v].op not in (INPUT, OUTPUT))

    chains, seen = [], set()
    for v in nx.topological_sort(g):
        if v in seen:
            continue
        preds = list(g.predecessors(v))
        if len(preds) == 1 and linkable(preds[0], v):
            continue  # not a chain head
        chain = [v]
        while g.out_degree(chain[-1]) == 1:
            nxt = next(iter(g.successors(chain[-1])))
            if not linkable(chain[-1], nxt):
                break
            chain.append(nxt)
        seen.update(chain)
        chains.append(chain)
    return chains


def _boxes(graph: GraphData, collapse: bool) -> tuple[nx.DiGraph, dict[str, Box], list[str]]:
    nodes = {n.id: n for n in graph.nodes}
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    tensors: dict[tuple[str, str], list[str]] = {}
    for src, dst, tensor in graph.edges:
        g.add_edge(src, dst)
        tensors.setdefault((src, dst), []).append(tensor)
    notes = []
    owner = {v: v for v in nodes}
    members = {v: [nodes[v]] for v in nodes}
    if collapse:
        chains = [c for c in _chains(g, nodes) if len(c) >= CHAIN_MIN]
        for chain in chains:
            members[chain[0]] = [nodes[v] for v in chain]
            owner.update({v: chain[0] for v in chain})
        if chains:
            notes.append(f"{sum(map(len, chains))} nodes are drawn as {len(chains)} collapsed "
                         f"chain(s): a box with a count stands for a run of ≥ {CHAIN_MIN} nodes "
                         "without branching (its tooltip lists them)")
    # In graph order: the first ordering sweep starts from it.
    boxes = {v: Box(v, members[v]) for v in nodes if owner[v] == v}
    bg = nx.DiGraph()
    bg.add_nodes_from(boxes)
    for (src, dst), names in tensors.items():
        a, b = owner[src], owner[dst]
        if a != b:
            _join_edge(bg, a, b, names)
    if collapse:
        bg, boxes = _fold_siblings(bg, boxes, notes)
    if len(boxes) > MAX_BOXES:
        keep = list(nx.topological_sort(bg))[:MAX_BOXES]
        dropped = len(boxes) - MAX_BOXES
        notes.append(f"only the first {MAX_BOXES} of {len(boxes)} boxes (in topological order) "
                     f"are drawn; {dropped} more are left out to keep the picture readable")
        bg = bg.subgraph(keep).copy()
        boxes = {v: boxes[v] for v in keep}
    return bg, boxes, notes


def _join_edge(graph: nx.DiGraph, a: str, b: str, tensors: list[str]) -> None:
    """An edge a → b carrying `tensors`, added to the one already there if any."""
    if graph.has_edge(a, b):
        graph.edges[a, b]["tensors"].extend(tensors)
    else:
        graph.add_edge(a, b, tensors=list(tensors))


def _fold_siblings(bg: nx.DiGraph, boxes: dict[str, Box], notes: list[str]
                   ) -> tuple[nx.DiGraph, dict[str, Box]]:
    """Like boxes side by side drawn as one: the same ops in one partition, read from the same
    boxes, feeding the same boxes or model outputs only; their outputs go with them. An SSD's
    90 per-class Gather → Greater → NonZero branches had made one row 13,500 pixels wide."""
    def kind(v: str):
        succs = list(bg.successors(v))
        if succs and all(boxes[s].head.op == OUTPUT for s in succs):
            return ("outputs", len(succs))
        return frozenset(succs)

    groups: dict[tuple, list[str]] = {}
    for v, box in boxes.items():
        if box.head.op in (INPUT, OUTPUT):
            continue
        key = (tuple(m.op for m in box.members), box.head.partition,
               frozenset(bg.predecessors(v)), kind(v))
        groups.setdefault(key, []).append(v)
    folded = [group for group in groups.values() if len(group) >= SIBLINGS_MIN]
    if not folded:
        return bg, boxes
    into: dict[str, str] = {}
    for group in folded:
        keep = group[0]
        into.update({v: keep for v in group[1:]})
        outputs = [list(bg.successors(v)) for v in group]
        if outputs[0] and boxes[outputs[0][0]].head.op == OUTPUT:  # their outputs fold too
            for k, first in enumerate(outputs[0]):
                into.update({succs[k]: first for succs in outputs[1:]})
    for gone, keep in into.items():
        boxes[keep].copies += 1
        boxes[keep].others.append(boxes[gone].head)
    merged = nx.DiGraph()
    merged.add_nodes_from(v for v in boxes if v not in into)
    for a, b, data in bg.edges(data=True):
        _join_edge(merged, into.get(a, a), into.get(b, b), data["tensors"])
    copies = sum(len(group) for group in folded)
    outputs = " (with the model outputs they feed)" if any(
        boxes[v].head.op == OUTPUT for v in into) else ""
    notes.append(f"{copies} like boxes side by side are drawn as {len(folded)}{outputs}: a box "
                 "marked N× stands for N copies of it, each reading and feeding the same "
                 "boxes (its tooltip names them)")
    return merged, {v: box for v, box in boxes.items() if v not in into}


def layout(graph: GraphData, *, collapse: bool | None = None) -> Layout:
    """Place the graph's boxes: layer = longest path from a source; order within a layer by
    barycenter sweeps over real and dummy nodes; x by each box's parents, pushed apart."""
    ops = sum(1 for n in graph.nodes if n.op not in (INPUT, OUTPUT))
    bg, boxes, notes = _boxes(graph, ops > BIG_GRAPH if collapse is None else collapse)
    order = list(nx.topological_sort(bg))
    for v in order:
        boxes[v].layer = max((boxes[u].layer + 1 for u in bg.predecessors(v)), default=0)
    layers: list[list[str]] = [[] for _ in range(max((b.layer for b in boxes.values()),
                                                       default=0) + 1)]
    for v in order:
        layers[boxes[v].layer].append(v)
    # Dummy nodes: one per layer an edge crosses, so long edges join the ordering.
    up: dict[str, list[str]] = {v: list(bg.predecessors(v)) for v in boxes}
    down: dict[str, list[str]] = {v: list(bg.successors(v)) for v in boxes}
    paths: dict[tuple[str, str], list[str]] = {}
    for a, b in bg.edges:
        chain = [a]
        for layer in range(boxes[a].layer + 1, boxes[b].layer):
            dummy = f"~{a}>{b}@{layer}"
            layers[layer].append(dummy)
            up[dummy], down[dummy] = [chain[-1]], []
            down[chain[-1]].append(dummy)
            chain.append(dummy)
        if len(chain) > 1:
            down[a].remove(b)
            up[b].remove(a)
            down[chain[-1]].append(b)
            up[b].append(chain[-1])
        paths[(a, b)] = chain[1:]
    position = {v: i for layer in layers for i, v in enumerate(layer)}
    for sweep in range(SWEEPS):
        rng = range(1, len(layers)) if sweep % 2 == 0 else range(len(layers) - 2, -1, -1)
        neighbours = up if sweep % 2 == 0 else down
        for li in rng:
            layer = layers[li]
            keys = {v: (sum(position[u] for u in neighbours[v]) / len(neighbours[v])
                        if neighbours[v] else position[v]) for v in layer}
            layer.sort(key=lambda v: keys[v])
            position.update({v: i for i, v in enumerate(layer)})
    xs = _coordinates(layers, up)
    width = max((xs[v] + _width(v) / 2 for v in xs), default=0) + MARGIN
    # A page shows a wide picture from its left edge: the inputs, where a reader starts,
    # should be there, not at the far right of the scroll (mirroring keeps every crossing).
    starts = [xs[v] for v in layers[0] if not v.startswith("~")] if layers else []
    if starts and sum(starts) / len(starts) > width / 2:
        xs = {v: width - x for v, x in xs.items()}
    for v, box in boxes.items():
        box.x = xs[v]
    edges = []
    for (a, b), dummies in paths.items():
        # Through each crossed layer vertically, where its dummy keeps the room free.
        bends = [(xs[d], y) for d in dummies
                 for y in (_y(_dummy_layer(d)), _y(_dummy_layer(d)) + NODE_H)]
        edges.append((a, b, bg.edges[a, b]["tensors"], bends))
    height = _y(len(layers) - 1) + NODE_H + MARGIN
    return Layout(boxes, edges, width, height, notes)


def _dummy_layer(dummy: str) -> int:
    return int(dummy.rsplit("@", 1)[1])


def _width(v: str) -> float:
    return 0.0 if v.startswith("~") else NODE_W


def _sep(v: str) -> float:
    return DUMMY_SEP if v.startswith("~") else NODE_SEP


def _y(layer: int) -> float:
    return MARGIN + layer * (NODE_H + LAYER_GAP)


def _coordinates(layers: list[list[str]], up: dict[str, list[str]]) -> dict[str, float]:
    """x of each box's centre: the mean of its parents' (a chain stays straight), then pushed
    right where boxes would overlap, and the layer shifted back by the mean push."""
    xs: dict[str, float] = {}
    for layer in layers:
        wanted, placed, last_right = [], [], None
        for i, v in enumerate(layer):
            parents = [xs[u] for u in up[v] if u in xs]
            want = sum(parents) / len(parents) if parents else (i * (NODE_W + NODE_SEP))
            left = want - _width(v) / 2
            if last_right is not None:
                left = max(left, last_right + _sep(v))
            wanted.append(want)
            placed.append(left + _width(v) / 2)
            last_right = left + _width(v)
        shift = sum(w - p for w, p in zip(wanted, placed)) / len(layer) if layer else 0.0
        for v, x in zip(layer, placed):
            xs[v] = x + shift
    low = min((x - _width(v) / 2 for v, x in xs.items()), default=0.0)
    return {v: x - low + MARGIN for v, x in xs.items()}


# --- drawing -------------------------------------------------------------------------------


FONT_PX = 11
LABEL_FITS = 19       # characters a box holds at FONT_PX
LABEL_SQUEEZED = 28   # characters a box holds in a smaller font; more are cut with …


def _short(text: str, limit: int = LABEL_SQUEEZED) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _op_label(op: str) -> str:
    """`Conv`, and `nchwc::Conv` for a domain whose op shares a standard op's name (a
    com.microsoft op's name is its own: FusedConv, Attention)."""
    domain, _, name = op.rpartition("::")
    tail = domain.rsplit(".", 1)[-1]
    return f"{tail}::{name}" if domain and tail not in ("microsoft", "onnx", "ml") else name


def _label(box: Box) -> str:
    if box.copies > 1:
        return f"{box.copies}× {_one_label(box)}"
    return _one_label(box)


def _one_label(box: Box) -> str:
    head = box.head
    if head.op in (INPUT, OUTPUT):
        return _short(f"{head.op} {head.name}")
    if len(box.members) == 1:
        return _short(_op_label(head.op))
    # Ten characters each: a domain would take them all (nchwc::Co… for Conv and ReorderInput
    # alike); the box's tooltip and colour say the rest.
    first, last = (op.rpartition("::")[2] for op in (head.op, box.members[-1].op))
    return f"{_short(first, 10)} → {_short(last, 10)}: {len(box.members)} ops"


def _text(x: float, y: float, label: str) -> str:
    """A box's label, in a smaller font when it is longer than the box holds at FONT_PX (a
    smaller font never stretches a label the estimate took for long)."""
    size = (f' font-size="{FONT_PX * LABEL_FITS / len(label):.1f}"'
            if len(label) > LABEL_FITS else "")
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="middle"{size}>{escape(label)}</text>'


def _node_tip(node: OpNode) -> str:
    # Lines of its own, each line's text (names, dim names) with its line breaks escaped:
    # escape(…, lines=True) keeps the rest.
    if node.op == INPUT:
        return unbroken(f"model input {node.name} {node.outputs[0][1] if node.outputs else ''}")
    if node.op == OUTPUT:
        return unbroken(f"model output {node.name} {node.inputs[0][1] if node.inputs else ''}")
    head = f"{node.op} '{node.name or '(unnamed)'}' in partition {node.partition} ({node.device})"
    ins = ", ".join(f"%{n} {t}" for n, t in node.inputs) or "-"
    outs = ", ".join(f"%{n} {t}" for n, t in node.outputs) or "-"
    return f"{unbroken(head)}\n  in: {unbroken(ins)}\n  out: {unbroken(outs)}"


def _tip(box: Box) -> str:
    if len(box.members) == 1:
        tip = _node_tip(box.head)
    else:
        tip = "\n".join([f"{len(box.members)} nodes in a chain:",
                         *(_node_tip(n) for n in box.members)])
    if box.copies == 1:
        return tip
    names = ", ".join(unbroken(n.name or n.op) for n in box.others[:20])
    more = f", +{len(box.others) - 20}" if len(box.others) > 20 else ""
    return f"{box.copies} copies side by side; this one:\n{tip}\nthe others start at: " \
           f"{names}{more}"


def graph_svg(graph: GraphData, *, collapse: bool | None = None) -> tuple[str, list[str]]:
    """The SVG text of the laid-out graph, and notes on what was collapsed or left out."""
    placed = layout(graph, collapse=collapse)
    colours = partition_colours(graph.partitions)
    w, h = int(placed.width + 0.5), int(placed.height + 0.5)
    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{w}" height="{h}" '
              f'viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="{FONT_PX}">')]
    for a, b, tensors, bends in placed.edges:
        src, dst = placed.boxes[a], placed.boxes[b]
        points = [(src.x, _y(src.layer) + NODE_H), *bends, (dst.x, _y(dst.layer))]
        # A tensor moving between partitions is a host<->device copy: worth seeing.
        crossing = (src.members[-1].partition != dst.head.partition
                    and src.head.op != INPUT and dst.head.op != OUTPUT)
        style = ('stroke="#c0392b" stroke-width="1.6" stroke-dasharray="5 3"' if crossing
                 else 'stroke="#888" stroke-width="1"')
        where = (f" ({src.members[-1].partition} → {dst.head.partition})" if crossing else "")
        tip = escape(", ".join(dict.fromkeys(tensors)) + where)
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        parts.append(f'<polyline points="{coords}" fill="none" {style}><title>{tip}</title>'
                     "</polyline>")
    for box in placed.boxes.values():
        head = box.head
        x0, y0 = box.x - NODE_W / 2, _y(box.layer)
        fill = colours.get(head.partition, IO_FILL)
        rx = 12 if head.op in (INPUT, OUTPUT) else 3
        stroke = ' stroke-width="2.5"' if len(box.members) > 1 else ""
        parts.append(f'<g><title>{escape(_tip(box), lines=True)}</title>'
                     f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{NODE_W}" height="{NODE_H}" '
                     f'rx="{rx}" fill="{fill}" stroke="#333"{stroke}/>'
                     + _text(box.x, y0 + NODE_H / 2 + 4, _label(box)) + "</g>")
    parts.append("</svg>")
    return "\n".join(parts), placed.notes
