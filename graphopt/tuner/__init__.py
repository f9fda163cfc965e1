"""Operator tuning for NPU targets: the tiling space of cube ops and the analytical cost model
(estimates, never measurements) the search ranks tilings by."""

# npu_model first: it defines Estimate, then re-exports vector.py's and model.py's estimates.
from graphopt.tuner.npu_model import Estimate, best_tiling, estimate  # isort: skip
from graphopt.tuner.model import KernelRow, ModelEstimate, model_estimate, node_estimate
from graphopt.tuner.tiling import (GemmShape, Tiling, default_tiling, feasible, gemm_shape,
                                   space_size, tiling_space)
from graphopt.tuner.vector import group_estimate, transfer_estimate, vector_estimate

__all__ = [
    "Estimate", "GemmShape", "KernelRow", "ModelEstimate", "Tiling", "best_tiling",
    "default_tiling", "estimate", "feasible", "gemm_shape", "group_estimate", "model_estimate",
    "node_estimate", "space_size", "tiling_space", "transfer_estimate", "vector_estimate",
]
