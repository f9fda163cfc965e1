"""The model corpus that ships inside the onnx wheel, with inputs for each model."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from graphopt import numerics

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
SUITES = ("light", "simple", "pytorch-converted", "pytorch-operator")


@dataclass(frozen=True)
class CorpusModel:
    suite: str
    name: str
    path: str
    data_dir: str | None  # test_data_set_0 with input_*.pb, or None for seeded random inputs

    @property
    def id(self) -> str:
        return f"{self.suite}/{self.name}"


def corpus_models() -> list[CorpusModel]:
    models = []
    for suite in SUITES:
        for path in sorted(glob.glob(os.path.join(DATA, suite, "*.onnx"))):
            name = os.path.basename(path)[: -len(".onnx")]
            models.append(CorpusModel(suite, name, path, None))
        for path in sorted(glob.glob(os.path.join(DATA, suite, "*", "model.onnx"))):
            folder = os.path.dirname(path)
            data = os.path.join(folder, "test_data_set_0")
            models.append(CorpusModel(suite, os.path.basename(folder), path,
                                      data if os.path.isdir(data) else None))
    return models


def _read_pb(path: str, type_proto: onnx.TypeProto):
    with open(path, "rb") as f:
        data = f.read()
    if type_proto.HasField("sequence_type"):
        seq = onnx.SequenceProto()
        seq.ParseFromString(data)
        return numpy_helper.to_list(seq)
    if type_proto.HasField("optional_type"):
        opt = onnx.OptionalProto()
        opt.ParseFromString(data)
        return numpy_helper.to_optional(opt)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(data)
    return numpy_helper.to_array(tensor)


def model_inputs(entry: CorpusModel, model: onnx.ModelProto) -> dict:
    """The corpus's own inputs where it has them, else seeded random ones."""
    initialized = {t.name for t in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in initialized]
    if entry.data_dir is None:
        return numerics.random_feeds(model, seed=0)
    files = sorted(glob.glob(os.path.join(entry.data_dir, "input_*.pb")),
                   key=lambda p: int(os.path.basename(p)[6:-3]))
    return {info.name: _read_pb(path, info.type) for info, path in zip(graph_inputs, files)}


def run_outputs(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    sess = numerics.session(model, "disable")
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))
