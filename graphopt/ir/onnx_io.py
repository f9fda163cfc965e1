"""ONNX import: a path, bytes or ModelProto (external data included) into the IR."""

from __future__ import annotations

import collections
import functools
import math
import os
from typing import Iterator, Mapping

import onnx
from google.protobuf.message import DecodeError
from onnx import (AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, TypeProto,
                  ValueInfoProto, helper)

from graphopt.codegen.om_manifest import elem_type_label
from graphopt.dims import read_dim
from graphopt.errors import InputError, OptionError
from graphopt.input_files import refuse_device
from graphopt.ir.attributes import Attr
from graphopt.ir.collector import collect_if_due, collection_paused
from graphopt.ir.dtypes import DType, nbytes
from graphopt.ir.graph import CycleError, Graph
from graphopt.ir.model import Model
from graphopt.ir.node import Node
from graphopt.ir.shared_parse import parsed
from graphopt.ir.tensor import ExternalImport, Tensor, inline_tensors
from graphopt.ir.value import NO_METADATA, Value

Scope = Mapping[str, Value]


def read_model_proto(path: str | os.PathLike, load_external: bool = True) -> ModelProto:
    """Parse an ONNX file and its external data, turning every failure into a one-line error.
    `load_external=False` leaves external tensors as references (load_onnx maps them lazily)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected an .onnx file")
    refuse_device(path)
    try:
        with open(path, "rb") as f:
            # The magic first: an .om of several GB is refused without being read whole.
            if f.read(len(ZIP_MAGIC)) == ZIP_MAGIC:  # protobuf would fail with a baffling reason
                raise InputError(f"{path}: a zip archive (a graphopt .om?), not an ONNX model; "
                                 "give the .onnx it was compiled from")
            f.seek(0)
            data = f.read()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from None
    proto = ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise InputError(f"{path}: not a valid ONNX model (protobuf parse failed: {e})") from None
    check_looks_like_model(proto, path)
    if not load_external:
        return proto
    try:
        onnx.load_external_data_for_model(proto, os.path.dirname(os.path.abspath(path)))
    except (OSError, ValueError, onnx.checker.ValidationError) as e:
        raise InputError(f"{path}: cannot load external data: {e}") from None
    return proto

ZIP_MAGIC = b"PK\x03\x04"  # what a zip file, such as an .om, starts with


def graph_protos(graph: GraphProto) -> Iterator[GraphProto]:
    """`graph` and every graph nested in its nodes' attributes, outer before inner."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                yield from graph_protos(attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from graph_protos(sub)


def proto_nodes(nodes) -> Iterator[NodeProto]:
    """`nodes` (a graph's or a function body's) and the nodes of every graph nested in their
    attributes, at any depth."""
    for node in nodes:
        yield node
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                yield from proto_nodes(attr.g.node)
            elif attr.type == AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from proto_nodes(sub.node)


def _same_weight(value: Value, tensor: Tensor) -> bool:
    """Whether `value` is a weight holding exactly `tensor`'s data (a subgraph initializer
    repeating it may shadow it: readers get the same numbers either way)."""
    if value.const is None or value.is_input:
        return False
    return value.const.to_proto().SerializeToString() == tensor.to_proto().SerializeToString() \
        or (value.const.dtype == tensor.dtype and value.const.shape == tensor.shape
            and value.const.numpy().tobytes() == tensor.numpy().tobytes())


def _copy(message):
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


def check_looks_like_model(proto: ModelProto, path: str,
                           what: str = "not a valid ONNX model") -> None:
    """InputError naming what a model lacks. Random or truncated bytes sometimes parse
    "successfully" into an empty-ish message: lacking all three, the file is that."""
    missing = [field for field, present in (("ir_version", proto.ir_version > 0),
                                            ("graph", proto.HasField("graph")),
                                            ("opset_import", bool(proto.opset_import)))
               if not present]
    if len(missing) == 3:
        raise InputError(f"{path}: {what} (no ir_version, graph or opset_import; the file may "
                         "be truncated or not ONNX)")
    if missing:
        raise InputError(f"{path}: {what}: it has no {' and no '.join(missing)}"
                         + (" (an exporter writes the opset its nodes follow there)"
                            if "opset_import" in missing else ""))


