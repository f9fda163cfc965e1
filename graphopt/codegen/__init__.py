"""Code generation: the .om artifact container and the runtime that executes it."""

from importlib import import_module as _import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers and editors see; at run time, _API below
    from graphopt.codegen.om_read import OmArtifact, is_om, load_om
    from graphopt.codegen.om_write import OmPartition, OmProfile, write_om
    from graphopt.codegen.runtime import OmSession

__all__ = ["OmArtifact", "OmPartition", "OmProfile", "OmSession", "is_om", "load_om", "write_om"]

# Imported on first use: loading an .om needs the reader and the runtime, not the writer.
_API = {
    "OmArtifact": "graphopt.codegen.om_read",
    "is_om": "graphopt.codegen.om_read",
    "load_om": "graphopt.codegen.om_read",
    "OmPartition": "graphopt.codegen.om_write",
    "OmProfile": "graphopt.codegen.om_write",
    "write_om": "graphopt.codegen.om_write",
    "OmSession": "graphopt.codegen.runtime",
}


def __getattr__(name: str):
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'graphopt.codegen' has no attribute {name!r}")
    value = getattr(_import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
