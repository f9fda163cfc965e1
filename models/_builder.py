"""GraphBuilder: emits ONNX graphs named the way torch.onnx's TorchScript exporter names them."""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections import Counter
from collections.abc import Iterator, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # the IR that shipped with opset 17; newer IRs would lock out older runtimes
PRODUCER = "graphopt.zoo"
# Bump whenever any builder's output bytes change, so caches keyed on producer_version invalidate.
ZOO_VERSION = "1"
# Never written to disk: a shapes-only initializer points here so nothing can mistake it for data.
SHAPES_ONLY_LOCATION = "graphopt.zoo.shapes-only.bin"

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64
FLOAT32_MIN = float(np.finfo(np.float32).min)  # torch.finfo(torch.float32).min, what HF masks with

_materialize: contextvars.ContextVar[bool] = contextvars.ContextVar("graphopt_zoo_materialize",
                                                                   default=True)


@contextlib.contextmanager
def shapes_only() -> Iterator[None]:
    """Within this block builders emit initializers with dims but no data (external-data stubs),
    so full-size graphs can be inspected without allocating hundreds of MB of weights."""
    token = _materialize.set(False)
    try:
        yield
    finally:
        _materialize.reset(token)


class GraphBuilder:
    """Accumulates nodes and initializers under a module scope stack, exporter style.

    Node names are "/<scope>/<OpType>[_k]" and their outputs "<node name>_output_<i>", exactly as
    torch.onnx writes them, so fusion passes meet the same names users' models carry.
    """

    def __init__(self, seed: int, opset: int = OPSET, runtime_zero_bias: bool = False) -> None:
        self.rng = np.random.default_rng(seed)
        self.opset = opset
        self.materialize = _materialize.get()
        # Weights go straight into the final proto: make_graph/make_model would copy them twice.
        self.proto = onnx.ModelProto()
        self.graph = self.proto.graph
        self._scope: list[str] = []
        self._uses: Counter[str] = Counter()
        self._init_names: set[str] = set()
        # The exporter numbers folded weights by TorchScript value id; any increasing count will do.
        self._anon_id = 1000
        # The dynamo exporter without its optimizer computes a bias-free Conv's zero bias at run
        # time (Shape of the weight, CastLike, Expand): conv() writes that form when set.
        self.runtime_zero_bias = runtime_zero_bias
        # tf2onnx's form of a TensorFlow conv net: activations NHWC, each Conv between a
        # Transpose pair, BatchNorm as per-channel Sub/Mul/Add; conv() and bn() write it when set.
        self.nhwc = False

    @contextlib.contextmanager
    def scope(self, *parts: str) -> Iterator[None]:
        """Enter a module scope, e.g. scope("layer1", "layer1.0", "conv1")."""
        self._scope.extend(parts)
        try:
            yield
        finally:
            del self._scope[len(self._scope) - len(parts):]

    # -- nodes -------------------------------------------------------------------------------

    def op(self, op_type: str, *inputs: str, outputs: int = 1, out: str | None = None, **attrs):
        """Append a node; returns its output name (or list of names when outputs > 1).

        `out` renames the first output, which is how the exporter names graph outputs.
        """
        base = "/" + "".join(p + "/" for p in self._scope) + op_type
        k = self._uses[base]
        self._uses[base] += 1
        name = base if k == 0 else f"{base}_{k}"
        outs = [f"{name}_output_{i}" for i in range(outputs)]
        if out is not None:
            outs[0] = out
        self.graph.node.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs[0] if outputs == 1 else outs

    def const(self, value, dtype=None) -> str:
        """A Constant node, as the exporter writes for scalars and shape vectors it cannot fold."""
        arr = np.asarray(value)
        if dtype is None:
            dtype = {"f": np.float32, "i": np.int64, "u": np.int64, "b": np.bool_}[arr.dtype.kind]
        return self.op("Constant", value=numpy_helper.from_array(arr.astype(dtype)))

    # -- initializers ------------------------------------------------------------------------

    def anon(self, op_type: str) -> str:
        """A name like "onnx::MatMul_1003", which the exporter gives weights it transposed."""
        self._anon_id += 1
        return f"onnx::{op_type}_{self._anon_id}"

    def _add(self, name: str, shape: Sequence[int], dtype: int, make, doc: str | None) -> str:
        if name in self._init_names:
            raise ValueError(f"duplicate initializer {name!r}")
        self._init_names.add(name)
        tensor = self.graph.initializer.add(name=name, data_type=dtype, dims=list(shape))
        if self.materialize:
            arr = make()
            tensor.raw_data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        else:
            tensor.data_location = TensorProto.EXTERNAL
            tensor.external_data.add(key="location", value=SHAPES_ONLY_LOCATION)
        if doc:
            tensor.doc_string = doc
        return name

    def param(self, name: str, shape: Sequence[int], *, std: float = 0.02, mean: float = 0.0,
              doc: str | None = None) -> str:
        """A float32 weight drawn from N(mean, std²)."""
        def make():
            w = self.rng.standard_normal(tuple(shape), dtype=np.float32)
            w *= np.float32(std)
            w += np.float32(mean)
            return w
        return self._add(name, shape, FLOAT, make, doc)

    def he(self, name: str, shape: Sequence[int]) -> str:
        """He-normal weight (std sqrt(2/fan_in)): keeps ReLU-net activations near unit scale."""
        return self.param(name, shape, std=math.sqrt(2.0 / math.prod(shape[1:])))

    def uniform(self, name: str, shape: Sequence[int], low: float, high: float) -> str:
        return self._add(name, shape, FLOAT,
                         lambda: self.rng.uniform(low, high, tuple(shape)).astype(np.float32), None)

    def buffer(self, name: str, array: np.ndarray) -> str:
        """A non-trainable tensor registered as an initializer (position ids, causal masks)."""
        dtype = helper.np_dtype_to_tensor_dtype(array.dtype)
        return self._add(name, array.shape, dtype, lambda: array, None)

    # -- graph I/O and model -------------------------------------------------------------------

    def input(self, name: str, elem_type: int, shape: Sequence[int | str]) -> str:
        self.graph.input.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def output(self, name: str, elem_type: int, shape: Sequence[int | str]) -> None:
        self.graph.output.append(helper.make_tensor_value_info(name, elem_type, list(shape)))

    def model(self, zoo_name: str, doc: str,
              metadata: dict[str, str] | None = None) -> onnx.ModelProto:
        """Finish the model; the builder must not be used afterwards."""
        m = self.proto
        m.graph.name = "main_graph"  # the exporter's graph name; tools that special-case it see it
        m.ir_version = IR_VERSION
        m.opset_import.add(domain="", version=self.opset)
        m.producer_name, m.producer_version, m.doc_string = PRODUCER, ZOO_VERSION, doc
        helper.set_model_props(m, {"graphopt.zoo.model": zoo_name, **(metadata or {})})
        return m


