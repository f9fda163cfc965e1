"""The nodes AIPP's preprocessing is made of, in the forms the model's opset reads, placed
before the graph's first node."""

from __future__ import annotations

import contextlib

import numpy as np

from graphopt.ir import DType, Node, Value

# The names of the colour conversion's nodes start with it: their float values are integers
# that must stay exact (ConvertPrecision keeps them float32, whatever the mode).
EXACT_PREFIX = "aipp_csc_"


def exact_preprocessing(node: Node) -> bool:
    """Whether `node` is part of an inserted colour conversion. ATC's AIPP unit computes it in
    integers under every precision mode; in float16, a product of 8-bit values and M/256 is
    rounded and the Floor that follows lands one off (1,207 of 36,864 values of a BT.601
    conversion, 8,915 in bfloat16)."""
    return node.name.startswith(EXACT_PREFIX)


class OpBuilder:
    """Makes nodes before the graph's current first node, in the model's default-domain opset."""

    def __init__(self, graph, opset: int):
        self.graph, self.opset = graph, opset
        self.first = graph.nodes()[0] if len(graph) else None
        self._prefix = "aipp_"

    @contextlib.contextmanager
    def exact(self):
        """Nodes made inside are named as exact_preprocessing reads them."""
        outer, self._prefix = self._prefix, EXACT_PREFIX
        try:
            yield
        finally:
            self._prefix = outer

    def node(self, op_type: str, inputs: list, attrs: dict | None = None, dtype=DType.FLOAT,
             shape=None) -> Value:
        made = self.graph.make_node(op_type, inputs, attrs or {}, dtype=dtype, shape=shape,
                                    before=self.first,
                                    name=self.graph.fresh_node_name(self._prefix + op_type))
        return made.output

    def const(self, hint: str, array) -> Value:
        return self.graph.make_initializer(f"aipp_{hint}", np.asarray(array))

    def slice(self, x: Value, starts: list[int], ends: list[int], axes: list[int], dtype,
              shape) -> Value:
        if self.opset < 10:  # Slice-1 takes them as attributes
            return self.node("Slice", [x], {"starts": starts, "ends": ends, "axes": axes},
                             dtype=dtype, shape=shape)
        return self.node("Slice", [x, *(self.const(hint, np.array(v, np.int64)) for hint, v in
                                        (("slice_start", starts), ("slice_end", ends),
                                         ("slice_axes", axes)))], dtype=dtype, shape=shape)

    def clip(self, x: Value, low: float, high: float) -> Value:
        if self.opset < 11:  # Clip-6 takes its bounds as attributes
            return self.node("Clip", [x], {"min": low, "max": high}, shape=x.shape)
        return self.node("Clip", [x, self.const("clip_min", np.float32(low)),
                                  self.const("clip_max", np.float32(high))], shape=x.shape)

    def reshape(self, x: Value, shape: tuple) -> Value:
        """`x` as `shape`, whose first dim (the batch, maybe symbolic) is copied."""
        target = np.array([0, *shape[1:]], np.int64)  # 0: copy the dim, as Reshape-5 reads it
        return self.node("Reshape", [x, self.const("shape", target)], dtype=x.dtype, shape=shape)

    def upsample2x(self, x: Value, axes: tuple[int, int]) -> Value:
        """`x` with each element repeated twice along both `axes` (nearest neighbour, output
        index i reading input i // 2), in the form the opset has."""
        scales = np.ones(len(x.shape), np.float32)
        scales[list(axes)] = 2.0
        shape = tuple(d * 2 if i in axes and isinstance(d, int) else d
                      for i, d in enumerate(x.shape))
        if self.opset < 9:  # Upsample-7: scales as an attribute
            return self.node("Upsample", [x], {"mode": "nearest", "scales": scales.tolist()},
                             dtype=x.dtype, shape=shape)
        scale_input = self.const("upsample_scales", scales)
        if self.opset == 9:
            return self.node("Upsample", [x, scale_input], {"mode": "nearest"}, dtype=x.dtype,
                             shape=shape)
        if self.opset == 10:  # Resize-10: asymmetric coordinates, nearest rounds down
            return self.node("Resize", [x, scale_input], {"mode": "nearest"}, dtype=x.dtype,
                             shape=shape)
        # Resize-11 requires its roi input, which only tf_crop_and_resize reads; 13 made it
        # optional.
        roi = self.const("resize_roi", np.zeros(0, np.float32)) if self.opset < 13 else None
        return self.node("Resize", [x, roi, scale_input],
                         {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                          "nearest_mode": "floor"}, dtype=x.dtype, shape=shape)
