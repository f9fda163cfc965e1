"""Code generation: the .om artifact container and the runtime that executes it."""

from typing import TYPE_CHECKING

from graphopt.lazy import lazy_attributes

if TYPE_CHECKING:  # what type checkers and editors see; at run time, lazy_attributes below
    from graphopt.codegen.om_read import OmArtifact, is_om, load_om
    from graphopt.codegen.om_write import OmPartition, OmProfile, write_om
    from graphopt.codegen.runtime import OmSession

__all__ = ["OmArtifact", "OmPartition", "OmProfile", "OmSession", "is_om", "load_om", "write_om"]

# Imported on first use: loading an .om needs the reader and the runtime, not the writer.
__getattr__, __dir__ = lazy_attributes(__name__, {
    "OmArtifact": "graphopt.codegen.om_read:OmArtifact",
    "is_om": "graphopt.codegen.om_read:is_om",
    "load_om": "graphopt.codegen.om_read:load_om",
    "OmPartition": "graphopt.codegen.om_write:OmPartition",
    "OmProfile": "graphopt.codegen.om_write:OmProfile",
    "write_om": "graphopt.codegen.om_write:write_om",
    "OmSession": "graphopt.codegen.runtime:OmSession",
}, globals())
