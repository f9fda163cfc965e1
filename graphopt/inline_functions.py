"""A model's own local functions inlined at import, as onnxruntime inlines them when it loads the
model: the passes see the nodes inside (they never enter a function body)."""

from __future__ import annotations

from onnx import AttributeProto, GraphProto, ModelProto

from graphopt.errors import one_line
from graphopt.ir import Model, load_onnx, to_onnx
from graphopt.warning_scope import warnings_as

# graphopt's own groups (-O3's FuseElementwise), which a model compiled before may carry: kept.
OWN_DOMAIN = "graphopt"


def inline_user_functions(model: Model) -> tuple[Model, str | None]:
    """`model` with every call of its own (non-graphopt) local functions replaced by the body,
    and a note saying so; as it was, with a note saying why, where ONNX's inliner refuses it (a
    function importing another opset than the model); as it was and no note without any."""
    own = [(f.domain, f.name) for f in model.functions if f.domain != OWN_DOMAIN]
    if not own:
        return model, None
    proto = to_onnx(model)
    calls = _calls(proto, set(own))
    _spell_out_defaults(proto)
    try:
        import onnx.inliner

        with warnings_as("ignore"):
            inlined = onnx.inliner.inline_selected_functions(proto, own)
        result = load_onnx(inlined, user_model=True)
    except Exception as exc:  # noqa: BLE001 - the inliner's refusals have no common type
        return model, (f"{len(own)} model-local function(s) kept as they are, which the passes "
                       f"do not enter (ONNX's inliner refused them: "
                       f"{one_line(str(exc))[:160] or type(exc).__name__})")
    return result, (f"{calls} call(s) of {len(own)} model-local function(s) inlined, as "
                    "onnxruntime inlines them when it loads the model")


def _graphs(proto: ModelProto):
    """Every graph of the model and the bodies of its functions, with their subgraphs, as the
    node lists to walk."""
    stack: list = [proto.graph.node, *(f.node for f in proto.functions)]
    while stack:
        nodes = stack.pop()
        yield nodes
        for node in nodes:
            for attr in node.attribute:
                if attr.type == AttributeProto.GRAPH:
                    stack.append(attr.g.node)
                stack.extend(g.node for g in attr.graphs if isinstance(g, GraphProto))


def _calls(proto: ModelProto, functions: set) -> int:
    return sum((node.domain, node.op_type) in functions
               for nodes in _graphs(proto) for node in nodes)


def _spell_out_defaults(proto: ModelProto) -> None:
    """Write each function attribute's default into the calls that leave it out: onnx 1.23's
    inliner drops the default (a body's Softmax axis=@axis with default 1 became -1, 0.68 off)."""
    defaults = {(f.domain, f.name): list(f.attribute_proto) for f in proto.functions}
    for nodes in _graphs(proto):
        for node in nodes:
            given = {a.name for a in node.attribute}
            for default in defaults.get((node.domain, node.op_type), ()):
                if default.name not in given:
                    node.attribute.append(default)


__all__ = ["inline_user_functions"]
