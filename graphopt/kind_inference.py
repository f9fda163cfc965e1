"""Strict ONNX shape inference node by node, run once per kind of node: the input check's types
without exporting the whole model to onnx and parsing its answer back.

A 100k-node transformer has a few dozen kinds of node (op, attributes, input types): asking
ONNX once per kind replaces a whole-model round trip that cost 2.4 s of its compile (export,
inference, reading 100k value infos back), and grew faster than the graph. The answers are
those of `onnx.shape_inference.infer_shapes(strict_mode=True, check_type=False,
data_prop=False)` on the same model, whose per-node step is the call made here:

* A node's inputs have the types inference gave their producers (graph inputs and weights
  keep their declared types); what an earlier node was not typed leaves the model to the
  whole-model run.
* Weights of at most `_DATA_LIMIT` bytes and Constant outputs are passed as data, as the
  whole-model run reads them (a Reshape's target shape, a Slice's bounds).
* A kind that reads data is asked again for each distinct data. Whether it reads any is asked
  once, at its first node: inferred with its data and without, the same answer means the data
  added nothing, and the answer without data (which holds for any data) serves every node of
  the kind. (An op that only validated its data, without using it for the output type, would
  have that check made on its kind's first node alone; onnxruntime makes it at load.)

Anything else — nested graphs, model functions, sparse weights, an op without an ONNX schema,
a type ONNX's per-node check refuses, or a graph whose nodes rarely repeat a kind — goes to the
whole-model run, which decides. opcheck.BY_KIND_NODES says which graphs are walked at all.
"""

from __future__ import annotations

import onnx
import onnx.checker
import onnx.defs
import onnx.shape_inference
from onnx import OperatorSetIdProto, TensorProto, TypeProto

from graphopt.codegen.om_manifest import elem_type_label
from graphopt.errors import InputError
from graphopt.ir import Model, Node, Value
from graphopt.ir.onnx_export import anonymous_node, type_proto
from graphopt.opcheck import ONNX_DOMAINS
from graphopt.passes.facts import constant_node_tensor
from graphopt.passes.infer_shapes import DATA_PROP_LIMIT as _DATA_LIMIT


# At 1024 nodes walked, and at each doubling, the walk gives up when ONNX was asked about more
# than one node in four: each ask costs about what four nodes cost the whole-model run.
_FIRST_CHECKPOINT = 1024
_MAX_ASKED_SHARE = 4


class _WholeModel(Exception):
    """This model needs the whole-model inference."""


def infer_by_kind(model: Model, label: str, kinds: list) -> dict[str, bytes] | None:
    """Value name -> serialized TypeProto of every value a node computes that ONNX types, or
    None when the model needs whole-model inference. `kinds[i]` is a hashable key of what ONNX
    reads of the main graph's i-th node besides its input types (op, attributes, which inputs
    are present; opcheck's schema key), or None to key the node by its protobuf. Raises
    InputError naming a node ONNX's inference refuses, or a graph output declared with another
    element type than its node computes."""
    graph = model.graph
    if graph._holders or model.functions or any(
            v.sparse_const is not None for v in graph.initializers.values()):
        return None
    try:
        return _Walk(model, label, kinds).run()
    except _WholeModel:
        return None


