"""`graphopt zoo`: list and build the bundled benchmark models."""

from __future__ import annotations

import os

from graphopt.cli_types import path_text
from graphopt.errors import OptionError, UsageError
from graphopt.output_kind import writes_onnx


def add_zoo_parser(sub) -> None:
    p = sub.add_parser("zoo", help="list or build the bundled benchmark models",
                       description="Deterministic model builders (no downloads) that look like "
                                   "PyTorch exports.")
    zoo_sub = p.add_subparsers(dest="zoo_command", required=True, metavar="{list,build}")
    p.commands = zoo_sub.choices  # for errors: `zoo build`'s usage, not zoo's
    zoo_sub.add_parser("list", help="list the models").set_defaults(func=_cmd_zoo_list)
    build = zoo_sub.add_parser("build", help="build one model into an .onnx file",
                               description="Build a zoo model (seeded weights, no download) "
                                           "and write it as ONNX.")
    build.add_argument("name", help="model name from `graphopt zoo list`")
    build.add_argument("-o", "--output", required=True, type=path_text, metavar="FILE",
                       help="output .onnx path")
    build.set_defaults(func=_cmd_zoo_build)


def _cmd_zoo_list(args) -> int:
    from graphopt import zoo
    from graphopt.table import format_table

    print(format_table(["model", "description"], [list(row) for row in zoo.list_models()]))
    return 0


def _cmd_zoo_build(args) -> int:
    from graphopt import zoo
    from graphopt.atomic import atomic_write_bytes

    if os.path.isdir(args.output):
        raise OptionError(f"-o {args.output}: is a directory, expected a file path")
    if not writes_onnx(args.output):
        raise UsageError(f"-o {args.output}: zoo build writes ONNX (name it .onnx); compile it "
                          "to an .om with graphopt optimize")
    try:
        proto = zoo.build(args.name)
    except KeyError:
        names = ", ".join(name for name, _ in zoo.list_models())
        raise UsageError(f"zoo: unknown model '{args.name}' (known: {names})") from None
    try:
        atomic_write_bytes(args.output, proto.SerializeToString())
    except OSError as e:
        raise OptionError(f"-o {args.output}: cannot write it ({e.strerror or e})") from None
    print(f"wrote {args.output}: {len(proto.graph.node)} node(s)")
    return 0
