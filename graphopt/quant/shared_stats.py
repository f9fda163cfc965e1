"""Calibration statistics shared by the shape profiles of one compile (`--dynamic-dims`).

AMCT calibrates a model once, at the input shape of its calibration data, and ATC compiles every
dynamic dim with the scales it found. Likewise here: a profile the calibration data fits
measures the activation statistics, and a profile it does not fit (another sequence length)
takes them instead of refusing the data. Activation ranges and per-channel means do not depend
on the sizes of the dims a profile pins, nor do the Gram matrices GPTQ weighs int4 rounding by
(sums over rows of each feature pair), nor the per-channel extents channel equalization scales
by, which every profile applies alike.

A tensor is found by the layers that read it, else by the node that computes it, else by its
name (`keys`). Node names come from the exporter (or from the node a fusion replaced), while the
names of the tensors fusions make are numbered in the order they are made: a fusion may take
another form at another shape (the embeddings' Add + LayerNorm of a BERT fuse into
SkipLayerNormalization at batch 1 only), and the tensors made after it then take other numbers,
so a name alone could pair two different tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphopt.errors import OptionError
from graphopt.ir import Graph
from graphopt.passes.base import anchor_key
from graphopt.quant.stats import TensorStats


@dataclass
class SharedStats:
    """What the first profile that measured left for the others: tensor statistics and the
    input means of the float layers that bias correction adjusts, by tensor name."""

    profile: str = ""               # the profile being compiled (optimize_profiles sets it)
    measured_by: str | None = None  # the profile that measured, for the notes and errors
    borrowers: list[str] = field(default_factory=list)  # the profiles that took its statistics
    stats: dict[str, TensorStats] = field(default_factory=dict)
    head_means: dict[str, np.ndarray | None] = field(default_factory=dict)
    grams: dict[str, np.ndarray] = field(default_factory=dict)  # GPTQ's XᵀX per MatMul input
    # The layers the sensitivity guard kept float, by anchor key, with why: a profile that
    # borrows the statistics cannot run the guard, and keeps the same layers float.
    held: dict[str, str] | None = None
    measured: str = "the activation ranges"  # what the measuring profile took from the data
    # Whether the calibration data fit some profile's inputs, and the refusal of the profile
    # it came closest to (the most of a sample's inputs fitting, `misfit_matched`): data that
    # fits none is refused even where no pass needed statistics from it.
    fitted: bool = False
    misfit: str | None = None
    misfit_matched: int = -1
    by_pass: str = "QuantizeInt8"
    # The files of a calibration directory some profile calibrated on (calib_data's
    # profile_samples): one that none did is refused.
    samples_used: set = field(default_factory=set)
    # Channel equalization's per-channel extents, by key (None until a profile measured them):
    # a profile that takes the ranges must scale its channels as the measuring one did.
    extents: dict[str, np.ndarray] | None = None

    @property
    def ready(self) -> bool:
        return self.measured_by is not None

    def keep(self, stats: dict, graph: Graph) -> None:
        """Record the statistics the current profile measured (by tensor name) under every key
        of their tensors in `graph`, when no profile has yet."""
        if self.ready:
            return
        self.measured_by = self.profile
        for name, value in stats.items():
            for key in keys(graph, name):
                self.stats.setdefault(key, value)

    def keep_grams(self, grams: dict, graph: Graph) -> None:
        """Record GPTQ's Gram matrices the current profile measured (by tensor name) under
        every key of their tensors in `graph`, when no profile has yet: XᵀX sums over rows, so
        a profile of another sequence length weighs the same features by them."""
        if self.ready:
            return
        self.measured_by = self.profile
        self.measured, self.by_pass = "GPTQ's input statistics", "QuantizeInt4Weights"
        for name, gram in grams.items():
            for key in keys(graph, name):
                self.grams.setdefault(key, gram)

    def keep_extents(self, extents: dict, graph: Graph) -> None:
        """Record channel equalization's extents (by tensor name, under every key), when no
        profile has yet; {} records that the measuring profile had none to measure."""
        if self.extents is None:
            self.extents = {key: extent for name, extent in extents.items()
                            for key in keys(graph, name)}

    def extents_of(self, names, graph: Graph) -> dict:
        """The recorded extents of `names` (tensors of `graph`) that were measured: a region
        the measuring profile did not scale is not scaled here either, as its ranges were
        measured unscaled."""
        found = {}
        for name in names:
            key = next((k for k in keys(graph, name) if k in (self.extents or {})), None)
            if key is not None:
                found[name] = self.extents[key]
        return found

    def lookup_grams(self, names, graph: Graph, why: str) -> dict:
        """The recorded Gram matrices of `names` (tensors of `graph`), as `lookup` finds
        statistics."""
        return self._find(self.grams, names, graph, why)

    def lookup(self, names, graph: Graph, why: str) -> dict:
        """The statistics of `names` (tensors of `graph`), by their first key the measuring
        profile's compile has; OptionError naming the first tensor it has under none (`why` says
        why this compile cannot measure it itself)."""
        return self._find(self.stats, names, graph, why)

    def _find(self, table: dict, names, graph: Graph, why: str) -> dict:
        if self.profile not in self.borrowers:
            self.borrowers.append(self.profile)
        found = {}
        for name in names:
            key = next((k for k in keys(graph, name) if k in table), None)
            if key is None:
                raise OptionError(f"{why}; it takes {self.measured} from profile "
                                  f"{self.measured_by}, whose compile has no tensor '{name}' "
                                  "nor its producer or readers: give calibration data of this "
                                  "profile's shapes")
            found[name] = table[key]
        return found


    def keep_means(self, means: dict, graph: Graph) -> None:
        """Record the input means of the float layers that bias correction adjusts (by tensor
        name, under every key), when no profile has yet."""
        if not self.head_means:
            self.head_means = {key: mean for name, mean in means.items()
                               for key in keys(graph, name)}

    def means(self, names, graph: Graph) -> dict:
        """The recorded input means of `names` (tensors of `graph`); None for one not found."""
        return {name: next((self.head_means[k] for k in keys(graph, name)
                            if k in self.head_means), None) for name in names}

    def note(self, order: list[str]) -> str:
        """Which profiles took which one's statistics ("" when none did), in `order` (the
        profiles' labels as optimize_profiles sets `profile`)."""
        if not self.borrowers:
            return ""
        which = ", ".join(sorted(self.borrowers, key=order.index))
        return (f"{self.by_pass}: the calibration data fits profile {self.measured_by}, not "
                f"{which}: {'they take' if len(self.borrowers) > 1 else 'it takes'} "
                f"{self.measured} measured there")


def keys(graph: Graph, name: str) -> list[str]:
    """The keys tensor `name` of `graph` is known by across profiles, surest first: the inputs
    of its readers and its producer's output (by anchor key: the node's name when it has one),
    then its name."""
    value = next((v for node in graph for v in node.outputs if v is not None and v.name == name),
                 None) or next((v for v in graph.inputs if v.name == name), None)
    if value is None:
        return [name]
    found = [f"{anchor_key(use.node)} input {use.index}" for use in value.uses]
    if value.producer is not None:
        found.append(f"{anchor_key(value.producer)} output {value.producer.outputs.index(value)}")
    return found + [name]
