"""Passes, pipelines and the pass manager; importing this package registers every pass."""

from graphopt.passes import cleanup, fold_constants, fold_shapes, fusion, infer_shapes, inline_if, layout_nchwc, noops  # noqa: F401,E501
from graphopt.passes import ort_names, precision, shape_upstream, winograd  # noqa: F401
from graphopt.passes.base import PASSES, Pass, PassContext, PassResult, register
from graphopt.passes.manager import PassLog, PassManager, PassRecord
from graphopt.passes.options import Options
from graphopt.passes.pipelines import DEFAULT_LEVEL, PIPELINES, FixedPoint, Pipeline, for_target
from graphopt.quant import int8 as _int8  # noqa: F401,E402 - registers QuantizeInt8 (after base)

__all__ = [
    "DEFAULT_LEVEL", "PASSES", "PIPELINES", "FixedPoint", "Options", "Pass", "PassContext",
    "PassLog", "PassManager", "PassRecord", "PassResult", "Pipeline", "for_target", "register",
]
