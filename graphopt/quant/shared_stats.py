"""Calibration statistics shared by the shape profiles of one compile (`--dynamic-dims`).

AMCT calibrates a model once, at the input shape of its calibration data, and ATC compiles every
dynamic dim with the scales it found. Likewise here: a profile the calibration data fits
measures the activation statistics, and a profile it does not fit (another sequence length)
takes them by tensor name instead of refusing the data. Activation ranges and per-channel means
do not depend on the sizes of the dims a profile pins.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphopt.errors import OptionError
from graphopt.quant.stats import TensorStats


@dataclass
class SharedStats:
    """What the first profile that measured left for the others: tensor statistics and the
    input means of the float layers that bias correction adjusts, by tensor name."""

    profile: str = ""               # the profile being compiled (optimize_profiles sets it)
    measured_by: str | None = None  # the profile that measured, for the notes and errors
    stats: dict[str, TensorStats] = field(default_factory=dict)
    head_means: dict[str, np.ndarray | None] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.measured_by is not None

    def keep(self, stats: dict[str, TensorStats]) -> None:
        """Record the statistics the current profile measured, when no profile has yet."""
        if not self.ready:
            self.measured_by, self.stats = self.profile, dict(stats)

    def lookup(self, names, why: str) -> dict[str, TensorStats]:
        """The statistics of `names`; OptionError naming the first that the measuring profile's
        compile did not have (`why` says why this compile cannot measure it itself)."""
        missing = [name for name in names if name not in self.stats]
        if missing:
            raise OptionError(f"{why}; it takes its activation ranges from profile "
                              f"{self.measured_by}, whose compile has no tensor '{missing[0]}': "
                              "give calibration data of this profile's shapes")
        return {name: self.stats[name] for name in names}
