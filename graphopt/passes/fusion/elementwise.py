r"""FuseElementwise: maximal groups of connected elementwise ops, each emitted as one node that
calls a model-local ONNX function ("super operator", domain `graphopt`), after TVM's FuseOps.

        x    b   h
        │   /    │
       Add       │                 x  b  h
        │        │                 │  │  │
       Relu ─────┼──→ r      ⇒    graphopt::elementwise_0 ──→ r, y
        │        │                  (body: Add → Relu → Mul → Sigmoid)
       Mul ◄─────┘
        │
     Sigmoid ──→ y

Rules: a node joins a group when it is a default-domain elementwise/broadcast op (ELEMENTWISE;
Clip only with constant or omitted bounds; also QuickGelu, a fused SiLU) without subgraphs;
groups grow along producer → consumer edges, in node order, so a group is connected. Merging
two groups is refused when
  * the union would exceed `max_group_size` nodes, or
  * with a target, its members would not all be placed on the same device, or
  * a path leaves the union and re-enters it (through other ops or other groups, which become
    single nodes too): the fused node would then be its own ancestor — a cycle.
With `epilogues`, a Conv, ConvTranspose, MatMul or Gemm also joins the group of its
elementwise consumers as the kernel they are the epilogue of, one such op per group, and
nothing that computes its operands (a Cast before it) joins that group.
A group needs ≥ 2 nodes. Every value it reads from outside (graph inputs, initializers,
other nodes' outputs) is a function input; every value it defines that is a graph output or
read outside the group (even an intermediate) is a function output, so no node is refused for
having extra readers. Attributes stay on the body nodes. Groups with the same body share one
function. Only the main graph is rewritten; injective ops (Transpose, Reshape, …) and
reductions do not join.
"""

from __future__ import annotations

import onnx

from graphopt.ir import Graph, Model, Node, Value
from graphopt.ir.onnx_export import node_to_proto
from graphopt.passes.base import Pass, PassContext, PassResult, register
from graphopt.passes.infer_shapes import infer_shapes

DOMAIN = "graphopt"
MAX_GROUP_SIZE = 32
ANCHORS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
ELEMENTWISE = frozenset("""
    Add Sub Mul Div Pow Mod Max Min Mean Sum Where Cast CastLike Clip
    Relu LeakyRelu PRelu Elu Selu Celu ThresholdedRelu Sigmoid HardSigmoid HardSwish Gelu Mish
    Softplus Softsign Tanh Exp Log Sqrt Neg Abs Erf Reciprocal Sign Floor Ceil Round
    Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh IsNaN IsInf
    Equal Less Greater LessOrEqual GreaterOrEqual And Or Xor Not BitwiseAnd BitwiseOr BitwiseXor
    BitwiseNot
""".split())


# Elementwise ops of other domains that FuseGelu makes of default-domain ones: a SiLU becomes
# QuickGelu on an NPU, and must still join the Add after it as the Sigmoid and Mul would have.
CONTRIB_ELEMENTWISE = frozenset({("com.microsoft", "QuickGelu")})


def _single_output_op(node: Node, graph: Graph) -> bool:
    """A node of `graph` with one output and no subgraphs."""
    return node.graph is graph and not node.subgraphs() \
        and len(node.outputs) == 1 and node.outputs[0] is not None


def _eligible(node: Node, graph: Graph) -> bool:
    elementwise = (node.op_type in ELEMENTWISE if node.is_onnx
                   else (node.domain, node.op_type) in CONTRIB_ELEMENTWISE)
    if not elementwise or not _single_output_op(node, graph):
        return False
    # Clip's bounds are inputs since opset 11; fused only when fixed at compile time (TVM
    # treats clip as elementwise with attribute bounds).
    if node.op_type == "Clip":
        return all(v is None or v.is_constant for v in node.inputs[1:])
    return True


def _anchor(node: Node, graph: Graph) -> bool:
    """A compute op whose elementwise consumers may join it as its epilogue (TVM's
    out-elementwise-fusable: conv2d or dense followed by bias, activation, residual)."""
    return node.is_onnx and node.op_type in ANCHORS and _single_output_op(node, graph)


