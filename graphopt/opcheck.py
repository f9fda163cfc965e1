"""Checks that every op is known (an ONNX schema, an onnxruntime kernel schema, or a model
function), that ONNX-domain nodes fit their schema (input/output counts, attribute names and
types) and that ONNX's shape inference accepts their attribute values, as onnxruntime will
when it loads the result; a problem is reported by node before any pass runs."""

from __future__ import annotations

import functools
import re

import onnx
import onnx.checker
from onnx import AttributeProto, GraphProto, NodeProto, TensorProto

from graphopt.codegen.om_manifest import elem_type_label
from graphopt.errors import InputError
from graphopt.ir import DType, Model, Node
from graphopt.ir.node import unnamed_label
from graphopt.ir.onnx_export import attribute_to_proto
from graphopt.option_names import setting

ONNX_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview.training")
# From this many nodes the check infers types once per kind of node (kind_inference), below it
# in one whole-model run. Asking ONNX about one node costs about what four nodes cost the
# whole-model run: inference by kind pays where most nodes repeat an earlier node's kind and
# types, as the repeated blocks of a large transformer do, and loses on a conv net whose every
# stage has new shapes (bench/check_input.py times both).
BY_KIND_NODES = 2048


@functools.lru_cache(maxsize=1)
def runtime_schemas() -> frozenset[tuple[str, str]]:
    """(domain, op) of every operator schema this onnxruntime build registers."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as C

        return frozenset((s.domain, s.name) for s in C.get_all_operator_schema())
    except (ImportError, AttributeError):
        return frozenset()


def _known(domain: str, op_type: str, functions: set[tuple[str, str]]) -> bool:
    domain = "" if domain == "ai.onnx" else domain
    if (domain, op_type) in functions:
        return True
    if domain in ("", "ai.onnx.ml", "ai.onnx.preview.training") and onnx.defs.has(op_type, domain):
        return True
    return (domain, op_type) in runtime_schemas()


def known_op_domains() -> set[str]:
    """The domains whose ops ONNX or onnxruntime define: any other is a custom op library's."""
    return {d for d, _ in runtime_schemas()} | {"", "ai.onnx.ml", "ai.onnx.preview.training"}


def check_ops(model: Model, label: str,
              allow_custom_ops: bool = False) -> dict[str, bytes] | None:
    """Raise InputError on the first node whose domain is not imported, whose op is unknown,
    that does not fit its schema, or that shape inference refuses (negative kernel, …).
    Returns the types strict shape inference gave the computed values (value name ->
    serialized TypeProto; None when inference could not run): passes.infer_shapes.
    record_type_bytes keeps them, and a model they type fully needs no further inference."""
    imported = {("" if d == "ai.onnx" else d) for d in model.opset_imports}
    functions = model.function_keys()
    known_domains = known_op_domains()
    checker = _checker_context(model)
    known: dict[tuple[str, str], bool] = {}
    checked: dict[tuple[str, str], bool] = {}  # ops onnx.checker has a schema to check with
    versions: dict[tuple[str, str], str | None] = {}  # why onnxruntime cannot run the op
    # Nodes alike in what the schema check reads (op, which inputs and outputs are present,
    # attribute names, kinds and values) get the same verdict: a 100k-node model has a few
    # hundred kinds. Only passes are remembered; a failure is reported with its own node.
    fitting: set[tuple] = set()
    kinds: list[tuple | None] = []  # the schema keys again, for inference by kind of node
    for node in model.graph.all_nodes():
        domain = "" if node.domain == "ai.onnx" else node.domain
        if domain not in imported:
            raise InputError(f"{_where(label, node)}: domain '{domain}' is not in the model's "
                             "opset_import")
        op = (domain, node.op_type)
        is_known = known.get(op)
        if is_known is None:
            is_known = known[op] = _known(domain, node.op_type, functions)
        if is_known:
            standard = checked.get(op)
            if standard is None:  # onnxruntime's own ops in an ONNX domain: no ONNX schema
                standard = checked[op] = (domain in ONNX_DOMAINS and op not in functions
                                          and onnx.defs.has(node.op_type, domain))
            if standard:
                gap = versions.get(op, "")
                if gap == "":
                    gap = versions[op] = _kernel_gap(domain, node.op_type, model)
                if gap:
                    raise InputError(f"{_where(label, node)}: {gap}")
                key = _schema_key(node)
                kinds.append(key)
                if key is not None and key in fitting:
                    continue
                problem = _schema_problem(node, checker) or _early_negative_axes(node, model)
                if problem:
                    raise InputError(f"{_where(label, node)}: {problem}")
                if key is not None:
                    fitting.add(key)
            elif op not in functions:  # an onnxruntime op: its own schema is the judge
                key = _schema_key(node)
                if key is not None and key in fitting:
                    continue
                problem = _runtime_schema_problem(node, model.opset(domain) or 1)
                if problem:
                    raise InputError(f"{_where(label, node)}: {problem}")
                if key is not None:
                    fitting.add(key)
            continue
        where = _where(label, node)
        if domain in known_domains or not allow_custom_ops:
            if domain in known_domains:
                raise InputError(f"{where}: unknown op '{node.op_type}' in domain "
                                 f"'{domain or 'ai.onnx'}' (no ONNX or onnxruntime schema, no model "
                                 "function)")
            raise InputError(f"{where}: unknown domain '{domain}' (no schema or model function "
                             f"defines its ops); pass {setting('allow_custom_ops')} to keep custom "
                             "ops as they are")
    if len(kinds) == len(model.graph) >= BY_KIND_NODES:  # ONNX ops only, no nested graphs
        from graphopt.kind_inference import infer_by_kind

        types = infer_by_kind(model, label, kinds)
        if types is not None:
            return types
    return check_inference(model, label)


