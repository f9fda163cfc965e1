"""`make demo`: build the bundled model, compile it to .om with the real CLI, run it, compare."""

from __future__ import annotations

import os
import sys

import numpy as np

from graphopt import numerics, zoo
from graphopt.atomic import atomic_write_bytes
from graphopt.cli import main as cli_main
from graphopt.codegen import OmSession


def main(out_dir: str = "out/demo") -> int:
    os.makedirs(out_dir, exist_ok=True)
    source = os.path.join(out_dir, "tiny.onnx")
    artifact = os.path.join(out_dir, "tiny.om")
    model = zoo.build("tiny")
    atomic_write_bytes(source, model.SerializeToString())
    print(f"$ graphopt optimize {source} -o {artifact} --verify\n")
    status = cli_main(["optimize", source, "-o", artifact, "--verify"])
    if status:
        return status
    feeds = zoo.sample_inputs(model, seed=0)
    expected = numerics.run(model, feeds)
    got = OmSession(artifact).run(feeds)
    name = next(iter(expected))
    err = float(np.max(np.abs(got[name] - expected[name])))
    print(f"\nran {artifact} with graphopt's runtime: output '{name}' {list(got[name].shape)}, "
          f"top-1 class {int(np.argmax(got[name]))}, max abs diff vs original {err:.2g}")
    return 0 if err <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
