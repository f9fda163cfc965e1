"""Code generation: the .om artifact container and the runtime that executes it."""

from graphopt.codegen.om_read import OmArtifact, is_om, load_om
from graphopt.codegen.om_write import OmPartition, write_om
from graphopt.codegen.runtime import OmSession

__all__ = ["OmArtifact", "OmPartition", "OmSession", "is_om", "load_om", "write_om"]
