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
    build.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                       dest="settings", help="a size option of the builder, again for each "
                       "(`--set layers=4 --set hidden=256`; a sequence as `blocks=1,1,1,1`); "
                       "`graphopt zoo list` shows each model's with its default")
    build.set_defaults(func=_cmd_zoo_build)


def _cmd_zoo_list(args) -> int:
    from graphopt import zoo
    from graphopt.table import format_table

    rows = [[name, description, ", ".join(f"{key}={_shown(value)}" for key, value
                                          in _defaults(name).items())]
            for name, description in zoo.list_models()]
    print(format_table(["model", "description", "size options (--set NAME=VALUE)"], rows))
    return 0


def _defaults(name: str) -> dict:
    """The builder's keyword arguments and their defaults."""
    import inspect

    from graphopt import zoo

    builder = zoo.ZOO[name][0]
    return {key: p.default for key, p in inspect.signature(builder).parameters.items()
            if p.kind == p.KEYWORD_ONLY}


def _shown(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)


def _settings(name: str, given: list[str]) -> dict:
    """--set NAME=VALUE pairs as the builder's keywords, each read as its default's type."""
    defaults = _defaults(name)
    options = {}
    for item in given:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or key not in defaults:
            known = ", ".join(f"{k}={_shown(v)}" for k, v in defaults.items()) or "none"
            raise UsageError(f"--set {item}: {name} takes NAME=VALUE with NAME one of its "
                             f"size options ({known})")
        try:
            options[key] = _typed(text.strip(), defaults[key])
        except ValueError:
            raise UsageError(f"--set {item}: {key} takes a value like its default, "
                             f"{_shown(defaults[key])}") from None
    return options


def _typed(text: str, default):
    """`text` as a value of `default`'s type: a bool, an int, a float, or a sequence of ints."""
    if isinstance(default, bool):
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(text)
        return text.lower() in ("true", "1")
    if isinstance(default, (tuple, list)):
        return tuple(int(part) for part in text.split(","))
    if isinstance(default, float):
        return float(text)
    return int(text)  # an int, or None standing for one (gpt2_small's intermediate)


def _cmd_zoo_build(args) -> int:
    from graphopt import zoo
    from graphopt.atomic import atomic_write_bytes

    if os.path.isdir(args.output):
        raise OptionError(f"-o {args.output}: is a directory, expected a file path")
    if not writes_onnx(args.output):
        raise UsageError(f"-o {args.output}: zoo build writes ONNX (name it .onnx); compile it "
                          "to an .om with graphopt optimize")
    if args.name not in zoo.ZOO:
        names = ", ".join(name for name, _ in zoo.list_models())
        raise UsageError(f"zoo: unknown model '{args.name}' (known: {names})")
    options = _settings(args.name, args.settings)
    try:
        proto = zoo.build(args.name, **options)
    except (ValueError, AssertionError) as e:  # sizes the builder cannot make
        raise UsageError(f"zoo build {args.name} with {', '.join(args.settings)}: "
                         f"{e or 'sizes the builder cannot make'}") from None
    try:
        atomic_write_bytes(args.output, proto.SerializeToString())
    except OSError as e:
        raise OptionError(f"-o {args.output}: cannot write it ({e.strerror or e})") from None
    print(f"wrote {args.output}: {len(proto.graph.node)} node(s)")
    return 0