def _kernel_gap(domain: str, op_type: str, model: Model) -> str | None:
    """Why onnxruntime's CPU provider has no kernel for the op at the version the model's
    opset resolves it to (None when it has one): onnxruntime refuses such a model at load,
    as every .om partition it runs would be."""
    from graphopt.partition.target_ort import cpu_kernel_absent, cpu_kernel_gap, ort_since_version

    opset = model.opset(domain)
    try:
        schema = onnx.defs.get_schema(op_type, opset or 1, domain)
    except onnx.defs.SchemaError:
        return None
    if schema.has_function or schema.has_context_dependent_function:
        return None  # onnxruntime expands it from the function body when it has no kernel
    absent = cpu_kernel_absent(op_type, domain)  # a training op such as Gradient, say
    if absent:
        return f"{absent} (no function body to expand either), so no session can load it"
    # onnxruntime matches kernels against the schema version its own registry resolves.
    since = ort_since_version(op_type, domain, opset or 1) or schema.since_version
    gap = cpu_kernel_gap(op_type, domain, since)
    return gap and f"{gap}; onnx.version_converter can move the model to an opset onnxruntime runs"


def check_kernel_dtypes(model: Model, label: str, skip_bfloat16: bool = False) -> None:
    """Raise InputError on the first node onnxruntime's CPU provider has a kernel for, but not
    for the dtypes the node reads and writes (a Cast to float4e2m1, an int4 Identity), and on
    the first whose dtypes its schema refuses (a type parameter bound to two dtypes):
    onnxruntime refuses such a model at load, and every .om partition holding it with it.
    Ops without a kernel at all, and ops onnxruntime may expand from a function body instead,
    are left to check_ops; values of unknown dtype are taken to fit. `skip_bfloat16` leaves
    the nodes that read or write bfloat16 to an NPU target's placement."""
    from graphopt.codegen.om_manifest import dtype_name
    from graphopt.partition.target_ort import ort_since_version, schema_type_problem

    def names(values) -> tuple[str | None, ...]:
        return tuple(None if v is None or v.dtype is None else dtype_name(int(v.dtype))
                     for v in values)

    verdicts: dict[tuple, bool | None] = {}
    for node in model.graph.all_nodes():
        if skip_bfloat16 and any(v is not None and v.dtype == DType.BFLOAT16
                                 for v in (*node.inputs, *node.outputs)):
            continue
        # Keyed by the dtypes as they are: a large model has a few hundred kinds of node.
        key = (node.op_type, node.domain, tuple(v and v.dtype for v in node.inputs),
               tuple(v and v.dtype for v in node.outputs))
        binds = verdicts.get(key, "")
        if binds == "":  # a new kind of node
            version = model.opset(node.domain)
            fixed = _fixed_output_problem(node, version) or (
                version is not None and schema_type_problem(
                    node.op_type, node.domain, version, list(names(node.inputs))))
            if fixed:
                raise InputError(f"{_where(label, node)}: {fixed}; onnxruntime refuses the "
                                 f"model{_mixed_layer_norm_hint(node)}")
            binds = verdicts[key] = None if version is None or expandable(
                node.op_type, node.domain, version) else _binds(
                node.op_type, node.domain, version, names(node.inputs), names(node.outputs))
        if binds is False:
            version = model.opset(node.domain)
            typed = ", ".join(f"{v.name} {dtype}" for v, dtype in
                              zip((*node.inputs, *node.outputs),
                                  (*names(node.inputs), *names(node.outputs)))
                              if v is not None and dtype is not None)
            since = ort_since_version(node.op_type, node.domain, version)
            raise InputError(f"{_where(label, node)}: onnxruntime's CPU provider has no "
                             f"{node.op_type}-{since} kernel for these dtypes ({typed}), "
                             "so no session can load it")


