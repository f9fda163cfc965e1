"""The printed IR around a rewrite: the lines of two models that differ, with context.

Both models come from separate compiles (one without the rewrite, one with it), so nodes are
matched by their printed line, which names every value: a node or initializer whose line is
only in the first was removed (or changed), one only in the second was created. Context lines
are the producers of the changed nodes' inputs and the readers of changed initializers.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from graphopt.ir import Model, Node, Value
from graphopt.ir.printer import _format_tensor, format_node, format_type, quote_name

REMOVED, CREATED, CONTEXT = "- ", "+ ", "  "


@dataclass
class _Entry:
    line: str
    node: Node | None = None
    value: Value | None = None  # an initializer


def _entries(model: Model) -> list[_Entry]:
    """Initializers, then nodes (nested graphs' included), in graph order."""
    entries = []
    for graph in model.graph.all_graphs():
        for value in graph.initializers.values():
            if value.is_input or value.const is None:
                continue
            data = _format_tensor(value.const)
            line = f"%{quote_name(value.name)}<{format_type(value)}> = initializer {data}"
            entries.append(_Entry(line, value=value))
    entries += [_Entry(format_node(node), node=node) for node in model.graph.all_nodes()]
    return entries


def _marked(entries: list[_Entry], changed: Counter, mark: str) -> list[str]:
    left = Counter(changed)
    hit: set[int] = set()
    for i, entry in enumerate(entries):
        if left[entry.line] > 0:
            left[entry.line] -= 1
            hit.add(i)
    around: set[int] = set()
    for i in hit:
        entry = entries[i]
        if entry.node is not None:
            around |= {id(v.producer) for v in entry.node.inputs
                       if v is not None and v.producer is not None}
        else:
            around |= {id(n) for n in entry.value.consumers()}
    lines = []
    for i, entry in enumerate(entries):
        if i in hit:
            lines.append(mark + entry.line)
        elif entry.node is not None and id(entry.node) in around:
            lines.append(CONTEXT + entry.line)
    return lines


def rewrite_lines(before: Model, after: Model) -> tuple[list[str], list[str]]:
    """(before_lines, after_lines): what `after` no longer has, marked "- ", what it has new,
    marked "+ ", each with context lines marked "  "."""
    old, new = _entries(before), _entries(after)
    old_count = Counter(e.line for e in old)
    new_count = Counter(e.line for e in new)
    return (_marked(old, old_count - new_count, REMOVED),
            _marked(new, new_count - old_count, CREATED))
