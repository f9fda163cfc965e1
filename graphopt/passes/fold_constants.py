"""FoldConstants: evaluate the nodes whose inputs are all constants, once, at compile time.

Per graph (the main graph, then nested ones) the pass collects the foldable region in
topological order, evaluates what is needed of it in ONE onnxruntime session (ORT_DISABLE_ALL,
CPU), and replaces the region's frontier values (those read by nodes outside the region) with
initializers of the same name:

    %w ──► Transpose ──► Mul(·, %c) ──► %s ──► MatMul(%x, %s)
      ⇒   %s = initializer (the data of Mul(Transpose(%w), %c))  ──► MatMul(%x, %s)

Constant nodes and Identity of a constant need no session (the data is reused, not copied), and
CastLike reads only the dtype of its second input, so `CastLike(0, %input)` folds too.

A main-graph output the region computes becomes an initializer of its name, dtype and shape, so
`ConstantOfShape(Shape(%x))` with %x pinned is no node left to run at inference (or to send to
the host beside an NPU partition). A nested graph's outputs keep their nodes, and so do a
Constant output (data already, which ConstantToInitializer leaves as it is too; its readers
still fold) and an output that is an Identity of a weight (an initializer of its own would
store the data twice). An output is folded only up to `Options.fold_size_limit`, even when
its inputs are as large: they may stay, read by other nodes.

If the batched session fails (an op ORT cannot run, a dtype it cannot return), nodes are
evaluated one by one and the ones that fail stay in the graph. A value is never materialized
when it is larger than `Options.fold_size_limit` AND larger than the node's inputs: folding must
not inflate the model (a ConstantOfShape building a 500 MB weight stays a node). Nor is a
Transpose of a weight larger than the limit that other nodes also read, when only MatMul or Gemm
read the transpose: FuseMatMul folds it into their transB without a second copy. Nor is a
DequantizeLinear, whose quantized weight the int8 kernels of a QDQ model read.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

from graphopt.errors import InputError
from graphopt.ir import DType, Graph, Model, Node, Tensor, Value
from graphopt.opcheck import runtime_schemas
from graphopt.passes.base import Pass, PassContext, PassResult, register
from graphopt.passes.facts import constant_node_tensor, random_reason
from graphopt.passes.fold_eval import EvalError, evaluate, is_castlike
from graphopt.passes.fold_sizes import Sizes
from graphopt.passes.tied_tables import RULE, read_through_table, tied_head

# Ops whose output can be far larger than their inputs: folded only when the output size is known.
GENERATORS = {"ConstantOfShape", "Expand", "Tile", "Range", "Resize", "Pad", "OneHot", "EyeLike",
              "Upsample"}
# Element types onnxruntime's Python binding can return; bfloat16 comes back through a float Cast.
_FETCHABLE = {DType.FLOAT, DType.UINT8, DType.INT8, DType.UINT16, DType.INT16, DType.INT32,
              DType.INT64, DType.STRING, DType.BOOL, DType.FLOAT16, DType.DOUBLE, DType.UINT32,
              DType.UINT64, DType.BFLOAT16}


def _ort_knows(domain: str, op_type: str) -> bool:
    return (domain, op_type) in runtime_schemas()


def _refusal(node: Node, functions: set[tuple[str, str]], pinned: set[int]) -> str | None:
    """Why `node` can never be folded, whatever its inputs (None when it may be)."""
    op = node.op_type
    if node.subgraphs():
        return "has a subgraph"
    random = random_reason(node)
    if random:
        return random
    if node.is_onnx:
        if op.startswith(("Sequence", "Optional")) or op == "SplitToSequence":
            return "produces a sequence or optional"
        if op == "DequantizeLinear":
            # A quantized weight stays one: onnxruntime fuses DQ → Conv → Q into its int8
            # kernels and AMCT takes DQ weights for the NPU (ORT's own folding skips DQ too);
            # folded, the weight would be float and four times the bytes.
            return "DequantizeLinear keeps the quantized weight the int8 kernels read"
    elif not _ort_knows(node.domain, op):
        return f"op {node.qualified_op} is unknown to onnxruntime"
    if (node.domain, op) in functions:
        return "calls a model-local function"
    for value in node.outputs:
        if value is None:
            continue
        if id(value) in pinned:
            return f"output %{value.name} is a graph output that keeps its node"
        if value.type_proto is not None:
            return f"output %{value.name} is not a tensor"
        if value.dtype is not None and value.dtype not in _FETCHABLE:
            return f"onnxruntime cannot return {value.dtype.short}"
    return None


def pinned_outputs(model: Model) -> set[int]:
    """The ids of the graph outputs folding leaves to their nodes: every nested graph's, and the
    main graph's whose name an initializer already holds (an output keeps the name its caller
    fetches it by). The main graph's other outputs may become initializers."""
    pinned = {id(v) for g in model.graph.all_graphs() if g is not model.graph for v in g.outputs}
    pinned.update(id(v) for v in model.graph.outputs if v.name in model.graph.initializers)
    return pinned