def load_onnx(source: str | os.PathLike | ModelProto | bytes, *, user_model: bool = True) -> Model:
    """Import an ONNX model from a path, serialized bytes or a ModelProto into graphopt's IR.

    A model given in memory whose tensors keep their data in external files is refused
    (InputError naming the tensor): it names no folder to find them in, and the working
    directory's files would be read instead. `user_model=False` is for protos graphopt made
    itself (a partition it cut, one read from an .om), whose references it resolves."""
    label = "<model>"
    if isinstance(source, (bytearray, memoryview)):
        source = bytes(source)
    if not isinstance(source, (str, os.PathLike, ModelProto, bytes)):
        raise OptionError(f"load_onnx takes a path, an onnx.ModelProto or serialized bytes, not "
                          f"{type(source).__name__}")
    if isinstance(source, ModelProto):
        proto = source
    elif isinstance(source, bytes):
        proto = ModelProto()
        try:
            proto.ParseFromString(source)
        except (DecodeError, RuntimeError, ValueError) as e:
            raise InputError(f"{label}: not a valid ONNX model ({e})") from None
        check_looks_like_model(proto, label)
    else:
        label = os.fspath(source)
        # External data stays on disk: the IR maps each tensor when (and if) it is read.
        proto = parsed(label, lambda path: read_model_proto(path, load_external=False))
    base_dir = os.path.dirname(os.path.abspath(label)) if label != "<model>" else None
    # Bytes and a caller's ModelProto come from no folder, so an external reference could only
    # resolve against the working directory: refuse it rather than read whatever file happens
    # to be there. (graphopt's own partition protos reference its weight files by design.)
    in_memory = isinstance(source, bytes) or (user_model and isinstance(source, ModelProto))
    collect_if_due()
    with collection_paused():
        return _Importer(label, external_ok=not in_memory, base_dir=base_dir).model(proto)


def checked_external(proto: TensorProto, model_path: str, where: str) -> Tensor:
    """The tensor `proto` of the model file `model_path` keeps in an external file, mapped when
    read, once its location passes the checks graphopt's import makes (InputError naming
    `where` otherwise): relative, inside the model's folder, within the file's size."""
    importer = _Importer(model_path, base_dir=os.path.dirname(os.path.abspath(model_path)))
    importer._check_external(proto, where)
    try:
        return Tensor.from_external(proto, importer.base_dir, load=importer.load)
    except ValueError as e:
        raise importer.error(f"{where}: {e}") from None


def node_tensors(nodes) -> Iterator[TensorProto]:
    """Every tensor the nodes' attributes hold, and every initializer and attribute tensor of
    the graphs they nest, as protos (edited in place by a caller that rewrites them)."""
    pending = [list(nodes)]
    while pending:
        for node in pending.pop():
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    yield attribute.t
                yield from attribute.tensors
                for graph in ([attribute.g] if attribute.HasField("g") else []) \
                        + list(attribute.graphs):
                    yield from graph.initializer
                    pending.append(list(graph.node))


def check_no_external_references(proto: ModelProto) -> None:
    """InputError when a caller's in-memory model keeps data in an external file: the proto
    names no folder to find it in (load_onnx refuses it the same way)."""
    for tensor in (*proto.graph.initializer, *node_tensors(proto.graph.node)):
        if tensor.data_location == TensorProto.EXTERNAL:
            _Importer("<model>", external_ok=False)._check_external(
                tensor, f"tensor {tensor.name!r}")


