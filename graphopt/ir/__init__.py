"""graphopt's intermediate representation: values, nodes, graphs, ONNX I/O, printer, verifier."""

from graphopt.ir.attributes import Attr
from graphopt.ir.dtypes import DType
from graphopt.ir.graph import CycleError, Graph
from graphopt.ir.model import Model
from graphopt.ir.node import Node
from graphopt.ir.onnx_export import to_onnx
from graphopt.ir.onnx_io import load_onnx
from graphopt.ir.printer import format_model, format_node
from graphopt.ir.tensor import Tensor
from graphopt.ir.value import Use, Value
from graphopt.ir.verify import VerifyError, verify

__all__ = [
    "Attr", "CycleError", "DType", "Graph", "Model", "Node", "Tensor", "Use", "Value",
    "VerifyError", "format_model", "format_node", "load_onnx", "to_onnx", "verify",
]