# -- exporter idioms shared by several families --------------------------------------------------

def conv(gb: GraphBuilder, x: str, part: str, pname: str, cin: int, cout: int, k: int,
         stride: int = 1, group: int = 1) -> str:
    """nn.Conv2d(bias=False, padding=k//2) in module scope `part`; `pname`: state-dict name."""
    with gb.scope(part):
        w = gb.he(f"{pname}.weight", [cout, cin // group, k, k])
        bias = []
        if gb.runtime_zero_bias:
            channels = gb.op("Expand", gb.op("Shape", w, start=0, end=1), gb.const([1]))
            bias = [gb.op("Expand", gb.op("CastLike", gb.const(0.0), x), channels)]
        if gb.nhwc:
            x = gb.op("Transpose", x, perm=[0, 3, 1, 2])
        y = gb.op("Conv", x, w, *bias, dilations=[1, 1], group=group, kernel_shape=[k, k],
                  pads=[(k - 1) // 2] * 4, strides=[stride, stride])
        return gb.op("Transpose", y, perm=[0, 2, 3, 1]) if gb.nhwc else y


def bn(gb: GraphBuilder, x: str, part: str, pname: str, c: int, gamma: float = 1.0) -> str:
    """Eval-mode BatchNorm2d kept unfused, as exports with training=PRESERVE leave it.

    Statistics are random but plausible; a small `gamma` on a residual branch's last BN keeps
    deep nets from growing activations block after block (torchvision's zero_init_residual idea).
    """
    with gb.scope(part):
        scale = gb.param(f"{pname}.weight", [c], std=0.1 * gamma, mean=gamma)
        bias = gb.param(f"{pname}.bias", [c], std=0.1)
        mean = gb.param(f"{pname}.running_mean", [c], std=0.1)
        if gb.nhwc:  # over the last axis, γ/√(σ²+ε) stored as one scale, as tf2onnx leaves it
            return gb.op("Add", gb.op("Mul", gb.op("Sub", x, mean), scale), bias)
        var = gb.uniform(f"{pname}.running_var", [c], 0.5, 1.5)
        return gb.op("BatchNormalization", x, scale, bias, mean, var, epsilon=1e-5, momentum=0.9)


def layer_norm(gb: GraphBuilder, x: str, part: str, pname: str, hidden: int, eps: float,
               out: str | None = None) -> str:
    """nn.LayerNorm as exporters below opset 17 decompose it: the shape fusion passes must find."""
    with gb.scope(part):
        mean = gb.op("ReduceMean", x, axes=[-1], keepdims=1)
        d = gb.op("Sub", x, mean)
        var = gb.op("ReduceMean", gb.op("Pow", d, gb.const(2.0)), axes=[-1], keepdims=1)
        std = gb.op("Sqrt", gb.op("Add", var, gb.const(eps)))
        y = gb.op("Mul", gb.op("Div", d, std), gb.param(f"{pname}.weight", [hidden], mean=1.0))
        return gb.op("Add", y, gb.param(f"{pname}.bias", [hidden]), out=out)


def linear(gb: GraphBuilder, x: str, part: str, pname: str, cin: int, cout: int,
           weight_is_in_out: bool = False) -> str:
    """nn.Linear on a 3-D input: MatMul then Add(bias, ·), bias first as the exporter orders it.

    The exporter folds Linear's weight.t() into an anonymous "onnx::MatMul_N" initializer; GPT-2's
    Conv1D already stores [in, out] so its weight keeps its state-dict name (`weight_is_in_out`).
    """
    with gb.scope(part):
        if weight_is_in_out:
            w = gb.param(f"{pname}.weight", [cin, cout])
        else:
            w = gb.param(gb.anon("MatMul"), [cin, cout], doc=f"{pname}.weight, transposed")
        y = gb.op("MatMul", x, w)
        return gb.op("Add", gb.param(f"{pname}.bias", [cout]), y)


def view_tail(gb: GraphBuilder, x: str, tail: Sequence[int], keep: int = 2) -> str:
    """x.view(*x.size()[:keep], *tail) as traced: Shape→Gather→Unsqueeze→Concat→Reshape."""
    dims = [gb.op("Gather", gb.op("Shape", x), gb.const(i), axis=0) for i in range(keep)]
    dims = [gb.op("Unsqueeze", d, gb.const([0])) for d in dims]
    shape = gb.op("Concat", *dims, *[gb.const([t]) for t in tail], axis=0)
    return gb.op("Reshape", x, shape, allowzero=0)


def split_heads(gb: GraphBuilder, x: str, heads: int, head_dim: int,
                perm: Sequence[int] = (0, 2, 1, 3)) -> str:
    """[B, S, H] -> [B, heads, S, head_dim] (or another `perm`, e.g. Kᵀ's fused (0, 2, 3, 1))."""
    return gb.op("Transpose", view_tail(gb, x, [heads, head_dim]), perm=list(perm))


def merge_heads(gb: GraphBuilder, x: str, hidden: int) -> str:
    """[B, heads, S, head_dim] -> [B, S, H]."""
    return view_tail(gb, gb.op("Transpose", x, perm=[0, 2, 1, 3]), [hidden])