def fits_output(value: Value, tensor: Tensor) -> bool:
    """Whether `tensor` may stand for graph output `value` without changing its declared type:
    the same dtype, and the same dims wherever they are numbers (a symbolic one takes the size)."""
    if value.dtype is not None and value.dtype != tensor.dtype:
        return False
    if value.shape is None:
        return True
    return len(value.shape) == len(tensor.shape) and all(
        not isinstance(d, int) or d == size for d, size in zip(value.shape, tensor.shape))


def become_initializer(graph: Graph, value: Value, tensor: Tensor) -> Value:
    """An initializer holding `tensor` in place of `value`, whose node is about to go: its readers
    read it, and where `value` is a graph output it takes that place, name and doc string."""
    # The old value disappears with its node, so the initializer may take over its name.
    name = value.name if value.name not in graph.initializers else graph.fresh_name(value.name)
    const = graph.add_initializer(Value(name, const=tensor))
    value.replace_all_uses_with(const)
    if value.is_graph_output:
        const.doc_string, const.metadata_props = value.doc_string, value.metadata_props
        graph.outputs[:] = [const if v is value else v for v in graph.outputs]
    return const


def _scalar_range_bounds(graph: Graph) -> int:
    """Give Range a scalar for each constant one-element bound of shape [1]: onnxruntime runs
    such a bound while it is computed, but once all three are constants its load-time shape
    inference refuses them (and the fold's own session with them). Returns how many changed."""
    changed = 0
    for node in graph:
        if node.op_type != "Range" or not node.is_onnx:
            continue
        for index, bound in enumerate(node.inputs):
            data = bound.constant() if bound is not None else None
            if data is not None and data.ndim and data.size == 1:
                node.set_input(index, graph.make_initializer(f"{bound.name}_scalar",
                                                             data.reshape(())))
                changed += 1
    return changed


def _data_inputs(node: Node) -> list[Value]:
    """Inputs whose data the node reads; CastLike reads only the dtype of its second input."""
    inputs = node.inputs[:1] if is_castlike(node) else node.inputs
    return [v for v in inputs if v is not None]


# Ops whose output is their input's data under another shape (no copy at run time), and ops
# that read rows out of a table.
_VIEWS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten"})
_GATHERS = frozenset({"Gather", "GatherElements", "GatherND", "GatherBlockQuantized"})