def _devices(model: Model, target) -> dict[int, str]:
    """The device of `target` each main-graph node would be placed on (empty without a
    target). A group is placed as one node, on the host if any member has no kernel on the
    NPU: a SiLU grouped with a Celu the NPU lacks had gone to the host with it."""
    if target is None:
        return {}
    from graphopt.partition.placement import place

    return {id(node): placement.device for node, placement in place(model, target).items()}


def _lift(node: Node, graph: Graph) -> Node | None:
    """The node of `graph` that contains `node` (itself, or the owner of its subgraph)."""
    while node is not None and node.graph is not graph:
        owner = node.graph
        node = owner.parent if owner is not None else None
    return node


@register
class FuseElementwise(Pass):
    name = "FuseElementwise"
    description = "fuse connected elementwise ops into one graphopt:: local-function node each"

    # Epilogues are off by default: on onnxruntime's CPU provider a MatMul inside a local function
    # measured 2% slower on gpt2_small at -O3 (3.91 vs 3.82 ms); NPU targets will turn them on.
    # Arguments override the compile's options (elementwise_max_group, elementwise_epilogues).
    def __init__(self, max_group_size: int | None = None, epilogues: bool | None = None):
        self.max_group_size = max_group_size
        self.epilogues = epilogues

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        result = PassResult()
        if model.ir_version < 8:  # model-local functions arrived with IR 8
            ctx.note("FuseElementwise: skipped, IR version < 8 has no model-local functions")
            return result
        graph = model.graph
        if self.max_group_size is None:
            self.max_group_size = getattr(ctx.options, "elementwise_max_group", MAX_GROUP_SIZE)
        if self.epilogues is None:
            self.epilogues = getattr(ctx.options, "elementwise_epilogues", False)
        if any(v is not None and v.dtype is None for n in graph for v in n.outputs):
            # Values the fusions' rewrites left untyped (LowerLRN's x², say) are typed by the
            # final InferShapes, but ONNX inference cannot see through a function whose body
            # holds a contrib op (a SiLU's QuickGelu): type them while their producers show.
            infer_shapes(model)
        self.device = _devices(model, ctx.target)
        groups = [g for g in self._groups(graph) if len(g) >= 2]
        functions = {_key(f): f for f in model.functions if f.domain == DOMAIN}
        for members in groups:
            # A group is gated at its last member, where the fused node takes its place.
            if not ctx.allows(self.name, members[-1]):
                continue
            if self._fuse(model, graph, members, functions):
                result.count("groups")
                result.count("fused_nodes", len(members))
        if result.changed:
            model.opset_imports.setdefault(DOMAIN, 1)
            graph.sort()  # external readers may sit between members: move them after the node
        return result

    def _groups(self, graph: Graph) -> list[list[Node]]:
        order = graph.nodes()
        self.pos = {id(n): i for i, n in enumerate(order)}
        self.group_of = {id(n): i for i, n in enumerate(order)}  # every node starts alone
        self.members: dict[int, list[Node]] = {i: [n] for i, n in enumerate(order)}
        self.anchors = {i: int(_anchor(n, graph)) for i, n in enumerate(order)}
        self.graph = graph
        for node in order:
            if not _eligible(node, graph):
                continue
            for value in node.inputs:
                producer = value.producer if value is not None else None
                if producer is None or not (_eligible(producer, graph) or (
                        self.epilogues and _anchor(producer, graph))):
                    continue
                a, b = self.group_of[id(node)], self.group_of[id(producer)]
                if a == b or len(self.members[a]) + len(self.members[b]) > self.max_group_size:
                    continue
                if self.device.get(id(node)) != self.device.get(id(producer)):
                    continue  # the group would run where its least capable member can
                if self.anchors[a] + self.anchors[b] > 1:
                    continue  # one compute op per kernel: its epilogue, not a second GEMM
                if self.anchors[a] + self.anchors[b] and self._feeds_anchor(a, b):
                    continue  # an epilogue follows its kernel: nothing of it runs before
                if not self._creates_cycle({a, b}, self.pos[id(node)]):
                    self._merge(a, b)
        return [sorted(m, key=lambda n: self.pos[id(n)]) for m in self.members.values()]

    def _feeds_anchor(self, a: int, b: int) -> bool:
        """Whether the union of groups a and b would compute an input of its anchor (a Cast
        before a MatMul, and a Mul reading both): the cube kernel reads its operands from
        outside its epilogue group."""
        union = self.members[a] + self.members[b]
        inside = {id(n) for n in union}
        anchor = next(n for n in union if _anchor(n, self.graph))
        return any(v is not None and id(v.producer) in inside for v in anchor.inputs)

    def _merge(self, a: int, b: int) -> None:
        self.anchors[a] += self.anchors.pop(b)
        for node in self.members.pop(b):
            self.group_of[id(node)] = a
            self.members[a].append(node)

    def _readers(self, node: Node):
        for value in node.outputs:
            for use in (value.uses if value is not None else ()):
                reader = _lift(use.node, self.graph)
                if reader is not None and reader is not node:
                    yield reader

    def _creates_cycle(self, union: set[int], limit: int) -> bool:
        """Whether a path leaves the union of these groups and comes back, with every group
        contracted to one node. Nodes are merged in order, so every multi-node group lies at
        or before `limit` and a single node after it can never lead back: it is not explored."""
        stack = [r for g in union for m in self.members[g] for r in self._readers(m)
                 if self.group_of[id(r)] not in union]
        seen: set[int] = set()
        while stack:
            node = stack.pop()
            group = self.group_of[id(node)]
            if group in seen or self.pos[id(node)] > limit:
                continue
            seen.add(group)
            for member in self.members[group]:  # reaching one member reaches the whole group
                for reader in self._readers(member):
                    if self.group_of[id(reader)] in union:
                        return True
                    stack.append(reader)
        return False

    def _fuse(self, model: Model, graph: Graph, members: list[Node], functions: dict) -> bool:
        inside = {id(n) for n in members}
        inputs: list[Value] = []
        outputs: list[Value] = []
        for node in members:
            for value in node.inputs:
                if value is not None and id(value.producer) not in inside \
                        and all(v is not value for v in inputs):
                    inputs.append(value)
            out = node.outputs[0]
            if out.is_graph_output or any(id(r) not in inside for r in self._readers(node)):
                outputs.append(out)
        if not outputs:
            return False  # a dead group: EliminateDeadNodes removes it
        function = _body(members, inputs, outputs, model.opset_imports)
        key = _key(function)
        if key not in functions:
            taken = model.function_keys()
            index = len(functions)
            while (DOMAIN, f"elementwise_{index}") in taken:
                index += 1
            function.name = f"elementwise_{index}"
            model.functions.append(function)
            functions[key] = function
        for value in outputs:
            value.producer = None  # handed over to the fused node below
        fused = Node(functions[key].name, inputs, domain=DOMAIN, outputs=outputs,
                     name=graph.fresh_node_name(functions[key].name))
        graph.insert_before(members[-1], fused)
        for node in members:
            graph.remove(node, safe=False)
        return True


