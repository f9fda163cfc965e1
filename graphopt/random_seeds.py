"""Seeds for a model's unseeded random ops, so that two graphs of one model draw the same noise.

onnxruntime draws an unseeded RandomNormalLike's noise from a seed of the session's, so the same
op in another graph, or at another place in one (once graphopt removed the Identities before
it), draws other noise: a sampler's outputs (a VITS vocoder's waveform, its very length) then
differ between a model and its compile, and --verify, compare, report and bisect failed on
them. Where outputs are compared, each such op is given a seed of its own, made from its node's
name, in every model the comparison runs; a deployed model keeps drawing fresh noise.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # graphopt's runtime loads this module and must not import onnx
    import onnx
    from onnx import ModelProto

RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                        "Multinomial", "Bernoulli"})
_NAMES = tuple(op.encode() for op in RANDOM_OPS)
# Whether graphopt's runtime seeds the random ops of the partitions it loads: only for an .om
# whose outputs are to be compared (compare's candidate, load_candidate).
SEEDING: ContextVar[bool] = ContextVar("graphopt_seed_random_ops", default=False)


def unseeded_random_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """The random ops of `graph` and its subgraphs without a seed attribute."""
    for node in graph.node:
        if node.domain in ("", "ai.onnx") and node.op_type in RANDOM_OPS \
                and not any(attr.name == "seed" for attr in node.attribute):
            yield node
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from unseeded_random_nodes(sub)


def draws_unseeded(model: ModelProto) -> bool:
    """Whether `model` has a random op without a seed."""
    return next(unseeded_random_nodes(model.graph), None) is not None


def seeding_note(model: ModelProto) -> str | None:
    """The note of a comparison whose runs seeded `model`'s random ops, or None."""
    ops = sorted(node.op_type for node in unseeded_random_nodes(model.graph))
    if not ops:
        return None
    counts = ", ".join(f"{op} ×{ops.count(op)}" if ops.count(op) > 1 else op
                       for op in sorted(set(ops)))
    return (f"the model draws random numbers without a seed ({counts}): for this comparison "
            "each draw was seeded by its node's name, alike in both models; deployed, it draws "
            "fresh noise")


def node_seed(node: onnx.NodeProto) -> float:
    """A seed that follows the node through graphopt's passes and partitions: its name (its
    first output's where it has none), as a float32-exact number."""
    key = node.name or (node.output[0] if node.output else node.op_type)
    return float(zlib.crc32(key.encode("utf-8")) % (1 << 24))


def seeded_copy(model: ModelProto) -> ModelProto | None:
    """A copy of `model` whose unseeded random ops carry node_seed; None when it has none."""
    import onnx

    if not draws_unseeded(model):
        return None
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in list(unseeded_random_nodes(copy.graph)):
        node.attribute.append(onnx.helper.make_attribute("seed", node_seed(node)))
    return copy


def seeded_bytes(data: bytes) -> bytes:
    """seeded_copy of a serialized model; `data` itself when it has no unseeded random op
    (told by the op names it holds before anything is parsed)."""
    if not any(name in data for name in _NAMES):
        return data
    from onnx import ModelProto

    copy = seeded_copy(ModelProto.FromString(data))
    return data if copy is None else copy.SerializeToString()


@contextlib.contextmanager
def seeded_runs() -> Iterator[None]:
    """graphopt's runtime seeds the random ops of the partitions it loads within."""
    token = SEEDING.set(True)
    try:
        yield
    finally:
        SEEDING.reset(token)