class _Importer:
    """Builds the IR, refusing at the door what no pass should meet: malformed tensors, unknown
    element types, names defined twice, graphs without outputs."""

    def __init__(self, label: str, external_ok: bool = True, base_dir: str | None = None):
        self.label = label
        self.external_ok = external_ok
        self.base_dir = base_dir  # the model file's folder, where its external data lives
        self._roots: set[str] | None = None  # the real folders external data may lie in
        self.load = ExternalImport(label)  # what this import's external tensors share

    def error(self, message: str) -> InputError:
        return InputError(f"{self.label}: {message}")

    def check_sparse(self, sparse, name: str) -> None:
        """Refuse a sparse initializer whose indices do not fit its values or its dims:
        onnxruntime 1.23 aborts the whole process on one (std::terminate or a segfault, no
        exception) when a session or the .om's loader opens it; 1.24.2 and later refuse it."""
        if math.prod(sparse.dims) == 0:
            # ONNX's checker refuses any dim 0, which onnxruntime takes for an empty tensor.
            if math.prod(sparse.values.dims) or math.prod(sparse.indices.dims):
                raise self.error(f"sparse initializer '{name}' has values but its dims "
                                 f"{list(sparse.dims)} hold no element")
            return
        if TensorProto.EXTERNAL in (sparse.values.data_location, sparse.indices.data_location):
            return  # the checker would look for the file relative to the working directory
        try:
            onnx.checker.check_sparse_tensor(sparse)
        except onnx.checker.ValidationError as e:
            reason = str(e).strip().splitlines()[0]
            raise self.error(f"sparse initializer '{name}' is malformed: {reason}") from None

    def model(self, proto: ModelProto) -> Model:
        self.check_text(proto, "the model")
        for entry in proto.opset_import:
            self.check_text(entry, "an opset_import")
        if proto.ir_version < 0 or proto.ir_version > onnx.IR_VERSION:
            raise self.error(f"IR version {proto.ir_version} is not one this onnx "
                             f"{onnx.__version__} reads (1 to {onnx.IR_VERSION})")
        for entry in proto.opset_import:
            # The checker and onnxruntime take int32; no default-domain opset 0 was ever.
            if not 0 <= entry.version < 2 ** 31 or (entry.version == 0
                                                    and entry.domain in ("", "ai.onnx")):
                raise self.error(f"opset_import of domain '{entry.domain or 'ai.onnx'}' has "
                                 f"version {entry.version}")
            newest = onnx.defs.onnx_opset_version()
            if entry.domain in ("", "ai.onnx") and entry.version > newest:
                # No schema to check its nodes against; onnxruntime refuses it at load.
                raise self.error(f"opset {entry.version} of the default domain is newer than "
                                 f"any this onnx {onnx.__version__} knows (up to {newest})")
        versions = {entry.domain: entry.version for entry in proto.opset_import
                    if entry.domain in ("", "ai.onnx")}
        if len(set(versions.values())) > 1:
            raise self.error(f"opset_import names the default domain twice, as '' (version "
                             f"{versions['']}) and 'ai.onnx' (version {versions['ai.onnx']}): "
                             "onnxruntime reads the nodes at one and the other; give it once")
        weights = {t.name: t for t in proto.graph.initializer}
        for vi in proto.graph.input:  # a subgraph's may leave theirs to the outer graph
            if vi.name not in weights and vi.type.WhichOneof("value") is None:
                raise self.error(f"graph input '{vi.name}' has no type: a caller cannot know "
                                 "what to feed (onnxruntime refuses the model)")
            if vi.name in weights:
                self._check_default(vi, weights[vi.name])
        graph = self.graph(proto.graph, {})
        if not graph.outputs:
            raise self.error(f"graph '{proto.graph.name}' has no outputs (nothing to compute)")
        if proto.ir_version < 4:
            for value in graph.inputs:
                value.overridable = value.const is None
        for g in graph.all_graphs():
            g._used_names = None
        # Every name the model was read with stays taken: a value a pass removes early must not
        # lend its name to a new one with other contents, which compare would pair with it.
        graph.reserve_names()
        for function in proto.functions:
            self.check_function_body(function)
        return Model(
            graph=graph,
            ir_version=proto.ir_version,
            opset_imports={op.domain: op.version for op in proto.opset_import},
            producer_name=proto.producer_name,
            producer_version=proto.producer_version,
            domain=proto.domain,
            model_version=proto.model_version,
            doc_string=proto.doc_string,
            metadata_props={p.key: p.value for p in proto.metadata_props},
            # Copies: passes edit a function (opset_raise), never the caller's proto.
            functions=[self.function(function) for function in proto.functions],
            training_info=list(proto.training_info),
            configuration=list(getattr(proto, "configuration", [])),
        )

    def function(self, proto):
        """A copy of the model-local function, the data of any tensor it keeps in an external
        file read into it (a Constant that onnx.save(..., convert_attribute=True) moved out):
        the function is written as a proto wherever the model goes, and onnxruntime, given a
        model as bytes, finds no file (--verify had failed on such a model)."""
        function = _copy(proto)
        where = f"function {function.domain or 'ai.onnx'}::{function.name}"
        for tensor in list(node_tensors(function.node)):
            if tensor.data_location == TensorProto.EXTERNAL:
                with inline_tensors():
                    read = self.tensor(_copy(tensor), f"{where}: tensor '{tensor.name}'")
                    tensor.CopyFrom(read.to_proto(tensor.name or None))
        return function

    def check_function_body(self, function) -> None:
        """Refuse a model-local function whose node reads a name neither its inputs nor an
        earlier node of its body define, as the main graph and If/Loop bodies are refused:
        such a model compiled with onnxruntime's load warning, and its .om did not run."""
        defined = set(function.input)
        for index, node in enumerate(function.node):
            for name in node.input:
                if name and name not in defined:
                    label = node.name or f"#{index}"
                    raise self.error(f"function {function.domain or 'ai.onnx'}::{function.name}"
                                     f": node {label} ({node.op_type}) reads undefined value "
                                     f"'{name}'")
            defined.update(name for name in node.output if name)

    def _check_default(self, vi: ValueInfoProto, tensor) -> None:
        """An input whose initializer is its default value must be of the declared type and
        shape (onnxruntime refuses the model otherwise: "Shape of initializer x does not
        match")."""
        if vi.type.WhichOneof("value") != "tensor_type":
            return
        declared = vi.type.tensor_type
        dims = list(tensor.dims)
        if declared.elem_type and declared.elem_type != tensor.data_type:
            problem = (f"element type {elem_type_label(declared.elem_type)}, its initializer "
                       f"{elem_type_label(tensor.data_type)}")
        elif declared.HasField("shape") and (
                len(declared.shape.dim) != len(dims) or any(
                    d.HasField("dim_value") and d.dim_value != n
                    for d, n in zip(declared.shape.dim, dims))):
            shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                     for d in declared.shape.dim]
            problem = f"shape {shape}, its initializer {dims}"
        else:
            return
        raise self.error(f"graph input '{vi.name}' is declared with {problem}: the "
                         "initializer of an input's name is its default value, and must match "
                         "it (onnxruntime refuses the model)")

    def graph(self, proto: GraphProto, outer: Scope) -> Graph:
        self.check_text(proto, "a graph")
        graph = Graph(proto.name)
        graph.doc_string = proto.doc_string
        graph.metadata_props = dict(_props(proto))
        local: dict[str, Value] = {}
        scope = collections.ChainMap(local, outer)  # type: ignore[arg-type]

        initializers = {}
        for tensor in proto.initializer:
            if tensor.name in initializers:
                # onnxruntime keeps one of them; harmless only if both say the same.
                if initializers[tensor.name].to_proto().SerializeToString() != \
                        tensor.SerializeToString():
                    raise self.error(f"initializer '{tensor.name}' is defined twice, with "
                                     "different data")
                continue
            initializers[tensor.name] = self.tensor(tensor, f"initializer '{tensor.name}'")
        for vi in proto.input:
            if vi.name in local:
                raise self.error(f"graph '{proto.name}' input '{vi.name}' is listed twice")
            value = Value(vi.name)
            self.value_info(value, vi)
            if vi.name in initializers:
                value.const = initializers.pop(vi.name)
            local[vi.name] = graph.add_input(value)
        for name, tensor in initializers.items():
            shadowed = outer.get(name)
            if shadowed is not None and not _same_weight(shadowed, tensor):
                # onnxruntime reads a graph input's, the reference evaluator the weight.
                raise self.error(f"initializer '{name}' of subgraph '{proto.name}' has the "
                                 "name of a value of an enclosing graph: which of the two its "
                                 "readers see is not defined (onnxruntime and ONNX's reference "
                                 "evaluator disagree)")
            value = Value(name, const=tensor)
            local[name] = graph.add_initializer(value)
        for sparse in proto.sparse_initializer:
            name = sparse.values.name
            if name in local:
                raise self.error(f"sparse initializer '{name}' is defined twice")
            dtype = self.dtype(sparse.values.data_type, f"sparse initializer '{name}'")
            if any(d < 0 for d in sparse.dims):
                raise self.error(f"sparse initializer '{name}' has a negative dim {list(sparse.dims)}")
            self.check_sparse(sparse, name)
            value = Value(name, dtype, tuple(sparse.dims))
            value.sparse_const = sparse
            local[name] = graph.add_initializer(value)

        created: list[tuple[Node, NodeProto, list[str]]] = []
        node_names: set[str] = set()
        given_names: set[str] | None = None  # every node's name in the file, once one repeats
        suffixes: dict[str, int] = {}
        for node_proto in proto.node:
            # Each string field is read once; one that is not text (bytes: invalid UTF-8) or
            # metadata to look into sends the node to check_text, which says which field.
            op_type, name, domain = node_proto.op_type, node_proto.name, node_proto.domain
            doc_string, overload = node_proto.doc_string, getattr(node_proto, "overload", "")
            out_names, in_names = list(node_proto.output), list(node_proto.input)
            for text in (op_type, name, domain, doc_string, overload, *out_names, *in_names):
                if type(text) is not str:
                    self.check_text(node_proto, f"a {op_type!r} node")
            metadata = _props(node_proto)
            if metadata:
                self.check_text(node_proto, f"a {op_type!r} node")
            if name:
                if name in node_names:
                    # Names only label nodes (onnx.checker allows the same twice; onnxruntime
                    # refuses it but for Constants, which it folds first, as silero-vad's
                    # fifteen 'F0::anon' are): a later holder gets a name of its own.
                    if given_names is None:
                        given_names = {n.name for n in proto.node}
                    name = _unused_name(name, node_names, given_names, suffixes)
                node_names.add(name)
            outputs = []
            for out_name in out_names:
                if not out_name:
                    outputs.append(None)
                    continue
                if out_name in local:
                    who = f"node '{name}'" if name else "an unnamed node"
                    raise self.error(f"value '{out_name}' is defined twice (again by {who} "
                                     f"({op_type}))")
                if out_name in outer:  # SSA spans scopes: onnxruntime refuses the shadowing
                    who = f"node '{name}'" if name else "an unnamed node"
                    raise self.error(f"value '{out_name}' is defined twice: {who} "
                                     f"({op_type}) of subgraph '{proto.name}' redefines a value "
                                     "of an enclosing graph")
                value = local[out_name] = Value(out_name)
                outputs.append(value)
            node = Node(op_type, domain=domain, name=name, outputs=outputs)
            node.doc_string = doc_string
            node.metadata_props = metadata
            node.overload = overload
            graph.append(node)
            created.append((node, node_proto, in_names))

        for node, node_proto, in_names in created:
            for attr_proto in node_proto.attribute:
                if attr_proto.name in node.attrs:  # onnx.checker and onnxruntime refuse it
                    raise self.error(f"{_where(node)}: attribute '{attr_proto.name}' is given "
                                     "twice")
                node.attrs[attr_proto.name] = self.attribute(attr_proto, scope, node)
            if node.attrs:
                graph.note_subgraphs(node)  # linked before its attributes were read
            inputs = []
            for in_name in in_names:
                if not in_name:
                    inputs.append(None)
                    continue
                # The local dict first: ChainMap.get costs several dict lookups.
                value = local.get(in_name) or scope.get(in_name)
                if value is None:
                    raise self.error(f"node {node.label} ({node.op_type}) reads undefined "
                                     f"value '{in_name}'")
                inputs.append(value)
            node.set_inputs(inputs)

        for vi in proto.value_info:
            value = local.get(vi.name)
            if value is not None and value.producer is not None:
                self.value_info(value, vi)
        for vi in proto.output:
            value = scope.get(vi.name)
            if value is None:
                raise self.error(f"graph '{proto.name}' output '{vi.name}' is never produced")
            if value.producer is not None or value.dtype is None:
                # An output that is an input or a weight keeps the type declared there.
                self.value_info(value, vi)
            elif not value.is_input and not value.doc_string and not value.metadata_props:
                # A weight has no declaration of its own to hold the output's doc and metadata.
                self.check_text(vi, f"value {vi.name!r}")
                value.doc_string, value.metadata_props = vi.doc_string, _props(vi)
            graph.outputs.append(value)
        try:
            graph.sort()
        except CycleError as e:
            raise self.error(str(e)) from None
        return graph

    def attribute(self, proto: AttributeProto, scope: Scope, owner: Node) -> Attr:
        name, ref_attr_name, doc_string = proto.name, proto.ref_attr_name, proto.doc_string
        if type(name) is not str or type(ref_attr_name) is not str or \
                type(doc_string) is not str:
            self.check_text(proto, _where(owner))
        kind = proto.type
        A = AttributeProto
        held = [f.name for f, _ in proto.ListFields() if f.name in _VALUE_FIELDS]
        if kind in _VALUE_FIELDS.values() and held != [_FIELD_OF[kind]] and not (
                held == [] and (ref_attr_name or kind in _SCALAR_DEFAULTABLE)):
            # onnx.checker's "type field and data field mismatch": reading the field the type
            # names would silently take its default (LeakyRelu alpha 0 from an alpha in `i`).
            holds = ", ".join(f"{_FIELD_WORDS[f]} (field {f})" for f in held) or "no value"
            raise self.error(f"{_where(owner)}: attribute '{name}' is declared "
                             f"{A.AttributeType.Name(kind)} but holds {holds} (onnx.checker "
                             "and onnxruntime refuse it: type field and data field mismatch)")
        if kind == A.INT:
            value = proto.i
        elif kind == A.FLOAT:
            value = proto.f
        elif kind == A.STRING:
            value = _decode(proto.s)
        elif kind == A.TENSOR:
            value = self.tensor(proto.t, f"{_where(owner)} attribute '{name}'")
        elif kind == A.GRAPH:
            value = self._subgraph(proto.g, scope, owner)
        elif kind == A.SPARSE_TENSOR:
            value = proto.sparse_tensor
        elif kind == A.TYPE_PROTO:
            value = proto.tp
        elif kind == A.INTS:
            value = list(proto.ints)
        elif kind == A.FLOATS:
            value = list(proto.floats)
        elif kind == A.STRINGS:
            value = [_decode(s) for s in proto.strings]
        elif kind == A.TENSORS:
            value = [self.tensor(t, f"{_where(owner)} attribute '{name}'") for t in proto.tensors]
        elif kind == A.GRAPHS:
            value = [self._subgraph(g, scope, owner) for g in proto.graphs]
        elif kind == A.SPARSE_TENSORS:
            value = list(proto.sparse_tensors)
        elif kind == A.TYPE_PROTOS:
            value = list(proto.type_protos)
        elif kind == A.UNDEFINED and ref_attr_name:
            value = None
        else:
            raise self.error(f"{_where(owner)}: attribute '{name}' has unsupported type {kind}")
        return Attr(name, kind, value, ref_attr_name=ref_attr_name, doc_string=doc_string)

    def check_text(self, proto, where: str) -> None:
        """Refuse invalid UTF-8 in `proto`'s string fields (its metadata too), which protobuf
        hands back as bytes: every name and op type must be text for the passes and for export."""
        singular, repeated = _string_fields(proto.DESCRIPTOR)
        for name in singular:
            item = getattr(proto, name)
            if type(item) is not str:
                self._not_text(where, name, item)
        for name in repeated:
            for item in getattr(proto, name):
                if type(item) is not str:
                    self._not_text(where, name, item)
        for entry in getattr(proto, "metadata_props", ()):
            self.check_text(entry, where)

    def _not_text(self, where: str, name: str, item) -> None:
        if isinstance(item, bytes):
            raise self.error(f"{where}: field '{name}' is not valid UTF-8 ({item[:40]!r})")

    def dtype(self, elem_type: int, where: str) -> DType:
        try:
            return DType(elem_type)
        except ValueError:
            raise self.error(f"{where} has unknown element type {elem_type}") from None

    def value_info(self, value: Value, vi: ValueInfoProto) -> None:
        self.check_text(vi, f"value {vi.name!r}")
        if vi.type.WhichOneof("value") == "tensor_type":
            self.dtype(vi.type.tensor_type.elem_type, f"value '{vi.name}'")
        _apply_value_info(value, vi)

    def tensor(self, proto: TensorProto, where: str) -> Tensor:
        """The tensor, once its dtype, dims and data agree: passes and onnxruntime trust them
        (a few bytes of data under dims of 2**40 would otherwise be "folded" into terabytes)."""
        self.check_text(proto, where)
        for entry in proto.external_data:
            self.check_text(entry, where)
        dtype = self.dtype(proto.data_type, where)
        if dtype == DType.UNDEFINED:
            raise self.error(f"{where} has no element type")
        if any(d < 0 for d in proto.dims):
            raise self.error(f"{where} has a negative dim {list(proto.dims)}")
        if proto.HasField("segment"):  # onnx's numpy_helper failed on it deep inside a pass
            raise self.error(f"{where} is a segment of a larger tensor, which graphopt does "
                             "not read (nor does onnx's numpy_helper); give the whole tensor")
        count = 1
        for d in proto.dims:
            count *= d
        if proto.data_location == TensorProto.EXTERNAL:
            from graphopt.lent_weights import lent_tensor

            lent = lent_tensor(proto)  # a weight a lean model lends: the tensor itself
            if lent is not None:
                return lent
            self._check_external(proto, where)
            if self.base_dir is None:
                return Tensor.from_proto(proto)
            try:
                return Tensor.from_external(proto, self.base_dir, load=self.load)
            except ValueError as e:
                raise self.error(f"{where}: {e}") from None
        field = helper.tensor_dtype_to_field(int(dtype))
        if proto.HasField("raw_data"):
            if dtype == DType.STRING:
                raise self.error(f"{where}: a string tensor cannot have raw_data")
            # More than 2 GiB is no file's, but an in-memory model's: onnx.load reads a
            # model's external data into raw_data, whatever its size.
            expected, unit = nbytes(dtype, count), "bytes"
            # Reading raw_data copies it (BERT-base: +130 ms on a 2 s compile), but a wrong
            # length found later surfaces far from its cause (a "tampered" .om, a failed pass).
            got = len(proto.raw_data)
        else:
            got = len(getattr(proto, field))
            unit = field
            # Packed, one entry per byte, but for float6: one element per entry (onnx.proto).
            if dtype.bits and dtype.bits < 8 and dtype.bits != 6:
                expected = nbytes(dtype, count)
            elif dtype in (DType.COMPLEX64, DType.COMPLEX128):
                expected = 2 * count
            else:
                expected = count
        if got != expected:
            held = f"{expected} bytes of data, has {got}" if unit == "bytes" else \
                f"{expected} entries in its {unit} field, has {got}"
            raise self.error(f"{where}: {elem_type_label(int(dtype))} tensor of shape "
                             f"{list(proto.dims)} needs {held}")
        return Tensor.from_proto(proto)

    def _check_external(self, proto: TensorProto, where: str) -> None:
        entries = {e.key: e.value for e in proto.external_data}
        location = entries.get("location", "")
        if not self.external_ok:
            raise self.error(f"{where} keeps its data in an external file ({location!r}), which a "
                             "model given in memory (bytes or a ModelProto) cannot locate; pass "
                             "the .onnx path instead, or load the model with its external data "
                             "(onnx.load(path))")
        parts = location.replace("\\", "/").split("/")
        if not location or os.path.isabs(location) or ".." in parts:
            raise self.error(f"{where}: external data location {location!r} must be a relative "
                             "path inside the model's folder")
        for key in ("offset", "length"):
            if key in entries and not (entries[key].isdigit()):
                raise self.error(f"{where}: external data {key} {entries[key]!r} is not a "
                                 "non-negative integer")
        if "\x00" in location:  # os.path.realpath raised a bare ValueError on it
            raise self.error(f"{where}: external data location {location!r} holds a NUL "
                             "character, which no file name can")
        if self.base_dir is not None and not self._inside_model_folder(location):
            raise self.error(f"{where}: external data location {location!r} leads out of the "
                             "model's folder through a symbolic link (onnxruntime refuses it "
                             "too)")

    def _inside_model_folder(self, location: str) -> bool:
        """Whether the file `location` names, its links followed, lies in the model's folder,
        or beside the file the model's own path links to (as onnxruntime allows: a Hugging Face
        cache links the model and its data into one folder of blobs)."""
        if self._roots is None:
            self._roots = {os.path.realpath(self.base_dir),
                           os.path.dirname(os.path.realpath(self.label))}
        target = os.path.realpath(os.path.join(self.base_dir, location))
        return any(os.path.commonpath([root, target]) == root for root in self._roots)

    def _subgraph(self, proto: GraphProto, scope: Scope, owner: Node) -> Graph:
        sub = self.graph(proto, scope)
        sub.parent = owner
        return sub


