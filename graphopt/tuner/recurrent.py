"""LSTM and GRU as the cost models price them: one GEMM per time step and direction, of the
batch's [x_t, h_{t-1}] rows by the gates' weights, then the gates' activations.

    steps = directions · sequence length            (each waits for the one before)
    GEMM  = [batch, input + hidden] × [input + hidden, gates · hidden]   gates: LSTM 4, GRU 3

CANN runs them so (DynamicRNN, DynamicGRUV2: the GEMM on the cube, the gates on the vector
unit), and so do onnxruntime's CPU kernels. Before, both models priced the op by its output
elements, as if it were an elementwise op: a 256-wide LSTM over 100 steps at a few microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from graphopt.ir import Node

GATES = {"LSTM": 4, "GRU": 3}
# Vector instructions per gate element: a sigmoid or tanh (5-6) and the products and sums
# that combine the gates (estimates, as vector.OP_COST's).
GATE_COST = 8


@dataclass(frozen=True)
class RecurrentWork:
    steps: int
    batch: int
    k: int  # input + hidden
    n: int  # gates · hidden

    @property
    def macs(self) -> int:
        return self.steps * self.batch * self.k * self.n

    @property
    def gate_elements(self) -> int:
        return self.steps * self.batch * self.n


def recurrent_work(node: Node) -> RecurrentWork | None:
    """The per-step GEMMs of an LSTM or GRU node (ONNX domain), or None for another op or
    shapes that are not static."""
    gates = GATES.get(node.op_type)
    if gates is None or not node.is_onnx or len(node.inputs) < 3:
        return None
    x, w = node.inputs[0], node.inputs[1]
    if x is None or w is None or x.static_shape is None or w.static_shape is None:
        return None
    if len(x.static_shape) != 3 or len(w.static_shape) != 3:
        return None
    batch_first = int(node.attr("layout", 0)) == 1
    sequence, batch, features = ((x.static_shape[1], x.static_shape[0], x.static_shape[2])
                                 if batch_first else x.static_shape)
    directions, width, _ = w.static_shape
    hidden = int(node.attr("hidden_size", 0) or width // gates)
    return RecurrentWork(directions * sequence, batch, features + hidden, gates * hidden)