class _GraphFolder:
    """Folds one graph; `results` maps id(value) to data computed so far."""

    def __init__(self, model: Model, graph: Graph, limit: int, pinned: set[int], ctx: PassContext):
        self.model, self.graph, self.limit, self.pinned, self.ctx = model, graph, limit, pinned, ctx
        self.outputs = {id(v) for v in graph.outputs}
        self.functions = model.function_keys()
        self.results: dict[int, Tensor] = {}
        self.aliases: dict[int, Value] = {}  # Identity of an existing constant: reuse it
        self.sizes = Sizes(self.results)
        self.deferred = False  # a generator waits for its shape operand to be folded first

    def region(self) -> list[Node]:
        """Foldable nodes in topological order: fixed inputs, allowed op, bounded outputs."""
        region, produced = [], set()
        for node in self.graph:
            if _refusal(node, self.functions, self.pinned) is not None:
                continue
            if not all(v.is_constant or id(v) in produced for v in _data_inputs(node)):
                continue
            if is_castlike(node) and node.input(1).dtype is None:
                continue
            if _float16_run_in_float32(node, self.model):
                continue
            constant = node.op_type == "Constant" and node.is_onnx
            if constant and id(node.output) in self.outputs:
                self._keep_constant_output(node, produced)
                continue
            alias = not constant and node.op_type == "Identity" and node.is_onnx \
                and node.input(0) is not None and node.input(0).is_constant
            if alias and id(node.output) in self.outputs:
                continue  # the output's own initializer would be a second copy of the weight
            if not (constant or alias):
                if self._shared_weight_transpose(node) or self._shared_table_view(node):
                    continue
                if not self._bounded(node):
                    if node.op_type in GENERATORS and any(id(v) in produced
                                                          for v in _data_inputs(node)):
                        self.deferred = True
                    continue
            # A node held back stays, and so does everything reading it (its outputs are not
            # `produced`), exactly as if it could not be folded.
            if not self.ctx.allows(node.op_type, node):
                continue
            if constant:
                tensor = constant_node_tensor(node)
                if tensor is None:  # a sparse value: onnxruntime's fold session refuses 1-D
                    continue        # ones it runs in the model, and dense it could be huge
                self.results[id(node.output)] = tensor
            elif alias:
                self.aliases[id(node.output)] = node.input(0)
            region.append(node)
            produced.update(id(v) for v in node.outputs if v is not None)
        return region

    def _keep_constant_output(self, node: Node, produced: set[int]) -> None:
        """A Constant that is a graph output stays (no rewrite to gate), its data there for the
        nodes that read it."""
        tensor = constant_node_tensor(node)
        if tensor is not None:
            self.results[id(node.output)] = tensor
            produced.add(id(node.output))

    def _shared_weight_transpose(self, node: Node) -> bool:
        """A large weight transposed for MatMul/Gemm while something else also reads it (GPT-2's
        LM head and its tied token embedding): folding would store it twice, and FuseMatMul
        reads it through transB instead, which MLAS runs as fast."""
        return node.op_type == "Transpose" and self._second_copy(
            node, lambda r: r.op_type in ("MatMul", "Gemm") and r.is_onnx)

    def _shared_table_view(self, node: Node) -> bool:
        """A Reshape (or Squeeze, Unsqueeze, Flatten) of a large weight that something else
        reads too, for Gathers alone: an output head tied to its token table, which
        onnxruntime-genai's int4 export gathers as GatherBlockQuantized(Reshape(head's 4-bit
        weight)). Folded, the table was stored twice (a Qwen2-0.5B-like .om took 191 MB for
        123 MB of weights); a view costs nothing at run time."""
        return node.op_type in _VIEWS and self._second_copy(node, lambda r: r.op_type in _GATHERS)

    def _second_copy(self, node: Node, reader_ok) -> bool:
        """Whether folding `node` (an ONNX op of one output) would store a second copy of a
        weight above the limit that something else reads too, for readers `reader_ok` takes."""
        if not node.is_onnx or node.output is None:
            return False
        weight = node.input(0)
        if weight is None or weight.producer is not None or len(weight.consumers()) < 2:
            return False
        readers = node.output.consumers()
        return bool(readers) and not node.output.is_graph_output \
            and all(reader_ok(r) for r in readers) \
            and (self.sizes.nbytes(weight) or 0) > self.limit

    def _bounded(self, node: Node) -> bool:
        self.sizes.estimate(node)
        in_bytes = sum(self.sizes.nbytes(v) or 0 for v in _data_inputs(node))
        for value in node.outputs:
            if value is None:
                continue
            size = self.sizes.nbytes(value)
            if size is None:
                if node.op_type in GENERATORS:
                    return False
            elif size > self.limit and size > in_bytes:
                return False
        return True

    def too_big(self, value: Value) -> bool:
        node = value.producer
        if node.op_type == "Constant":  # its data is in the model already
            return False
        size = self.results[id(value)].nbytes
        if id(value) in self.outputs:
            # A graph output's data is stored beside its inputs, which other nodes may still
            # read (Reshape(W) as an output would store W twice): the limit alone decides.
            return size > self.limit
        in_bytes = sum(self.sizes.nbytes(v) or 0 for v in _data_inputs(node))
        return size > self.limit and size > in_bytes

    def _fits(self, value: Value) -> bool:
        return id(value) not in self.outputs or fits_output(value, self.results[id(value)])

    def run(self) -> Counter:
        """Fold the graph's region; returns the folded nodes per op type. A node whose value
        cannot be had (evaluation failed, result too big) leaves the region with everything
        downstream of it, and the smaller region's frontier is evaluated again."""
        region = self.region()
        per_node = False
        while region:
            members = {id(n) for n in region}
            frontier = [v for n in region for v in n.outputs if v is not None and (
                id(v) in self.outputs or any(id(u.node) not in members for u in v.uses))]
            missing = [v for v in frontier
                       if id(v) not in self.results and id(v) not in self.aliases]
            failed: list[Node] = []
            if missing:
                needed = _needed(missing, region, members, self.results)
                if not per_node:
                    try:
                        self.results.update(evaluate(self.model, needed, self._feeds(needed),
                                                      missing))
                    except EvalError:
                        per_node = True
                if per_node:
                    failed = self._evaluate_each(needed)
            failed += [v.producer for v in frontier if id(v) in self.results
                       and (self.too_big(v) or not self._fits(v))]
            if not failed:
                return self._commit(region, frontier)
            region = _without(region, failed)
        return Counter()

    def _feeds(self, nodes: list[Node]) -> dict[str, Tensor]:
        inside = {id(v) for n in nodes for v in n.outputs if v is not None}
        feeds = {}
        for node in nodes:
            for value in _data_inputs(node):
                if id(value) in inside:
                    continue
                feeds[value.name] = self.results.get(id(value)) or value.const
        return feeds

    def _evaluate_each(self, nodes: list[Node]) -> list[Node]:
        """Fallback: one session per node; returns the nodes that could not be evaluated."""
        failed, errors = [], {}
        for node in nodes:
            if all(id(v) in self.results for v in node.outputs if v is not None):
                continue
            if any(not v.is_constant and id(v) not in self.results for v in _data_inputs(node)):
                failed.append(node)  # an input failed before
                continue
            outputs = [v for v in node.outputs if v is not None]
            try:
                self.results.update(evaluate(self.model, [node], self._feeds([node]), outputs))
            except EvalError as e:
                if e.at_run and self.graph is self.model.graph and _live(node):
                    raise _fails_at_run(self.graph, node, e) from None
                failed.append(node)
                errors.setdefault(node.qualified_op, []).append((node, e))
        for op, cases in errors.items():
            node, error = cases[0]
            self.ctx.note(f"FoldConstants: left {len(cases)} constant {op} node(s) unfolded, "
                          f"onnxruntime cannot evaluate them (first: '{node.name}': {error})")
        return failed

    def _commit(self, region: list[Node], frontier: list[Value]) -> Counter:
        heads = {id(node.output): weight for node in region
                 if (weight := tied_head(node, self.limit, self.sizes)) is not None}
        tables = []
        for value in frontier:
            replacement = self.aliases.get(id(value))
            if replacement is None:
                const = become_initializer(self.graph, value, self.results[id(value)])
                if id(value) in heads:
                    tables.append((heads[id(value)], const))
            else:
                value.replace_all_uses_with(replacement)
        # Reverse order: by then every output of a region node is read only by removed nodes.
        for node in reversed(region):
            self.graph.remove(node)
        folded = Counter(node.op_type for node in region)
        for weight, table in tables:
            folded[f"{RULE}:heads"] += read_through_table(self.graph, weight, table, self.ctx)
        return +folded