@functools.lru_cache(maxsize=None)
def _string_fields(descriptor) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A message type's string fields: (singular, repeated)."""
    fields = [(f.name, is_repeated_field(f)) for f in descriptor.fields if f.type == f.TYPE_STRING]
    return (tuple(name for name, repeated in fields if not repeated),
            tuple(name for name, repeated in fields if repeated))


def is_repeated_field(field) -> bool:
    # protobuf 7 dropped FieldDescriptor.label for is_repeated, which older releases lack.
    if hasattr(field, "is_repeated"):
        return field.is_repeated
    return field.label == field.LABEL_REPEATED


def _unused_name(name: str, taken: set[str], given: set[str], suffixes: dict[str, int]) -> str:
    """`name`_1, `name`_2, …: the first that no node has in the file (`given`) nor was given
    since (`taken`); `suffixes` remembers where the search for `name` stopped."""
    suffix = suffixes.get(name, 1)
    while f"{name}_{suffix}" in taken or f"{name}_{suffix}" in given:
        suffix += 1
    suffixes[name] = suffix + 1
    return f"{name}_{suffix}"


_FIELD_OF = {
    AttributeProto.INT: "i", AttributeProto.FLOAT: "f", AttributeProto.STRING: "s",
    AttributeProto.TENSOR: "t", AttributeProto.GRAPH: "g",
    AttributeProto.SPARSE_TENSOR: "sparse_tensor", AttributeProto.TYPE_PROTO: "tp",
    AttributeProto.INTS: "ints", AttributeProto.FLOATS: "floats",
    AttributeProto.STRINGS: "strings", AttributeProto.TENSORS: "tensors",
    AttributeProto.GRAPHS: "graphs", AttributeProto.SPARSE_TENSORS: "sparse_tensors",
    AttributeProto.TYPE_PROTOS: "type_protos"}