def _mixed_layer_norm_hint(node: Node) -> str:
    """Advice for the LayerNormalization of float16 and float32 values that PyTorch's
    TorchScript exporter writes for a model in float16 (`model.half()`)."""
    dtypes = {v.dtype for v in (*node.inputs, *node.outputs) if v is not None}
    if node.op_type != "LayerNormalization" or not {DType.FLOAT16, DType.FLOAT} <= dtypes:
        return ""
    return (" (PyTorch's TorchScript exporter writes this for a float16 model: export it in "
            f"float32 and compile with {setting('precision', 'fp16')}, or export with "
            "torch.onnx.export(..., dynamo=True))")


def _fixed_output_problem(node: Node, version: int | None) -> str | None:
    """An output declared with another element type than the one its schema fixes (ai.onnx.ml's
    TreeEnsembleRegressor always writes float: skl2onnx declares double for a float64 tree,
    which onnx.checker and onnxruntime refuse, and ONNX's inference has no rule to say so)."""
    if version is None:
        return None
    try:
        schema = onnx.defs.get_schema(node.op_type, version,
                                      "" if node.domain == "ai.onnx" else node.domain)
    except onnx.defs.SchemaError:
        return None
    for formal, value in zip(schema.outputs, node.outputs):
        fixed = _FIXED_TENSOR.fullmatch(formal.type_str)
        if value is None or value.dtype is None or fixed is None:
            continue
        expected = getattr(TensorProto, fixed[1].upper(), None)
        if expected is not None and int(value.dtype) != expected:
            return (f"output '{value.name}' is declared {elem_type_label(int(value.dtype))}, "
                    f"but the op always writes {elem_type_label(expected)}")
    return None


_FIXED_TENSOR = re.compile(r"tensor\((\w+)\)")


def _binds(op_type: str, domain: str, version: int, inputs: tuple, outputs: tuple) -> bool | None:
    from graphopt.partition.target_ort import cpu_kernel_binds

    binds = cpu_kernel_binds(op_type, domain, version, list(inputs), list(outputs))
    if binds is False and "float16" in inputs + outputs:
        # onnxruntime runs a float16 node the CPU has no float16 kernel for in float32,
        # between Casts it inserts at load (its InsertCastTransformer; bfloat16 gets none).
        as_float = [tuple("float32" if d == "float16" else d for d in ds) for ds in (inputs, outputs)]
        binds = cpu_kernel_binds(op_type, domain, version, *map(list, as_float))
    return binds


@functools.cache
def expandable(op_type: str, domain: str, version: int) -> bool:
    """Whether the op's ONNX schema at this opset has a function body, from which onnxruntime
    runs it when no kernel takes the node's dtypes."""
    domain = "" if domain == "ai.onnx" else domain
    try:
        schema = onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return False
    return schema.has_function or schema.has_context_dependent_function


def _where(label: str, node: Node) -> str:
    return f"{label}: node {node.label} ({node.qualified_op})"


_PLAIN_KINDS = {AttributeProto.INT, AttributeProto.FLOAT, AttributeProto.STRING,
                AttributeProto.INTS, AttributeProto.FLOATS, AttributeProto.STRINGS}


