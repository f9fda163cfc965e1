"""The bench model sets (zoo, the onnx wheel's light corpus, a folder of ONNX files) with inputs."""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import onnx

from graphopt import numerics, zoo

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")

# name -> (builder options, how the row names the size when it is not the default)
ZOO_FULL: dict[str, tuple[dict, str]] = {
    name: ({}, "") for name in
    ("tiny", "matmul256", "resnet50", "mobilenetv2", "blazepalm", "lcnetv3", "unet",
     "gpt2_small", "bert_base")}
# --quick keeps every architecture but shrinks the two big ones: the graph patterns stay, the
# 100 MB and 440 MB of weights that dominate load and save times go.
ZOO_QUICK: dict[str, tuple[dict, str]] = {
    "tiny": ({}, ""), "matmul256": ({}, ""), "gpt2_small": ({}, ""), "mobilenetv2": ({}, ""),
    "blazepalm": ({}, ""), "lcnetv3": ({}, ""),
    "resnet50": ({"width": 0.25}, "width 0.25"),
    "unet": ({"base_channels": 16, "image_size": 128}, "base 16, 128x128"),
    "bert_base": ({"layers": 2, "hidden": 128, "heads": 2, "intermediate": 512, "vocab": 1000},
                  "2 layers, hidden 128"),
}
# The light CNNs whose weights come from ConstantOfShape: alexnet, vgg19 and zfnet512 make
# folding tools materialize hundreds of MB, too slow for --quick.
LIGHT_QUICK = ("squeezenet", "shufflenet", "inception_v1")


@dataclass
class BenchModel:
    name: str        # row label: set/model, with size options when not the defaults
    path: str        # the ONNX file every tool reads
    feeds: dict[str, np.ndarray]


Wanted = Callable[[str], bool]  # row name -> bench it?
# How many row names the error of an --only that matched nothing lists.
SHOWN = 20


def matching(only: list[str]) -> Wanted:
    """The filter of --only TEXT (repeatable): rows whose name contains a TEXT in any case
    (`int8` picks the `INT8` row), all without one."""
    texts = [text.casefold() for text in only]
    return lambda name: not texts or any(text in name.casefold() for text in texts)


def unmatched(only: list[str], models: Callable[[Wanted], Iterable],
              option: str = "--only") -> str | None:
    """The one-line error when `matching(only)` picks none of the rows `models(wanted)` offers,
    else None. Asked before any measuring: a run of nothing printed empty tables and exit 0.
    The names are gathered through a filter that refuses every row, so nothing is built."""
    if not only:
        return None
    offered: list[str] = []
    for _ in models(lambda name: offered.append(name) or False):
        pass
    if any(map(matching(only), offered)):
        return None
    shown = ", ".join(offered[:SHOWN]) or "none"
    if len(offered) > SHOWN:  # memory.py alone offers some 80 pytorch-converted models
        shown += f", … ({len(offered) - SHOWN} more)"
    return f"no model matches {' '.join(f'{option} {text}' for text in only)}; the models: {shown}"


def zoo_models(workdir: str, quick: bool, wanted: Wanted) -> Iterator[BenchModel]:
    """Builds each zoo model into `workdir` just before it is measured and deletes it after, so
    at most one large model sits on disk at a time."""
    yield from sized_zoo_models(workdir, ZOO_QUICK if quick else ZOO_FULL, wanted)


def sized_zoo_models(workdir: str, sizes: dict[str, tuple[dict, str]],
                     wanted: Wanted) -> Iterator[BenchModel]:
    """zoo_models with the builder options per model given: `sizes` is shaped like ZOO_FULL
    (a key `model@variant` is one more row of `model`, its options saying how it differs)."""
    for key, (options, size) in sizes.items():
        name = key.partition("@")[0]
        label = f"zoo/{name}" + (f" ({size})" if size else "")
        if not wanted(label):
            continue  # building bert_base alone takes seconds
        proto = zoo.build(name, **options)
        path = os.path.join(workdir, f"{key.replace('@', '_')}.onnx")
        onnx.save(proto, path)
        feeds = zoo.sample_inputs(proto, seed=0)
        del proto  # bert_base's 440 MB of weights need not stay in memory while tools run
        try:
            yield BenchModel(label, path, feeds)
        finally:
            os.remove(path)


def light_models(quick: bool, wanted: Wanted) -> Iterator[BenchModel]:
    paths = sorted(glob.glob(os.path.join(LIGHT_DIR, "*.onnx")))
    if not paths:
        raise FileNotFoundError(f"no light models in {LIGHT_DIR}: is the onnx wheel complete?")
    for path in paths:
        name = os.path.basename(path)[: -len(".onnx")].removeprefix("light_")
        if (quick and name not in LIGHT_QUICK) or not wanted(f"light/{name}"):
            continue
        yield BenchModel(f"light/{name}", path, _random_feeds(path))


def check_folder(parser, folder: str | None, option: str = "--shared") -> None:
    """parser.error (exit 2) before any measuring when `folder` is no folder of .onnx models:
    found in the middle of a run, it would end it and lose what was measured."""
    if folder is None:
        return
    if not os.path.isdir(folder):
        parser.error(f"{option} {folder}: not a directory")
    if not glob.glob(os.path.join(folder, "*.onnx")):
        parser.error(f"{option} {folder}: no .onnx files there")


def folder_models(folder: str, wanted: Wanted) -> Iterator[BenchModel]:
    """Every *.onnx in `folder`; NAME.inputs.npz beside a model is its feed when present."""
    paths = sorted(glob.glob(os.path.join(folder, "*.onnx")))
    if not paths:
        raise FileNotFoundError(f"--shared {folder}: no .onnx files there")
    prefix = os.path.basename(os.path.abspath(folder))
    for path in paths:
        stem = path[: -len(".onnx")]
        label = f"{prefix}/{os.path.basename(stem)}"
        if not wanted(label):
            continue
        if os.path.exists(stem + ".inputs.npz"):
            with np.load(stem + ".inputs.npz", allow_pickle=False) as data:
                feeds = {k: data[k] for k in data.files}
        else:
            feeds = _random_feeds(path)
        yield BenchModel(label, path, feeds)


def _random_feeds(path: str) -> dict[str, np.ndarray]:
    return numerics.random_feeds(onnx.load(path), seed=0)