_VALUE_FIELDS = {field: kind for kind, field in _FIELD_OF.items()}
_FIELD_WORDS = {"i": "an integer", "f": "a float", "s": "a string", "t": "a tensor",
                "g": "a graph", "sparse_tensor": "a sparse tensor", "tp": "a type",
                "ints": "integers", "floats": "floats", "strings": "strings",
                "tensors": "tensors", "graphs": "graphs", "sparse_tensors": "sparse tensors",
                "type_protos": "types"}
# A proto3-style scalar at its default value (i=0, f=0.0, s="", an empty list) is not written:
# such an attribute holds no field, and onnx.checker lets it through.
_SCALAR_DEFAULTABLE = {AttributeProto.INT, AttributeProto.FLOAT, AttributeProto.STRING,
                        AttributeProto.INTS, AttributeProto.FLOATS, AttributeProto.STRINGS,
                        AttributeProto.TENSORS, AttributeProto.GRAPHS,
                        AttributeProto.SPARSE_TENSORS, AttributeProto.TYPE_PROTOS}


def _where(node: Node) -> str:
    return f"node {node.label} ({node.op_type})"


def _decode(data: bytes) -> str | bytes:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def _props(proto) -> Mapping[str, str]:
    props = getattr(proto, "metadata_props", None)
    return {p.key: p.value for p in props} if props else NO_METADATA