_KEYED_LIST = 1024


def _schema_key(node: Node) -> tuple | None:
    """What onnx.checker.check_node reads of `node`, as a hashable key; None when an attribute
    holds a tensor, graph or type, or a list too long to be worth a key (a tree ensemble's
    255,000 split values took 0.4 s to repr): such nodes are checked one by one."""
    attrs = []
    for attr in node.attrs.values():
        if attr.type not in _PLAIN_KINDS or attr.ref_attr_name \
                or isinstance(attr.value, list) and len(attr.value) > _KEYED_LIST:
            return None
        value = attr.value
        # repr keeps floats exact and tells -0.0 from 0.0; lists become tuples.
        attrs.append((attr.name, attr.type, repr(value) if attr.type in
                      (AttributeProto.FLOAT, AttributeProto.FLOATS) else
                      tuple(value) if isinstance(value, list) else value))
    return (node.domain, node.op_type, tuple(v is not None for v in node._inputs),
            tuple(v is not None for v in node._outputs), tuple(attrs))


def _checker_context(model: Model) -> onnx.checker.C.CheckerContext:
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = model.ir_version
    ctx.opset_imports = {("" if d == "ai.onnx" else d): v for d, v in model.opset_imports.items()}
    return ctx


def _schema_problem(node: Node, ctx) -> str | None:
    """Why `node` does not fit its ONNX schema at the model's opset, or None. Passes and
    onnxruntime rely on what the schema promises: an attribute of the declared type, the
    inputs a kernel reads."""
    problem = _schema_mismatch(node, ctx)
    unknown = "Unrecognized attribute: "
    if problem is None or not problem.startswith(unknown) or node.domain not in ("", "ai.onnx"):
        return problem
    return problem + _later_attribute(node.op_type, problem[len(unknown):].split()[0],
                                      ctx.opset_imports.get("", 1))


def _later_attribute(op_type: str, name: str, opset: int) -> str:
    """Where a later opset gives `op_type` the attribute `name` (an exporter that writes
    Split-18's num_outputs into an opset-17 model), how to read it; else ''."""
    for version in range(opset + 1, onnx.defs.onnx_opset_version() + 1):
        known = _schema_attributes(op_type, version)
        if known is not None and name in known:
            since = onnx.defs.get_schema(op_type, version, "").since_version
            return (f" (it came with {op_type}-{since}, and the model imports opset {opset}: "
                    f"export it at opset {since} or later)")
    return ""


def _schema_mismatch(node: Node, ctx) -> str | None:
    domain = "" if node.domain == "ai.onnx" else node.domain
    proto = NodeProto(op_type=node.op_type, domain=domain, name=node.name)
    proto.input.extend(v.name if v is not None else "" for v in node.inputs)
    proto.output.extend(v.name if v is not None else "" for v in node.outputs)
    for attr in node.attrs.values():
        if attr.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
            # Only the attribute's type here: bodies read outer values, which the checker
            # would need a lexical scope for; their own nodes are checked one by one.
            empty = AttributeProto(name=attr.name, type=attr.type)
            if attr.type == AttributeProto.GRAPH:
                empty.g.CopyFrom(GraphProto(name=attr.value.name or "body"))
            proto.attribute.append(empty)
        else:
            proto.attribute.append(attribute_to_proto(attr))
    try:
        onnx.checker.check_node(proto, ctx)
    except onnx.checker.ValidationError as exc:
        # onnx's message, first line only: the rest repeats the node in protobuf text form.
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        return lines[0] if lines else "does not match its ONNX schema"
    if not domain and node.attrs:
        # The checker lets an unknown attribute through on some ops (LayerNormalization's
        # `body` graph compiled to an .om onnxruntime could not load).
        known = _schema_attributes(node.op_type, ctx.opset_imports.get("", 1))
        unknown = [name for name in node.attrs if known is not None and name not in known
                   and not name.startswith("__")]  # internal symbols, as onnx skips them
        if unknown:
            return f"Unrecognized attribute: {unknown[0]} for operator {node.op_type}"
    return None


