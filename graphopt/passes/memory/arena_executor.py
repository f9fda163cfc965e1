"""A debug runtime that executes a memory plan: every arena tensor lives in its planned slot of
one bytearray, so a wrong plan (two live tensors sharing bytes) corrupts the outputs.

Each node runs in its own tiny onnxruntime session (built with onnx.helper, cached per node, at
ORT_DISABLE_ALL) fed with numpy views of the arena (np.frombuffer + reshape); its results are
copied into their slots. View nodes are not run at all: the plan says their output already sits
in their input's bytes, and their readers read it there. Inputs, weights (and the outputs of
constant subgraphs) and graph outputs live outside the arena, as in a real runtime.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from onnx import helper

from graphopt import numerics
from graphopt.ir import Model, Node, Value, to_onnx
from graphopt.ir.dtypes import DType
from graphopt.ir.onnx_export import node_to_proto, value_info
from graphopt.passes.memory.liveness import MemoryPlanError, node_reads
from graphopt.passes.memory.plan import Plan


class ArenaExecutor:
    def __init__(self, model: Model, plan: Plan):
        self.model, self.plan = model, plan
        self._sessions: dict[Node, object] = {}

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        graph, plan = self.model.graph, self.plan
        self.arena = bytearray(plan.arena_bytes)
        self.outside: dict[str, np.ndarray] = {}
        for value in graph.inputs:
            if value.name in feeds:
                self.outside[value.name] = np.asarray(feeds[value.name])
        for value in graph.initializers.values():
            self.outside.setdefault(value.name, value.const.numpy())
        for node in plan.schedule:
            outputs = [v for v in node.outputs if v is not None]
            if outputs and all(self._is_view(v) for v in outputs):
                continue
            reads = node_reads(node)
            feed = {v.name: self.read(v) for v in reads}
            results = self._session(node, reads, outputs).run([v.name for v in outputs], feed)
            for value, result in zip(outputs, results):
                self._write(node, value, np.asarray(result))
        return {v.name: np.array(self.read(v)) for v in graph.outputs}

    def _is_view(self, value: Value) -> bool:
        t = self.plan.tensors.get(value.name)
        return t is not None and bool(t.view_of)

    def slot(self, value: Value) -> np.ndarray:
        """The arena bytes of a planned tensor, as an array of its dtype and shape."""
        t = self.plan.tensors[value.name]
        shape = value.static_shape
        if value.dtype is None or shape is None or value.dtype.bits % 8:
            raise MemoryPlanError(f"arena executor: cannot view %{value.name} "
                                  f"({value.dtype}, {value.shape}) in the arena")
        dtype = value.dtype.numpy
        count = math.prod(shape)
        if count * dtype.itemsize != t.size:
            raise MemoryPlanError(f"arena executor: %{value.name} needs "
                                  f"{count * dtype.itemsize} B, the plan gives {t.size} B")
        if count == 0:
            return np.empty(shape, dtype)
        return np.frombuffer(self.arena, dtype=dtype, count=count, offset=t.offset).reshape(shape)

    def read(self, value: Value) -> np.ndarray:
        if value.name in self.outside:  # a fused DequantizeLinear's result (no arena bytes)
            return self.outside[value.name]
        if value.name in self.plan.tensors:
            return self.slot(value)
        if value.name not in self.outside:
            raise MemoryPlanError(f"arena executor: %{value.name} is read before it is computed "
                                  "(missing feed, or a schedule out of order)")
        return self.outside[value.name]

    def _write(self, node: Node, value: Value, result: np.ndarray) -> None:
        if value.name not in self.plan.tensors or (
                node.op_type == "DequantizeLinear" and not self.plan.tensors[value.name].size):
            # a DequantizeLinear the int8 layers after it fuse: its float copy is theirs
            self.outside[value.name] = result
            return
        slot = self.slot(value)
        if slot.shape != result.shape or slot.dtype != result.dtype:
            raise MemoryPlanError(
                f"arena executor: {node.qualified_op} '{node.name}' produced %{value.name} as "
                f"{result.dtype}{list(result.shape)}, planned as {slot.dtype}{list(slot.shape)}")
        slot[...] = result

    def _session(self, node: Node, reads: list[Value], outputs: list[Value]):
        session = self._sessions.get(node)
        if session is None:
            graph = helper.make_graph([node_to_proto(node)], f"node_{node.op_type}",
                                      [value_info(v) for v in reads],
                                      [value_info(v) for v in outputs])
            opsets = [helper.make_opsetid(d, v) for d, v in self.model.opset_imports.items()]
            proto = helper.make_model(graph, ir_version=max(self.model.ir_version, 4),
                                      opset_imports=opsets)
            proto.functions.extend(self.model.functions)
            try:
                session = numerics.session(proto, "disable")
            except Exception as e:  # noqa: BLE001 - onnxruntime's message names the problem
                raise MemoryPlanError(f"arena executor: onnxruntime cannot run {node.qualified_op} "
                                      f"'{node.name}' alone: {str(e).splitlines()[0]}") from e
            self._sessions[node] = session
        return session


@dataclass
class ArenaCheck:
    """The arena run's outputs against onnxruntime running the whole model."""

    max_abs: dict[str, float]
    mismatches: list[str]

    @property
    def ok(self) -> bool:
        return not self.mismatches


