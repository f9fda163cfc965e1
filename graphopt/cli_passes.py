"""`graphopt passes`: the passes, their rules and the pipelines of the -O levels."""

from __future__ import annotations


def add_passes_parser(sub) -> None:
    p = sub.add_parser("passes", help="list passes and optimization levels",
                       description="List every pass with its description and the pipelines "
                                   "that the -O levels run.")
    p.set_defaults(func=_cmd_passes)


def _cmd_passes(args) -> int:
    from graphopt.help_format import first_sentence
    from graphopt.passes import PASSES, PIPELINES, FixedPoint
    from graphopt.table import format_table, wrap_to_terminal

    rows = [[name, cls.description] for name, cls in sorted(PASSES.items())]
    print(format_table(["pass", "what it does"], rows))
    print()
    rule_rows = []
    for name, cls in sorted(PASSES.items()):
        for rule in getattr(cls, "rules", ()):
            rule_rows.append([rule.name, name, first_sentence(rule.__doc__ or "", 160)])
        # A plain pass's rewrites with names of their own switch off by name alike.
        for rewrite, matches in sorted(getattr(cls, "named_rewrites", {}).items()):
            rule_rows.append([rewrite, name, matches])
    if rule_rows:
        print(format_table(["rule", "pass", "matches"], rule_rows))
    print()
    # Prose lines wrap to a terminal and stay one line each when piped, as the tables do.
    for level, pipeline in PIPELINES.items():
        print(wrap_to_terminal(f"-O{level}  {pipeline.description}", hang="     "))
        for step in pipeline.steps:
            if isinstance(step, FixedPoint):
                print(wrap_to_terminal(f"       repeat until no change: "
                                       f"{', '.join(step.passes)}", hang="  "))
            else:
                print(wrap_to_terminal(f"       {step}", hang="  "))
    print()
    print(wrap_to_terminal("With --target cpu (the default for an .om), -O3 runs WinogradConv "
                           "before the final cleanup: wide 3×3 convs as Winograd GEMMs "
                           "(results within ~2e-5 of each layer's outputs). On a CPU with AVX2 "
                           "or AVX-512F, -O2 and -O3 then run LayoutNchwc: conv nets blocked "
                           "into onnxruntime's NCHWc ops offline."))
    return 0
