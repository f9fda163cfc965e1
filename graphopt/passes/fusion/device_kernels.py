"""Whether an op is worth writing in other ops for a target: its NPU lacks the op and has them."""

from __future__ import annotations

from graphopt.codegen.om_manifest import dtype_name


def npu_lacks(target, root, op_type: str, body: tuple[str, ...], domain: str = "",
              untyped: tuple[str, ...] = ()) -> str | None:
    """Why the expansion of `op_type` (in `domain`) at `root` into the default-domain ops
    `body` does not apply on `target` (None: it does). Each op of `body` must run the root's
    dtype, but those in `untyped`, which compute on a mask's integers."""
    if target is None:
        return "no target: onnxruntime's CPU provider runs the op"
    device = target.device(target.primary)
    if device.kind == "cpu":
        return f"target {target.shown} runs on its {device.name}, which has the op"
    dtype = dtype_name(int(root.dtype)) if root.dtype is not None else None
    if device.has_kernel(op_type, domain, dtype):
        return f"target {target.shown}: its {device.name} runs {op_type}"
    missing = [op for op in body if not device.has_kernel(op, "", None if op in untyped else dtype)]
    if missing:
        return (f"target {target.shown}: its {device.name} has no kernel for "
                f"{', '.join(missing)} either")
    return None
