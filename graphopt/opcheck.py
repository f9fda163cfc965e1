"""Checks that every op is known: an ONNX schema, an onnxruntime kernel schema, or a model
function; an unknown op or domain is reported by node before any pass runs."""

from __future__ import annotations

import functools

import onnx

from graphopt.errors import InputError
from graphopt.ir import Model


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


def check_ops(model: Model, label: str, allow_custom_ops: bool = False) -> None:
    """Raise InputError on the first node whose domain is not imported or whose op is unknown."""
    imported = {("" if d == "ai.onnx" else d) for d in model.opset_imports}
    functions = model.function_keys()
    known_domains = {d for d, _ in runtime_schemas()} | {"", "ai.onnx.ml",
                                                          "ai.onnx.preview.training"}
    for node in model.graph.all_nodes():
        domain = "" if node.domain == "ai.onnx" else node.domain
        where = f"{label}: node '{node.name or '?'}' ({node.qualified_op})"
        if domain not in imported:
            raise InputError(f"{where}: domain '{domain}' is not in the model's opset_import")
        if _known(domain, node.op_type, functions):
            continue
        if domain in known_domains or not allow_custom_ops:
            if domain in known_domains:
                raise InputError(f"{where}: unknown op '{node.op_type}' in domain "
                                 f"'{domain or 'ai.onnx'}' (no ONNX or onnxruntime schema, no model "
                                 "function)")
            raise InputError(f"{where}: unknown domain '{domain}' (no schema or model function "
                             "defines its ops); pass --allow-custom-ops to keep custom ops as they are")