@functools.lru_cache(maxsize=None)
def _schema_attributes(op_type: str, opset: int) -> frozenset[str] | None:
    """The attribute names ONNX's schema of `op_type` at `opset` declares; None without one."""
    try:
        return frozenset(onnx.defs.get_schema(op_type, opset, "").attributes)
    except onnx.defs.SchemaError:
        return None


def _early_negative_axes(node: Node, model: Model) -> str | None:
    """Why a Squeeze or Unsqueeze before opset 11 cannot take its negative axes, or None.
    Counting axes from the end came with opset 11; onnxruntime runs such a node anyway, but
    ONNX's shape inference reads -1 otherwise, and the passes would follow it to a wrong
    shape (an Unsqueeze of [2, 3] removed as if it added nothing)."""
    if node.op_type not in ("Squeeze", "Unsqueeze") or node.domain not in ("", "ai.onnx"):
        return None
    version = model.opset("") or 1
    axes = node.attr("axes") or []
    negative = [axis for axis in axes if axis < 0]
    if version >= 11 or not negative:
        return None
    return (f"axes {list(axes)}: negative axes count from the end only from opset 11, and the "
            f"model imports opset {version}, where shape inference reads them otherwise than "
            "onnxruntime runs them; write them as non-negative axes or re-export at opset 11 "
            "or later")


def _runtime_schema_problem(node: Node, opset: int) -> str | None:
    """Why `node` does not fit the schema onnxruntime registers for its op at the model's
    opset (input and output counts, attribute names and kinds), which onnxruntime checks when
    it loads the model (None when it fits, or when onnxruntime has no schema for it)."""
    from graphopt.partition.target_ort import op_key, runtime_schema

    schema = runtime_schema(node.op_type, node.domain, opset)
    if schema is None:
        return None
    name = f"{op_key(node.op_type, node.domain)}-{schema.since_version}"
    for what, count, low, high in (("input", len(node._inputs), schema.min_input, schema.max_input),
                                   ("output", len(node._outputs), schema.min_output,
                                    schema.max_output)):
        if not low <= count <= high:
            wanted = f"{low}" if low == high else f"{low} to {high}"
            return f"{count} {what}(s) where {name} takes {wanted}"
    declared = schema.attributes
    for attr in node.attrs.values():
        formal = declared.get(attr.name)
        if formal is None:
            if attr.name.startswith("__"):  # an internal symbol, which schema checks skip
                continue
            return f"{name} has no attribute '{attr.name}'"
        kind = formal.type.name
        given = AttributeProto.AttributeType.Name(attr.type)
        if not attr.ref_attr_name and kind != "UNDEFINED" and given != kind:
            return f"attribute '{attr.name}' is {given} where {name} takes {kind}"
    missing = sorted(n for n, formal in declared.items() if formal.required and n not in node.attrs)
    if missing:
        return f"{name} requires attribute(s) {', '.join(missing)}"
    return None


