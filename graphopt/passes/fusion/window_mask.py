r"""FuseAttention's window mask: Swin's shifted-window attention adds its mask per window by
viewing the scores with the batch and window counts apart and back,

    s [B·W, H, N, N] ─ Reshape [B, W, H, N, N] ─ Add(mask [1, W, 1, N, N]) ─ Reshape [B·W, H, N, N]

which ScaledDotProductAttention cannot take as a mask (its Softmax reads the Reshape). The same
sum is s plus the constant mask laid out as the scores are, each window's mask repeated for
every image:

    WindowMask:   Reshape(Add(Reshape(s, [B, W, …]), m), s's shape) → Add(s, m' [B·W, h, N, N])

m' has m's head dim h (1, or H) and holds B copies of m: exact, and a mask ScaledDotProductAttention
fuses like any other additive one (after the relative position bias, both pass as their sum).
"""

from __future__ import annotations

import numpy as np

from graphopt.ir.pattern import Match, Miss
from graphopt.passes.fusion.packed_heads import reshaped_dims
from graphopt.passes.rules import HandMatchedRule

# A mask repeated per image larger than this stays a run-time Add: a constant of the scores'
# size for every image of a large batch would bloat the artifact for one Add.
MAX_MASK_BYTES = 4 << 20


class WindowMask(HandMatchedRule):
    """A constant per-window mask added between Reshapes that split the windows from the batch
    → one Add of the mask laid out as the scores."""

    root_op = "Reshape"

    def match(self, node):
        added = node.inputs[0].producer
        if not node.is_onnx or added is None or not added.is_onnx or added.op_type != "Add":
            return Miss(node, 0, "the Reshape does not read an Add")
        split, mask = None, None
        for a, b in (added.inputs, added.inputs[::-1]):
            if a is not None and a.producer is not None and a.producer.op_type == "Reshape" \
                    and a.producer.is_onnx and b is not None and b.is_constant:
                split, mask = a.producer, b
                break
        if split is None:
            return Miss(node, 1, "the Add is not of a Reshape and a constant")
        bindings = {"scores": split.inputs[0], "split": split, "mask": mask, "root": node}
        return Match(node, bindings, [node, added, split])

    def check(self, scores, split, mask, root):
        laid = _laid_out(scores, split, mask, root)
        return laid if isinstance(laid, str) else None

    def rewrite(self, op, scores, split, mask, root):
        return op.Add(scores, op.const(_laid_out(scores, split, mask, root)))


def _laid_out(scores, split, mask, root) -> np.ndarray | str:
    """The mask as [B·W, h, N, N] beside scores [B·W, H, N, N], or why it cannot be."""
    shape = scores.shape
    if scores.dtype is None or shape is None or len(shape) != 4 \
            or not all(isinstance(d, int) for d in shape):
        return f"%{scores.name} is not a 4-D tensor of known dims"
    parted = reshaped_dims(split)
    if parted is None or len(parted) != 5 or parted[2:] != list(shape[1:]) \
            or not all(isinstance(d, int) for d in parted[:2]) \
            or parted[0] * parted[1] != shape[0]:
        return f"the Reshape of %{scores.name} makes {parted}, not its first dim split in two"
    if reshaped_dims(root) != list(shape):
        return f"the Add is not reshaped back to %{scores.name}'s {list(shape)}"
    data = mask.constant()
    if data is None or data.ndim > 5 or data.dtype != np.dtype(scores.dtype.numpy):
        return "the mask is not a constant of the scores' type and rank 5 at most"
    full = (1,) * (5 - data.ndim) + data.shape
    if any(m not in (1, p) for m, p in zip(full, parted)):
        return f"the mask {list(data.shape)} broadcasts the scores {parted} up"
    heads = full[2]
    laid = np.broadcast_to(data.reshape(full), (*parted[:2], heads, *parted[3:]))
    if laid.nbytes > MAX_MASK_BYTES:
        return f"the mask repeated per image would hold {laid.nbytes} bytes"
    return np.ascontiguousarray(laid).reshape(shape[0], heads, *shape[2:])


__all__ = ["WindowMask"]