def _live(node: Node) -> bool:
    """Whether a graph output depends on `node`: onnxruntime then runs it at every inference."""
    seen, todo = set(), [node]
    while todo:
        current = todo.pop()
        for value in current.outputs:
            if value is None:
                continue
            if value.is_graph_output:
                return True
            for reader in value.consumers():
                if id(reader) not in seen:
                    seen.add(id(reader))
                    todo.append(reader)
    return False


def _fails_at_run(graph: Graph, node: Node, error: EvalError) -> InputError:
    """The error for a node that fails on its constant inputs: the model cannot run as it is
    (typically at the input shapes it was pinned to, e.g. a sequence longer than a position
    table)."""
    message = str(error).split("Status Message: ", 1)[-1]
    shapes = ", ".join(f"{v.name} {list(v.shape)}" for v in graph.inputs
                       if v.shape is not None and not v.is_initializer)
    where = f" with inputs {shapes}" if shapes else ""
    # node.label: "node ''" named no node of the many exports that name none.
    return InputError(f"node {node.label} ({node.qualified_op}) fails on its constant inputs, "
                      f"so the model cannot run{where}: {message}")


def _needed(values: list[Value], region: list[Node], members: set[int],
            known: dict[int, Tensor]) -> list[Node]:
    """Region nodes that must run to compute `values`, in topological order."""
    seen: set[int] = set()
    stack = [v.producer for v in values]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for value in _data_inputs(node):
            if id(value) not in known and value.producer is not None \
                    and id(value.producer) in members:
                stack.append(value.producer)
    return [n for n in region if id(n) in seen]


