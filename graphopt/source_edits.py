"""The input model as a compile takes it before any pass: ended at --out-nodes, with
--insert-op-conf's preprocessing in front and the input and output dtypes --input-fp16-nodes and
--output-type ask for. Verification and the accuracy report compare the
compiled model with this, not with the file as given, whose outputs and inputs differ."""

from __future__ import annotations

import os

from onnx import ModelProto

from graphopt.ir import Model


# optimize's keywords, and the command line's dests, that edit the source before any pass.
EDIT_KEYWORDS = ("out_nodes", "insert_op_conf", "input_fp16_nodes", "output_type")


def given_edits(args) -> dict:
    """The EDIT_KEYWORDS `args` (the command line's) gives, by keyword: what edited_source
    takes to make the model a compile with them is compared with."""
    return {key: getattr(args, key) for key in EDIT_KEYWORDS if getattr(args, key)}


def apply_source_edits(model: Model, out_nodes: list[str] | None, aipp: list | None,
                       label: str, aipp_path: str | None,
                       pins: dict[str, list[int]] | None = None,
                       fp16_inputs: list[str] | None = None,
                       output_types: dict[str, str] | None = None) -> list[str]:
    """Edit `model` in place as the options ask; returns the compile's notes saying so (the
    inputs as `pins`, --input-shape's, will have them)."""
    notes = []
    if out_nodes is not None:
        from graphopt.out_nodes import select_outputs

        notes.append(select_outputs(model, out_nodes, label))
    if aipp is not None:
        from graphopt.aipp_graph import insert_aipp

        notes.append(insert_aipp(model, aipp, aipp_path, pins))
    if fp16_inputs or output_types:
        from graphopt.io_types import apply_io_types

        notes.append(apply_io_types(model, fp16_inputs, output_types, label))
    return notes


def edit_source(model: Model, out_nodes=None, insert_op_conf=None,
                label: str = "<model>", input_fp16_nodes=None, output_type=None,
                pins: dict[str, list[int]] | None = None) -> list[str]:
    """Edit `model` in place as optimize's `out_nodes`, `insert_op_conf`, `input_fp16_nodes` and
    `output_type` keywords (as given: text, a list, a path) ask, with `pins` as
    apply_source_edits takes them (--input-shape's, which may size an AIPP input's images);
    returns the compile's notes."""
    from graphopt.aipp_config import read_aipp_config
    from graphopt.io_types import parse_fp16_inputs, parse_output_type
    from graphopt.out_nodes import parse_out_nodes

    return apply_source_edits(
        model, None if out_nodes is None else parse_out_nodes(out_nodes),
        None if insert_op_conf is None else read_aipp_config(insert_op_conf), label,
        None if insert_op_conf is None else os.fspath(insert_op_conf), pins,
        fp16_inputs=None if input_fp16_nodes is None else parse_fp16_inputs(input_fp16_nodes),
        output_types=None if output_type is None else parse_output_type(output_type))


def edited_source(model, out_nodes=None, insert_op_conf=None, label: str = "<model>",
                  input_fp16_nodes=None, output_type=None, input_shapes=None) -> ModelProto:
    """`model` (a path, bytes or ModelProto) edited as optimize edits it with these options
    (`input_shapes` as optimize takes them: they may size an AIPP input's images): the
    reference a compile with them is compared with."""
    from graphopt.input_shapes import input_shapes_argument
    from graphopt.ir import load_onnx, to_onnx
    from graphopt.ir.tensor import inline_tensors

    ir_model = load_onnx(model, user_model=True)
    edit_source(ir_model, out_nodes, insert_op_conf, label, input_fp16_nodes, output_type,
                input_shapes_argument(input_shapes) if input_shapes else None)
    with inline_tensors():  # a check inside an .om's save runs it: no references to resolve
        return to_onnx(ir_model)
