"""What a compile returns (OptimizeResult) and where its source came from."""

from __future__ import annotations

import hashlib
import os
import stat
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from onnx import ModelProto

from graphopt import numerics
from graphopt.codegen.profile_match import profiles_count
from graphopt.ir import Model, to_onnx
from graphopt.ir.onnx_io import is_repeated_field
from graphopt.ir.tensor import stat_identity
from graphopt.passes import PassLog
from graphopt.portable_types import residual_sums, residual_types_kept

if TYPE_CHECKING:
    from graphopt.partition import Partitioning


@dataclass
class OptimizeResult:
    """The optimized model, its pass log, and what the compile noticed."""

    model: Model
    log: PassLog
    source_label: str                 # the input path, or "<model>" for protos and bytes
    source_sha256: str | None         # of the input's serialized bytes; None: hash the path
    ops_before: Counter               # op types of the input, nested graphs included
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    max_abs_error: dict[str, float] | None = None  # per output, when verified
    empty_outputs: list[str] = field(default_factory=list)  # verified over no element
    verify_note: str = ""             # why verification judged by cosine, when it did
    traces: list[str] = field(default_factory=list)  # --trace-rule reports
    partitioning: "Partitioning | None" = None  # when compiled for a target
    partition_models: dict = field(default_factory=dict)  # partition name -> Model
    memory_plans: dict = field(default_factory=dict)  # partition name -> Plan, or why none
    # With --dynamic-dims: every shape profile's compile (compile_profiles.CompiledProfile),
    # this result being the first's, and the model's signature before any pin.
    profiles: list = field(default_factory=list)
    dynamic_signature: dict | None = None
    # The knowledge base optimize(tuning_db=…) read, which save() takes its tilings from, and
    # the subgraph study whose decisions the compile applied (None: none applied).
    tuning_db: str | None = None
    tuned_study: str | None = None
    # The input file as compiled (device, inode, size, mtime; None: not a regular file): an
    # .om records its sha256 only while the path still holds those bytes.
    source_identity: tuple | None = None

    @property
    def nodes_before(self) -> int:
        return sum(self.ops_before.values())

    def to_onnx(self) -> ModelProto:
        with residual_sums(self.model):
            return to_onnx(self.model, value_infos=residual_types_kept(self.model))

    def __repr__(self) -> str:
        """One line (the dataclass's own would print the model and every pass record)."""
        nodes = self.model.graph.count_nodes()
        parts = [self.source_label, f"{self.log.pipeline}",
                 f"nodes {self.nodes_before} -> {nodes}", f"{self.seconds:.2f} s"]
        if self.partitioning is not None:
            parts.append(f"partitions {', '.join(self.partition_models)}")
        if self.profiles:
            parts.append(profiles_count(len(self.profiles)))
        if self.notes:
            parts.append(f"{len(self.notes)} note{'s' * (len(self.notes) != 1)}")
        return f"<OptimizeResult {', '.join(parts)}>"


def op_counts(nodes) -> Counter:
    """Nodes per op type, as the summary names them (`domain::Op` outside the default domain)."""
    return Counter(node.qualified_op for node in nodes)


def file_identity(path: str) -> tuple | None:
    """tensor.stat_identity of a regular file; None for anything else (a pipe)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return stat_identity(info) if stat.S_ISREG(info.st_mode) else None


def memory_model_sha256(model: ModelProto | bytes) -> str:
    """The source hash the artifact records for a model given in memory: of its serialized
    bytes; past protobuf's 2 GiB (a model onnx.load read with its external data), which no
    one message serializes to, of its fields and main-graph elements serialized one by one."""
    if isinstance(model, bytes):
        return hashlib.sha256(model).hexdigest()
    data = numerics.serialized(model)
    if data is not None:
        return hashlib.sha256(data).hexdigest()
    digest = hashlib.sha256()
    for owner in (model, model.graph):
        for descriptor, value in owner.ListFields():
            if owner is model and descriptor.name == "graph":
                continue
            digest.update(descriptor.number.to_bytes(4, "little"))
            for element in (value if is_repeated_field(descriptor) else [value]):
                if descriptor.type == descriptor.TYPE_MESSAGE:
                    _hash_message(digest, element)
                else:
                    data = repr(element).encode()
                    digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def _hash_message(digest, message) -> None:
    """One element's bytes; a single message past 2 GiB (one initializer that large) is hashed
    field by field, its bytes fields as they are."""
    from google.protobuf.message import EncodeError

    try:
        data = message.SerializeToString()
    except EncodeError:  # past 2 GiB
        pass
    else:
        digest.update(len(data).to_bytes(8, "little") + data)
        return
    for descriptor, value in message.ListFields():
        digest.update(descriptor.number.to_bytes(4, "little"))
        for element in (value if is_repeated_field(descriptor) else [value]):
            if descriptor.type == descriptor.TYPE_MESSAGE:
                _hash_message(digest, element)
            else:
                data = element if isinstance(element, bytes) else repr(element).encode()
                digest.update(len(data).to_bytes(8, "little"))
                digest.update(data)