def _apply_value_info(value: Value, vi: ValueInfoProto) -> None:
    value.doc_string = vi.doc_string
    value.metadata_props = _props(vi)
    if vi.HasField("type"):
        apply_type(value, vi.type)


def apply_type(value: Value, tp: TypeProto) -> None:
    """Set dtype/shape (tensors) or keep the TypeProto (sequences, maps, optionals, sparse)."""
    if tp.WhichOneof("value") is not None:
        value.dtype, value.shape, value.type_proto = read_type(tp)


def read_type(tp: TypeProto) -> tuple[DType | None, tuple | None, TypeProto | None]:
    """(dtype, shape, type_proto) as `apply_type` sets them: a tensor's element type and
    shape, or a copy of any other type; all None when `tp` holds no type."""
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        tensor_type = tp.tensor_type
        elem = tensor_type.elem_type
        dtype = (_DTYPES.get(elem) or DType(elem)) if elem else None
        if tensor_type.HasField("shape"):
            # A positive dim_value is set (unset reads 0): one field read for most dims.
            return dtype, tuple([v if (v := d.dim_value) > 0 else read_dim(d)
                                 for d in tensor_type.shape.dim]), None
        return dtype, None, None
    if which is None:
        return None, None, None
    copy = TypeProto()
    copy.CopyFrom(tp)
    return None, None, copy


# DType(n) goes through the enum machinery; shape inference reads one per value.
_DTYPES = {int(d): d for d in DType}