def check_inference(model: Model, label: str) -> dict[str, bytes] | None:
    """Strict ONNX shape inference, which onnxruntime also runs when it loads a model: attribute
    values no kernel can honor (kernel_shape -1, pads of the wrong length, a perm that is not a
    permutation) are the input's fault, and are better reported now than by the .om's loader."""
    from graphopt.passes.infer_shapes import inferred_types, weightless_proto
    from graphopt.passes.ml_types import declare_spec_types

    proto = weightless_proto(model, value_infos=False)
    # Unnamed nodes get a name for the error to give, mapped back to how messages name them.
    labels: dict[str, str] = {}
    # Only the nodes are judged: a declared output or intermediate shape that disagrees with
    # the inferred one is a stale annotation onnxruntime overrides with a warning.
    for graph in _graphs(proto.graph):
        del graph.value_info[:]
        for node in graph.node:
            if not node.name:
                node.name = f"graphopt-unnamed-{len(labels)}"
                labels[node.name] = unnamed_label("", [o for o in node.output if o])
            if node.domain == "ai.onnx":  # an alias onnxruntime accepts, inference does not
                node.domain = ""
            if node.domain == "" and not onnx.defs.has(node.op_type, ""):
                # onnxruntime's own op in the default domain (SimplifiedLayerNormalization, as
                # its optimizer and FuseLayerNorm write it): check_ops knew it, inference has
                # no schema and would refuse it, so it sees a domain it leaves alone.
                node.domain = _RUNTIME_ONLY
        # An input returned as it is keeps its shape: cleared, it would leave inference
        # blind to the shape of the input itself.
        inputs = {i.name for i in graph.input}
        for output in graph.output:
            if output.type.HasField("tensor_type") and output.name not in inputs:
                output.type.tensor_type.ClearField("shape")
    for graph in _graphs(proto.graph):
        declare_spec_types(graph)  # after the value infos went: none crash inference
    if any(n.domain == _RUNTIME_ONLY for g in _graphs(proto.graph) for n in g.node):
        proto.opset_import.add(domain=_RUNTIME_ONLY, version=1)
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=True,
                                                     data_prop=False)
    except onnx.shape_inference.InferenceError as exc:
        text = str(exc).strip()
        # "[ShapeInferenceError] Inference error(s): (op_type:Conv, node name: c): [..] why\n…"
        first = text.split("Inference error(s): ", 1)[-1].splitlines()[0] if text else ""
        if _UNTYPED_INPUT in first:
            # An op without type inference (ai.onnx.ml's Scaler) left its output untyped, and
            # strict mode faults the next node for it: the model is not wrong, onnxruntime
            # types it at run time. What inference can say is said without strict mode.
            inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, data_prop=False)
            return inferred_types(model, inferred)
        node = _INFERENCE_NODE.match(first)
        if node and node[3].startswith(_NESTED) and _has_schema_function(model, node[1]):
            # The error is in the body ONNX's schema gives the op (MeanVarianceNormalization-13's
            # Constant, which its own inference refuses), not in the model: onnxruntime runs
            # the op with a kernel. Only what inference can say without strict mode is kept.
            inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, data_prop=False)
            return inferred_types(model, inferred)
        if node:  # worded as inference by kind words it
            named = labels.get(node[2] or "") or f"'{node[2] or '?'}'"
            raise InputError(f"{label}: node {named} ({node[1]}): shape inference "
                             f"refuses it: {_in_words(node[3])}") from None
        raise InputError(f"{label}: shape inference refuses the model: "
                         f"{first or type(exc).__name__}") from None
    except onnx.checker.ValidationError as exc:  # the model as a whole: recursive functions, …
        raise InputError(f"{label}: {str(exc).strip().splitlines()[0]}") from None
    except (ValueError, RuntimeError):
        return None  # inference could not run at all (a model past 2 GB); onnxruntime will judge
    return inferred_types(model, inferred)


_ELEM_TYPES_DIFFER = re.compile(r"Inferred elem type differs from existing elem type: "
                                r"\((\d+)\) vs \((\d+)\)")
_TYPE_CASES_DIFFER = re.compile(r"type case mismatch\. existing=(\w+)_type "
                                r"inferred=(\w+)_type")


def _in_words(reason: str) -> str:
    """Inference's element type numbers and type cases in words: what the node computes
    against what the model declares for the value (a graph input's or output's type)."""
    def named(match: re.Match) -> str:
        computed, declared = (elem_type_label(int(match[i])) for i in (1, 2))
        return f"it computes {computed} where the model declares {declared} for its output"

    def cased(match: re.Match) -> str:
        return f"it takes or computes a {match[2]} where the model declares a {match[1]}"

    return _TYPE_CASES_DIFFER.sub(cased, _ELEM_TYPES_DIFFER.sub(named, reason))


_UNTYPED_INPUT = "expected to have type but instead is null"
_NESTED = "[ShapeInferenceError] Inference error(s): (op_type:"


def _has_schema_function(model: Model, op_type: str) -> bool:
    """Whether the default-domain op has a function body in ONNX's schema at the model's
    opset (a model-local function of that name is the model's own)."""
    if ("", op_type) in model.function_keys() or not onnx.defs.has(op_type, ""):
        return False
    return expandable(op_type, "", model.opset("") or 1)
_RUNTIME_ONLY = "graphopt.onnxruntime_only"
_INFERENCE_NODE = re.compile(r"\(op_type:([^,)]*)(?:, node name: ([^)]*))?\): (.*)")


def _graphs(graph: GraphProto):
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            for sub in attr.graphs:
                yield from _graphs(sub)