class _Walk:
    def __init__(self, model: Model, label: str, kinds: list) -> None:
        self.model, self.label, self.kinds = model, label, kinds
        self.opsets = {("" if d == "ai.onnx" else d): v for d, v in model.opset_imports.items()}
        self.opset_protos = [OperatorSetIdProto(domain=d, version=v)
                             for d, v in self.opsets.items()]
        self.ir_version = max(model.ir_version, 4)  # as the whole-model run sees it
        self.schemas: dict[tuple[str, str], onnx.defs.OpSchema] = {}
        self.types: dict[str, bytes] = {}       # value name -> serialized TypeProto
        self.data: dict[str, TensorProto] = {}  # value name -> its data, for small constants
        self.answers: dict[tuple, tuple] = {}   # (kind, input types[, data]) -> output types
        self.reads_data: dict[tuple, bool] = {}  # (kind, input types) -> its data matters
        self.declared: dict[tuple, bytes] = {}  # (dtype, shape) -> serialized TypeProto
        self.asked = 0  # calls into ONNX so far

    def run(self) -> dict[str, bytes]:
        graph = self.model.graph
        for value in graph.inputs:
            self._declare(value)
        for value in graph.initializers.values():
            self._declare(value)
            # Not an overridable one's: a caller may feed another value (see infer_shapes).
            if value.is_constant and value.const.nbytes <= _DATA_LIMIT:
                self.data[value.name] = value.const.to_proto(value.name)
        computed: dict[str, bytes] = {}
        if len(self.kinds) != len(graph):
            raise ValueError(f"{len(self.kinds)} kinds for {len(graph)} nodes")
        checkpoint = _FIRST_CHECKPOINT
        for done, (node, kind) in enumerate(zip(graph, self.kinds)):
            if done == checkpoint:
                if self.asked * _MAX_ASKED_SHARE > done:
                    raise _WholeModel  # few nodes repeat a kind: one whole-model run is cheaper
                checkpoint *= 2
            outputs = self._infer(node, kind)
            for value, raw in zip(node._outputs, outputs):
                if value is not None and raw is not None:
                    self.types[value.name] = computed[value.name] = raw
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                self._constant_data(node)
        self._check_outputs(computed)
        return computed

    def _declare(self, value: Value) -> None:
        if value.type_proto is not None:
            self.types[value.name] = value.type_proto.SerializeToString()
            return
        key = (value.dtype, value.shape)  # weights share a handful of types
        raw = self.declared.get(key)
        if raw is None:
            tp = type_proto(value)
            if tp is None:
                return
            raw = self.declared[key] = tp.SerializeToString()
        self.types[value.name] = raw

    def _infer(self, node: Node, kind) -> tuple:
        schema = self._schema(node)
        in_types = []
        data_inputs = []
        for value in node._inputs:
            if value is None:
                in_types.append(None)
                continue
            raw = self.types.get(value.name)
            if raw is None:
                raise _WholeModel  # an untyped input: ONNX's per-node call needs every type
            in_types.append(raw)
            if value.name in self.data:
                data_inputs.append(value.name)
        if kind is None:  # tensor, graph or type attributes: the node itself is the kind
            kind = anonymous_node(node).SerializeToString()
        key = (kind, tuple(in_types))
        if not data_inputs:
            answer = self.answers.get(key)
            if answer is None:
                answer = self.answers[key] = self._ask(schema, node, in_types, {})
            return answer
        reads = self.reads_data.get(key)
        if reads is False:
            return self.answers[key]
        data = {i: self.data[v.name] for i, v in enumerate(node._inputs)
                if v is not None and v.name in self.data}
        data_key = key + (tuple((i, t.SerializeToString()) for i, t in data.items()),)
        answer = self.answers.get(data_key)
        if answer is None:
            answer = self.answers[data_key] = self._ask(schema, node, in_types, data)
        if reads is None:
            without = self._ask(schema, node, in_types, {}, quiet=True)
            self.reads_data[key] = without != answer
            if without == answer:
                self.answers[key] = without
        return answer

    def _ask(self, schema, node: Node, in_types: list, data: dict[int, TensorProto],
             quiet: bool = False) -> tuple:
        """The output types ONNX infers for `node` (serialized, None where untyped)."""
        self.asked += 1
        proto = anonymous_node(node)
        types = {f"i{i}": TypeProto.FromString(raw) for i, raw in enumerate(in_types)
                 if raw is not None}
        try:
            inferred = onnx.shape_inference.infer_node_outputs(
                schema, proto, types, {f"i{i}": t for i, t in data.items()},
                opset_imports=self.opset_protos, ir_version=self.ir_version)
        except onnx.shape_inference.InferenceError as exc:
            if quiet:
                return ()  # the answer without data differs from any real answer
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InputError(f"{self.label}: node {node.label} ({node.qualified_op}): "
                             f"shape inference refuses it: {first}") from None
        except (onnx.checker.ValidationError, ValueError, RuntimeError):
            raise _WholeModel from None  # a type check the whole-model run does not make
        return tuple(inferred[f"o{i}"].SerializeToString() if f"o{i}" in inferred else None
                     for i in range(len(node._outputs)))

    def _schema(self, node: Node) -> onnx.defs.OpSchema:
        domain = "" if node.domain == "ai.onnx" else node.domain
        op = (domain, node.op_type)
        schema = self.schemas.get(op)
        if schema is None:
            if domain not in ONNX_DOMAINS or domain not in self.opsets:
                raise _WholeModel
            try:
                schema = onnx.defs.get_schema(node.op_type, self.opsets[domain], domain)
            except onnx.defs.SchemaError:
                raise _WholeModel from None
            if schema.deprecated:
                raise _WholeModel
            self.schemas[op] = schema
        return schema

    def _constant_data(self, node: Node) -> None:
        """A Constant's output as data for its readers, as the whole-model run passes it."""
        output = node._outputs[0] if node._outputs else None
        if output is None:
            return
        tensor = constant_node_tensor(node)
        if tensor is None:
            raise _WholeModel  # sparse data
        self.data[output.name] = tensor.to_proto(output.name)

    def _check_outputs(self, computed: dict[str, bytes]) -> None:
        """A graph output declared with one element type while its node computes another is
        refused, as the whole-model run refuses it."""
        for value in self.model.graph.outputs:
            raw = computed.get(value.name)
            if raw is None or value.dtype is None or value.type_proto is not None:
                continue
            inferred = TypeProto.FromString(raw)
            if inferred.WhichOneof("value") != "tensor_type":
                continue
            elem = inferred.tensor_type.elem_type
            if elem and elem != int(value.dtype):
                producer = value.producer
                raise InputError(
                    f"{self.label}: graph output '{value.name}' is declared "
                    f"{elem_type_label(int(value.dtype))}, but node {producer.label} "
                    f"({producer.qualified_op}) computes {elem_type_label(elem)}")