def _without(region: list[Node], dropped: Iterable[Node]) -> list[Node]:
    """`region` minus `dropped` and every node that reads what they produce."""
    dropped_ids = {id(n) for n in dropped}
    lost: set[int] = set()
    kept = []
    for node in region:
        if id(node) in dropped_ids or any(id(v) in lost for v in _data_inputs(node)):
            lost.update(id(v) for v in node.outputs if v is not None)
        else:
            kept.append(node)
    return kept


@register
class FoldConstants(Pass):
    name = "FoldConstants"
    description = "evaluate nodes whose inputs are all constants with onnxruntime into initializers"

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        result = PassResult()
        graphs = list(model.graph.all_graphs())
        pinned = pinned_outputs(model)
        for graph in graphs:  # outer first: inner graphs then see folded outer values as constants
            result.count("Range:scalar bounds", _scalar_range_bounds(graph))
            for _ in range(ctx.options.max_iterations):
                folder = _GraphFolder(model, graph, ctx.options.fold_size_limit, pinned, ctx)
                folded = folder.run()
                for op_type, count in folded.items():  # rewrites are reported per folded op
                    result.count(op_type, count)
                if not (folded and folder.deferred):
                    break
        return result


# Ops whose float32 result of float16 inputs is a float16 value already (a sign, a choice,
# a move): folded in float16 or run in float32, the same.
_EXACT_IN_HALF = frozenset({
    "Neg", "Abs", "Relu", "Sign", "Ceil", "Floor", "Round", "Max", "Min", "Clip", "Where",
    "ReduceMax", "ReduceMin", "ArgMax", "ArgMin", "Equal", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual", "IsNaN", "IsInf", "Identity", "Reshape", "Transpose", "Squeeze",
    "Unsqueeze", "Flatten", "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND",
    "Expand", "Tile", "Pad", "Cast", "CastLike", "Shape", "Size", "TopK"})


def _float16_run_in_float32(node: Node, model: Model) -> bool:
    """Whether onnxruntime runs this float16 node in float32, between Casts it inserts, for want
    of a float16 CPU kernel (Exp, Sqrt, Reciprocal…): it drops the Casts between two such
    nodes, so their values are never rounded to float16 there, and its own constant folding
    leaves them. Folded, `Reciprocal(Sqrt(a)) * Exp(e)` was stored as float16 infinity where
    the model computes 66300 and gives finite outputs."""
    from graphopt.codegen.om_manifest import dtype_name
    from graphopt.partition.target_ort import cpu_kernel_binds

    values = [v for v in (*node.inputs, *node.outputs) if v is not None]
    if not node.is_onnx or node.op_type in _EXACT_IN_HALF \
            or not any(v.dtype == DType.FLOAT16 for v in values):
        return False
    version = model.opset(node.domain)
    if version is None:
        return False

    def names(vs):
        return [None if v is None or v.dtype is None else dtype_name(int(v.dtype)) for v in vs]

    return cpu_kernel_binds(node.op_type, node.domain, version, names(node.inputs),
                            names(node.outputs)) is False
