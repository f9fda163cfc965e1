"""Code generation: the .om artifact container and the runtime that executes it."""

from graphopt.codegen.om_read import OmArtifact, is_om, load_om
from graphopt.codegen.om_write import OmPartition, OmProfile, write_om
from graphopt.codegen.runtime import OmSession

__all__ = ["OmArtifact", "OmPartition", "OmProfile", "OmSession", "is_om", "load_om", "write_om"]
