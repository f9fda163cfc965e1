"""A model's own local functions inlined at import, as onnxruntime inlines them when it loads the
model: the passes see the nodes inside (they never enter a function body)."""

from __future__ import annotations

from onnx import ModelProto

from graphopt.errors import one_line
from graphopt.ir import Model, load_onnx, to_onnx
from graphopt.ir.onnx_io import proto_nodes
# graphopt's own groups (-O3's FuseElementwise), which a model compiled before may carry: kept.
from graphopt.passes.fusion.elementwise import DOMAIN as GROUP_DOMAIN
from graphopt.warning_scope import warnings_as

# Nesting deeper than this is left to onnxruntime (a call chain of functions, inlined a level
# at a time).
_MAX_DEPTH = 64


def inline_user_functions(model: Model) -> tuple[Model, str | None]:
    """`model` with every call of its own local functions replaced by the body, and a note
    saying so; as it was, with a note saying why, where ONNX's inliner refuses it (a function
    importing another opset than the model); as it was and no note without any. Not inlined:
    graphopt's own groups, and a function named as an op onnxruntime has a kernel for, which it
    runs instead (a local com.microsoft::Gelu whose body is a Neg runs as Gelu)."""
    # Exported only when a function may need inlining: the export reads every weight stored
    # outside the model into memory (a 2.3 GiB table failed to serialize at the default -O2).
    if not any(f.domain != GROUP_DOMAIN and not _has_kernel(f.domain, f.name)
               for f in model.functions):
        return model, None
    proto = to_onnx(model)
    used = _reachable(proto)
    own = {key for key in used if key[0] != GROUP_DOMAIN and not _has_kernel(*key)}
    if not own:
        return model, None
    calls = _calls(proto, own, used)
    # Functions nothing calls go first: ONNX's inliner refuses a model whose every function
    # does not share its opsets, used or not.
    kept = [f for f in proto.functions if (f.domain, f.name) in used]
    del proto.functions[:]
    proto.functions.extend(kept)
    _import_function_domains(proto, own)
    try:
        import onnx.inliner

        # One level at a time, so that a call inside a body whose attribute refers to one the
        # outer call left out (a reference the inliner drops) gets its own default.
        for _ in range(_MAX_DEPTH):
            _spell_out_defaults(proto)
            top = _called_from_graph(proto, own)
            if not top:
                break
            with warnings_as("ignore"):
                proto = onnx.inliner.inline_selected_functions(proto, sorted(top))
        left = [f for f in proto.functions if (f.domain, f.name) not in own]
        del proto.functions[:]
        proto.functions.extend(left)  # every call of the others is inlined now
        result = load_onnx(proto, user_model=True)
    except Exception as exc:  # noqa: BLE001 - the inliner's refusals have no common type
        return model, (f"{len(own)} model-local function(s) kept as they are, which the passes "
                       f"do not enter (ONNX's inliner refused them: "
                       f"{one_line(str(exc))[:160] or type(exc).__name__})")
    return result, (f"{calls} call(s) of {len(own)} model-local function(s) inlined, as "
                    "onnxruntime inlines them when it loads the model")


def _reachable(proto: ModelProto) -> set:
    """The (domain, name) of the local functions the main graph calls, directly or through
    other functions' bodies."""
    bodies = {(f.domain, f.name): f for f in proto.functions}
    found: set = set()
    todo = [proto.graph.node]
    while todo:
        for node in proto_nodes(todo.pop()):
            key = (node.domain, node.op_type)
            if key in bodies and key not in found:
                found.add(key)
                todo.append(bodies[key].node)
    return found


def _has_kernel(domain: str, name: str) -> bool:
    """Whether onnxruntime runs its own kernel for (domain, name), which it prefers to a
    model-local function of that name."""
    import onnx.defs
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    if onnx.defs.has(name, domain or ""):
        return True
    return any(s.name == name and s.domain == domain for s in ort_c.get_all_operator_schema())


def _import_function_domains(proto: ModelProto, functions: set) -> None:
    """The domains the inlined bodies import, which the model may not (onnx's inliner does
    not add them: a body's com.microsoft::FastGelu had made the model refused)."""
    have = {o.domain for o in proto.opset_import}
    for f in proto.functions:
        if (f.domain, f.name) in functions:
            for o in f.opset_import:
                if o.domain not in have:
                    proto.opset_import.add(domain=o.domain, version=o.version)
                    have.add(o.domain)


def _called_from_graph(proto: ModelProto, functions: set) -> set:
    return {(node.domain, node.op_type) for node in proto_nodes(proto.graph.node)
            if (node.domain, node.op_type) in functions}


def _calls(proto: ModelProto, functions: set, used: set) -> int:
    """The calls of `functions` in the main graph and in the bodies of the functions it uses."""
    bodies = [f.node for f in proto.functions if (f.domain, f.name) in used]
    return sum((node.domain, node.op_type) in functions
               for nodes in (proto.graph.node, *bodies) for node in proto_nodes(nodes))


def _spell_out_defaults(proto: ModelProto) -> None:
    """Write each function attribute's default into the calls that leave it out: onnx 1.23's
    inliner drops the default (a body's Softmax axis=@axis with default 1 became -1, 0.68 off).
    Keyed by overload too (IR 10's overloads of one name default apart)."""
    defaults = {(f.domain, f.name, f.overload): list(f.attribute_proto) for f in proto.functions}
    for nodes in (proto.graph.node, *(f.node for f in proto.functions)):
        for node in proto_nodes(nodes):
            given = {a.name for a in node.attribute}
            for default in defaults.get((node.domain, node.op_type, node.overload), ()):
                if default.name not in given:
                    node.attribute.append(default)


__all__ = ["inline_user_functions"]