# (rtol, atol) against onnxruntime's whole-model run for a model that computes in a 16-bit
# float. The arena runs each node in a session of its own, which rounds every result to 16
# bits where the whole model's session may keep float32 between nodes it has no 16-bit kernel
# for: a correct fp16 plan of the zoo's tiny conv net was off by 4.7e-4 (1.4 at most).
SIXTEEN_BIT_TOLERANCES = {DType.FLOAT16: (1e-2, 1e-3), DType.BFLOAT16: (5e-2, 1e-2)}
FLOAT32_TOLERANCES = (1e-4, 1e-5)


def check_plan(model: Model, plan: Plan, feeds: dict[str, np.ndarray] | None = None, *,
               seed: int = 0, rtol: float | None = None, atol: float | None = None,
               executor: ArenaExecutor | None = None) -> ArenaCheck:
    """Run `model` through its plan in the arena executor and compare every output with
    onnxruntime's whole-model run at ORT_DISABLE_ALL (seeded random feeds by default), within
    `rtol`/`atol`: by default 1e-4 / 1e-5, looser for a model that computes in float16 or
    bfloat16 (SIXTEEN_BIT_TOLERANCES, with atol grown by rtol times each output's largest
    magnitude). Then the outputs must also match, within 1e-4 / 1e-5,
    the same nodes run with no tensor sharing bytes with another: the looser bounds alone let
    a clobbered fp16 MobileNet through (off by 1.3e-3 of its largest logit)."""
    if plan.formats is not None:  # sizes and TransData copies of an NPU's formats
        raise MemoryPlanError("arena executor: the plan is sized in an NPU's device formats, "
                              "which onnxruntime's ND kernels cannot run in; check the ND plan "
                              "of the same partition, plan_memory(model)")
    proto = to_onnx(model)
    if feeds is None:
        feeds = numerics.random_feeds(proto, seed=seed)
    expected = numerics.run(proto, feeds)
    executor = executor or ArenaExecutor(model, plan)
    actual = executor.run(feeds)
    max_abs = {}
    for name, exp in expected.items():
        got = actual.get(name)
        if got is not None and got.shape == exp.shape and exp.dtype.kind in "fiub":
            diff = np.abs(got.astype(np.float64) - exp.astype(np.float64))
            max_abs[name] = float(np.nanmax(diff)) if diff.size else 0.0
    sixteen_bit = _sixteen_bit_tolerances(model) if rtol is None and atol is None else None
    default_rtol, default_atol = sixteen_bit or FLOAT32_TOLERANCES
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    if sixteen_bit:
        # Each output at its own scale: a per-node session's 16-bit rounding of an element
        # near 0 follows from terms of the output's size (blazepalm's fp16 detections, 0.03
        # off on values of 0.02 beside 31.5), and _unshared_mismatches below is what holds
        # the plan itself to 1e-4.
        mismatches = [str(m) for name, exp in expected.items()
                      for m in numerics.compare({name: exp}, actual, rtol,
                                                atol + rtol * numerics.largest_magnitude(exp))]
    else:
        mismatches = [str(m) for m in numerics.compare(expected, actual, rtol, atol)]
    if sixteen_bit and not mismatches:
        mismatches = _unshared_mismatches(model, plan, executor, feeds, actual)
    return ArenaCheck(max_abs, mismatches)


def _sixteen_bit_tolerances(model: Model) -> tuple[float, float] | None:
    """The tolerances of the least precise 16-bit float `model` computes in; None if none."""
    dtypes = {value.dtype for value in model.graph.all_values()}
    found = [tolerances for dtype, tolerances in SIXTEEN_BIT_TOLERANCES.items()
             if dtype in dtypes]
    return max(found) if found else None


def _unshared_mismatches(model: Model, plan: Plan, executor: ArenaExecutor,
                         feeds: dict[str, np.ndarray], actual: dict[str, np.ndarray]
                         ) -> list[str]:
    """The outputs of the arena run that differ from the same nodes' run (the same sessions,
    so the same rounding) over the same schedule with every tensor in bytes of its own:
    what the 16-bit tolerances would hide of a plan that lets live tensors overlap."""
    from graphopt.passes.memory.plan import plan_memory

    unshared = ArenaExecutor(model, plan_memory(model, plan.schedule, strategies=["naive"],
                                                inplace=False))
    unshared._sessions = executor._sessions  # built once per node
    reference = unshared.run(feeds)
    return [f"{m} (against the same nodes run with no tensor sharing bytes)"
            for m in numerics.compare(reference, actual, *FLOAT32_TOLERANCES)]
