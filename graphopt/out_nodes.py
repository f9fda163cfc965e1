"""--out-nodes: end a model at tensors the user names (ATC's --out_nodes), before any pass runs."""

from __future__ import annotations

import json

from graphopt.errors import InputError, OptionError
from graphopt.ir import Graph, Model, Value
from graphopt.option_names import option
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.source_marks import CUT_KEY, cut_outputs


def parse_out_nodes(spec) -> list[str]:
    """The outputs `spec` names, in order: "a;b" (the command line's form) or a list of
    names. Each is a tensor name or, ATC style, `node_name:output_index`."""
    if isinstance(spec, str):
        names = [name.strip() for name in spec.split(";")]
    elif isinstance(spec, (list, tuple)) and all(isinstance(name, str) for name in spec):
        names = [name.strip() for name in spec]
    else:
        raise OptionError(f"{option('out_nodes')}: expected \"name;node:0\" or a list of names, "
                          f"not {type(spec).__name__}")
    if not names or any(not name for name in names):
        what = "an empty name" if names else "no name"
        raise OptionError(f"{option('out_nodes')} {spec!r}: {what} (give tensor names "
                          "or node:index, separated by ';')")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise OptionError(f"{option('out_nodes')}: {', '.join(map(repr, twice))} named twice")
    return names


def select_outputs(model: Model, wanted: list[str], label: str) -> str:
    """Make the tensors `wanted` names the graph's outputs, in that order, and remove every
    node and weight that only the former outputs needed. The inputs stay as declared: a caller
    feeds what it fed before. Returns the note the compile prints."""
    graph = model.graph
    chosen = [resolve_tensor(graph, name, label) for name in wanted]
    if len({id(value) for value in chosen}) < len(chosen):
        raise OptionError(f"{label}: {option('out_nodes')} names one tensor twice "
                          f"({', '.join(map(repr, wanted))})")
    if any(value.dtype is None and value.is_tensor for value in chosen):
        infer_shapes(model)  # an intermediate the model declared no type for
    untyped = [value.name for value in chosen if value.dtype is None and value.is_tensor]
    if untyped:
        raise InputError(f"{label}: {option('out_nodes')}: the type of "
                         f"{', '.join(map(repr, untyped))} cannot be inferred, so it cannot be "
                         "a graph output")
    before = len(graph)
    kept = {value.name for value in chosen}
    cut = cut_outputs(model.metadata_props) + [value.name for value in graph.outputs
                                               if value.name not in kept]
    graph.outputs = chosen
    if cut:
        model.metadata_props[CUT_KEY] = json.dumps(list(dict.fromkeys(cut)))
    present = graph.nodes()
    _drop_dead(graph)
    model.cut_names = model.cut_names | _names_of(set(present) - set(graph.nodes()))
    names = ", ".join(repr(value.name) for value in chosen)
    return (f"{option('out_nodes')}: the model ends at {names}; {before - len(graph)} node(s) "
            "that only the other outputs needed were removed")


def resolve_tensor(graph: Graph, name: str, label: str, flag: str = "out_nodes") -> Value:
    """The main-graph tensor `name` names: a tensor of that name, else `node:index`, else
    `tensor:0` (TensorFlow's spelling), else a node of that name with one output. Errors name
    the option `flag` (a keyword of optimize)."""
    values = {value.name: value for value in (*graph.inputs, *graph.initializers.values())}
    nodes = {}
    for node in graph.nodes():
        values.update((value.name, value) for value in node.outputs if value is not None)
        if node.name:
            nodes[node.name] = node
    if name in values:
        return values[name]
    node_name, colon, index = name.rpartition(":")
    if colon and node_name in nodes and index.isdecimal():
        outputs = nodes[node_name].outputs
        if int(index) < len(outputs) and outputs[int(index)] is not None:
            return outputs[int(index)]
        raise OptionError(f"{label}: {option(flag)} {name!r}: node "
                          f"{node_name!r} ({nodes[node_name].op_type}) has "
                          f"{sum(v is not None for v in outputs)} output(s), none at index {index}")
    if colon and index == "0" and node_name in values:  # TensorFlow's spelling: tensor:0
        return values[node_name]
    if name in nodes:
        outputs = [value for value in nodes[name].outputs if value is not None]
        if len(outputs) == 1:
            return outputs[0]
        raise OptionError(f"{label}: {option(flag)} {name!r}: node "
                          f"{name!r} ({nodes[name].op_type}) has {len(outputs)} outputs; "
                          f"name one as {name + ':0'!r}")
    raise OptionError(f"{label}: {option(flag)} {name!r}: "
                      f"{_where_else(graph, name)}")


def _where_else(graph: Graph, name: str) -> str:
    """Why `name` resolves to nothing: it lives in a control-flow body, or nowhere."""
    for sub in graph.all_graphs():
        if sub is graph:
            continue
        inner = {v.name for node in sub.nodes() for v in node.outputs if v is not None}
        if name in inner or any(node.name == name for node in sub.nodes()):
            holder = sub.parent
            return (f"it is inside the body of {holder.op_type} node {holder.name!r}; "
                    "only tensors of the main graph can be outputs")
    return "no tensor or node of the main graph has that name (give a tensor name or node:index)"


def _names_of(nodes) -> frozenset[str]:
    """The names the options that name nodes or op types may give `nodes`."""
    from graphopt.passes.unmatched import op_spellings
    from graphopt.precision_modes import OP_TYPE_ENTRY

    names = set()
    for node in nodes:
        spellings = op_spellings(node)
        names.update(spellings, (OP_TYPE_ENTRY + op for op in spellings))
        if node.name:
            names.add(node.name)
    return frozenset(names)


def _drop_dead(graph: Graph) -> None:
    """Remove the nodes no output depends on, then the weights nothing reads (as
    EliminateDeadNodes does, here at every level: -O0 runs no pass)."""
    for node in reversed(graph.nodes()):
        if not any(v is not None and (v.uses or v.is_graph_output) for v in node.outputs):
            graph.remove(node)
    for value in list(graph.initializers.values()):
        feedable = value.is_input and value.overridable
        if not feedable and not value.uses and not value.is_graph_output:
            graph.remove_initializer(value)
