"""The .om artifact (a deterministic zip of partition models and a JSON manifest): public names."""

from graphopt.codegen.om_manifest import (
    DETAILS_NAME,
    DETAILS_SCHEMA,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    MANIFEST_SCHEMA,
    PARTITION_DIR,
    dtype_from_name,
    dtype_name,
)
from graphopt.codegen.om_read import OmArtifact, is_om, load_om
from graphopt.codegen.om_write import OmPartition, OmProfile, write_om

__all__ = [
    "DETAILS_NAME", "DETAILS_SCHEMA", "FORMAT", "FORMAT_VERSION", "MANIFEST_NAME",
    "MANIFEST_SCHEMA", "PARTITION_DIR", "OmArtifact", "OmPartition", "OmProfile",
    "dtype_from_name", "dtype_name", "is_om", "load_om", "write_om",
]