def _body(members: list[Node], inputs: list[Value], outputs: list[Value],
          opsets: dict[str, int]) -> onnx.FunctionProto:
    """The function with canonical names (x*, t*, y*), so equal groups give equal protos."""
    names = {id(v): f"x{i}" for i, v in enumerate(inputs)}
    names.update({id(v): f"y{i}" for i, v in enumerate(outputs)})
    function = onnx.FunctionProto()
    function.domain = DOMAIN
    function.input.extend(f"x{i}" for i in range(len(inputs)))
    function.output.extend(f"y{i}" for i in range(len(outputs)))
    for node in members:
        out = node.outputs[0]
        names.setdefault(id(out), f"t{len(names)}")
        proto = node_to_proto(node)
        proto.name = proto.doc_string = ""
        proto.ClearField("metadata_props")
        del proto.input[:], proto.output[:]
        proto.input.extend(names[id(v)] if v is not None else "" for v in node.inputs)
        proto.output.append(names[id(out)])
        function.node.append(proto)
    for domain, version in sorted(opsets.items()):
        if domain != DOMAIN:
            function.opset_import.add(domain=domain, version=version)
    return function


def _key(function: onnx.FunctionProto) -> bytes:
    copy = onnx.FunctionProto()
    copy.CopyFrom(function)
    copy.name = ""
    return copy.SerializeToString(deterministic=True)
