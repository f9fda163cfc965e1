"""The rule an .om's outputs are judged by against its source model: allclose by default,
cosine where a lossy precision pass changed the graph and the user gave no rule."""

from __future__ import annotations

from graphopt.option_names import COMPARE_FLAGS, option, usage
from graphopt.tools.compare import DEFAULT_ATOL, DEFAULT_RTOL, compare_arrays
from graphopt.tools.rule_text import cosine_text, exact, rule_text

# The cosine an output must keep after a lossy precision pass when no rule is given: below what
# README's Precision section measures (INT8 ResNet-50 0.99993 at worst and BERT 0.99963, fp16
# 1.000000, INT4 weight-only GPT-2 logits 0.981-0.986), so a sound compile passes.
LOSSY_PASSES = {"QuantizeInt8": 0.999, "ConvertPrecision": 0.999, "QuantizeInt4Weights": 0.98}


# The model metadata key that names them in an optimized .onnx, which has no pass log.
LOSSY_KEY = "graphopt.lossy_passes"
# The kind of device a lossy compile was made for ("npu" when its target's primary device is
# one): where its int8 layers will run.
LOSSY_DEVICE_KEY = "graphopt.lossy_device"
# The --precision mode ConvertPrecision ran, for inspect and the report.
PRECISION_KEY = "graphopt.precision_mode"


def marked_lossy(props) -> list[str]:
    """The lossy passes metadata `props` (a mapping, or a ModelProto's metadata_props) names."""
    if not hasattr(props, "get"):
        props = {p.key: p.value for p in props}
    return [name for name in props.get(LOSSY_KEY, "").split(",") if name]


def deployed_level(props) -> str:
    """The onnxruntime level to judge an optimized .onnx at (metadata `props` as marked_lossy
    takes them): a lossy one at ORT_ENABLE_ALL, where its QDQ pairs become the int8 kernels a
    CPU deployment runs (at ORT_DISABLE_ALL they are simulated in float, which hides the
    kernels' saturation and rounding), any other at ORT_DISABLE_ALL, which isolates graphopt's
    rewrites. One compiled for an NPU (LOSSY_DEVICE_KEY) is judged at ORT_DISABLE_ALL too: the
    NPU's int8 cube sums its products in int32 exactly, which the float simulation follows
    closely and the CPU's 16-bit pair sums (no VNNI) do not."""
    if not marked_lossy(props):
        return "disable"
    if not hasattr(props, "get"):
        props = {p.key: p.value for p in props}
    return "disable" if props.get(LOSSY_DEVICE_KEY) == "npu" else "all"


def pass_log_of_onnx(model) -> list:
    """A pass log standing for an optimized .onnx's (a ModelProto): the lossy passes its
    metadata names."""
    return [{"pass": name, "changed": True} for name in marked_lossy(model.metadata_props)
            if name in LOSSY_PASSES]


def pass_log_of_om(artifact) -> list:
    """An .om's pass log, with the lossy passes of the earlier compile that made its source
    model (the manifest's extra "lossy_passes") as entries of their own."""
    marked = [{"pass": name, "changed": True} for name in artifact.extra.get("lossy_passes", [])]
    return artifact.pass_log + marked


def lossy_passes(pass_log: list) -> list[str]:
    """The precision passes of LOSSY_PASSES that changed the graph, in pass-log order."""
    found = [e.get("pass") for e in pass_log if isinstance(e, dict)
             and e.get("pass") in LOSSY_PASSES and (e.get("changed") or e.get("rewrites"))]
    return list(dict.fromkeys(found))


def accuracy_rule(pass_log: list, rtol: float | None = None, atol: float | None = None,
                  min_cosine: float | None = None, choose: str | None = None
                  ) -> tuple[dict, str]:
    """compare_models' rtol/atol/min_cosine, and a note when the rule is not the one given: with
    neither --min-cosine nor --rtol/--atol, an .om a lossy precision pass changed is judged by
    cosine (allclose's defaults bound every element, which rounding to int8 exceeds by design).
    `choose` ends the note: how to give a rule (by default, compare's options)."""
    judge = {"rtol": DEFAULT_RTOL if rtol is None else rtol,
             "atol": DEFAULT_ATOL if atol is None else atol, "min_cosine": min_cosine}
    lossy = lossy_passes(pass_log)
    if min_cosine is not None or rtol is not None or atol is not None or not lossy:
        return judge, ""
    loosest = min(lossy, key=LOSSY_PASSES.__getitem__)
    judge["min_cosine"] = LOSSY_PASSES[loosest]
    if choose is None:
        choose = (f"{usage('min_cosine', 'C', COMPARE_FLAGS)} or {option('rtol', COMPARE_FLAGS)}/"
                  f"{option('atol', COMPARE_FLAGS)} choose the rule")
    note = (f"compiled with {' and '.join(lossy)}, lossy by design: outputs are judged by "
            f"{rule_text(0, 0, judge['min_cosine'])} (the default after {loosest}) instead of "
            f"{rule_text(judge['rtol'], judge['atol'], None)}; {choose}")
    return judge, note


def below_cosine(expected: dict, actual: dict, judge: dict) -> list[str]:
    """The outputs compare's rows fail under a cosine rule (exact match for non-floats); a
    sequence's or map's tensors one by one, as numerics.compare pairs them."""
    from graphopt import numerics

    problems = []
    for name, value in expected.items():
        if name not in actual:
            problems.append(f"output '{name}': missing")
            continue
        for pair in numerics.paired(name, value, actual[name]):
            if isinstance(pair, numerics.Mismatch):
                problems.append(str(pair))
                continue
            label, reference, got = pair
            row = compare_arrays(label, reference, got, **judge)
            if not row.passed:
                why = f"cosine {cosine_text(row.cosine, judge['min_cosine'])} < " \
                      f"{exact(judge['min_cosine'])}" \
                    if row.cosine is not None and row.cosine < judge["min_cosine"] \
                    else row.note or f"{row.mismatches} element(s) differ"
                problems.append(f"output '{label}': {why}")
    return problems
