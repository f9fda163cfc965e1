"""SimplifyLayout and SimplifySlicing: each rule fires where it should (counted, structurally),
refuses with a reason where it must not, and leaves every output bit-identical at
ORT_DISABLE_ALL."""

from __future__ import annotations

import re

import onnx
import onnx.parser
import pytest
from helpers import ops

from graphopt import numerics
from graphopt.ir import format_model, load_onnx, to_onnx, verify
from graphopt.passes import PASSES, Options, PassContext, PassManager, Pipeline
from graphopt.passes.fusion import layout, slicing  # noqa: F401  (registers the passes)
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.passes.rules import Tracer

BIG = 9223372036854775807  # INT64_MAX: "to the end" as exporters write it


def header(opset: int = 17) -> str:
    return f'<ir_version: 8, opset_import: ["" : {opset}]>\n'


def run(text: str, name: str, dims: dict | None = None, trace: str | None = None):
    """Parse, make Constants initializers, infer shapes, run pass `name` then dead-node
    removal; check structure and that every output is unchanged (rtol 0, atol 0).
    Returns (model, stats of `name`, trace lines of rule `trace`)."""
    proto = onnx.parser.parse_model(text)
    onnx.checker.check_model(proto)
    model = load_onnx(proto)
    ctx = PassContext(Options(), tracer=Tracer({trace}) if trace else None)
    PASSES["ConstantToInitializer"]().run(model, ctx)  # as a compile leaves Constant nodes
    infer_shapes(model)
    stats = dict(PASSES[name]().run(model, ctx).stats)
    verify(model)
    PASSES["EliminateDeadNodes"]().run(model, ctx)
    out = to_onnx(model)
    onnx.checker.check_model(out)
    feeds = numerics.random_feeds(proto, seed=0, dims=dims or {"N": 2})
    assert not numerics.compare(numerics.run(proto, feeds), numerics.run(out, feeds), 0, 0)
    return model, stats, ctx.tracer.report() if trace else []


def node(model, op_type: str):
    return next(n for n in model.graph if n.op_type == op_type)


def ints(value) -> list[int]:
    return value.constant().reshape(-1).tolist()


# -- Transpose ∘ Transpose ------------------------------------------------------------------

def test_transposes_compose_in_the_right_order():
    p1, p2 = [2, 0, 3, 1], [0, 2, 1, 3]
    model, stats, _ = run(header() + f"""
    g (float[2, 3, 4, 5] x) => (float[?, ?, ?, ?] y) {{
        t = Transpose <perm = {p1}> (x)
        y = Transpose <perm = {p2}> (t)
    }}""", "SimplifyLayout")
    assert stats == {"TransposeOfTranspose": 1} and ops(model) == ["Transpose"]
    perm = node(model, "Transpose").attr("perm")
    assert perm == [p1[j] for j in p2] != [p2[j] for j in p1]
    assert node(model, "Transpose").inputs[0].name == "x" and model.graph.outputs[0].name == "y"


def test_inverse_transposes_vanish_and_x_takes_the_output_name():
    model, stats, _ = run(header() + """
    g (float[2, 3, 4] x) => (float[2, 3, 4] y) {
        r = Relu(x)
        t = Transpose <perm = [1, 2, 0]> (r)
        y = Transpose <perm = [2, 0, 1]> (t)
    }""", "SimplifyLayout")
    assert stats == {"TransposeOfTranspose": 1}
    assert ops(model) == ["Relu"]
    assert model.graph.outputs[0].name == "y" and model.graph.outputs[0].producer.op_type == "Relu"


def test_transposes_without_perm_reverse_twice():
    model, stats, _ = run(header() + """
    g (float[N, 3, 4] x) => (float[N, 3, 4] y) {
        t = Transpose(x)
        u = Transpose(t)
        y = Relu(u)
    }""", "SimplifyLayout")
    assert stats == {"TransposeOfTranspose": 1} and ops(model) == ["Relu"]
    assert node(model, "Relu").inputs[0].name == "x"


def test_identity_composition_between_graph_input_and_output_keeps_one_transpose():
    # x is a graph input, so it cannot take over the output's name: one Transpose stays.
    model, stats, _ = run(header() + """
    g (float[2, 3] x) => (float[2, 3] y) {
        t = Transpose <perm = [1, 0]> (x)
        y = Transpose <perm = [1, 0]> (t)
    }""", "SimplifyLayout")
    assert stats == {"TransposeOfTranspose": 1} and ops(model) == ["Transpose"]
    assert node(model, "Transpose").attr("perm") == [0, 1]


def test_transpose_with_another_reader_is_left_alone():
    model, stats, trace = run(header() + """
    g (float[2, 3] x) => (float[2, 3] y, float[3, 2] z) {
        t = Transpose <perm = [1, 0]> (x)
        y = Transpose <perm = [1, 0]> (t)
        z = Relu(t)
    }""", "SimplifyLayout", trace="TransposeOfTranspose")
    assert stats == {} and ops(model) == ["Transpose", "Transpose", "Relu"]
    assert any("also read by Relu" in line for line in trace)


# -- Squeeze / Unsqueeze --------------------------------------------------------------------

def squeeze_pair(opset: int, first: str, second: str, axes1: str, axes2: str,
                 shape: str = "2, 1, 4") -> str:
    if opset >= 13:
        body = f"""a1 = Constant <value_ints = {axes1}> ()
        a2 = Constant <value_ints = {axes2}> ()
        t = {first}(x, a1)
        u = {second}(t, a2)"""
    else:
        body = f"""t = {first} <axes = {axes1}> (x)
        u = {second} <axes = {axes2}> (t)"""
    return header(opset) + f"""
    g (float[{shape}] x) => (float[?] y) {{
        {body}
        y = Relu(u)
    }}"""


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_unsqueeze_of_squeeze_cancels(opset):
    text = squeeze_pair(opset, "Squeeze", "Unsqueeze", "[1]", "[-2]")
    model, stats, _ = run(text, "SimplifyLayout")
    assert stats == {"UnsqueezeOfSqueeze": 1} and ops(model) == ["Relu"]
    assert node(model, "Relu").inputs[0].name == "x"


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_of_unsqueeze_cancels(opset):
    text = squeeze_pair(opset, "Unsqueeze", "Squeeze", "[0, -1]", "[3, 0]", shape="N, 4")
    model, stats, _ = run(text, "SimplifyLayout")
    assert stats == {"SqueezeOfUnsqueeze": 1} and ops(model) == ["Relu"]


@pytest.mark.parametrize("opset", [11, 13, 17])
@pytest.mark.parametrize("inner, outer, shape, merged", [
    ("[1]", "[2]", "N, 4", [1, 2]),          # BERT's mask: [B, S] -> [B, 1, 1, S]
    ("[0]", "[0]", "N, 4", [0, 1]),
    ("[1]", "[0]", "N, 4", [0, 2]),
    ("[-1]", "[1, -1]", "N, 4", [1, 3, 4]),  # negative axes, against each step's rank
    ("[0, 2]", "[4]", "2, N, 3", [0, 2, 4]),
])
def test_two_unsqueezes_become_one(opset, inner, outer, shape, merged):
    model, stats, _ = run(squeeze_pair(opset, "Unsqueeze", "Unsqueeze", inner, outer,
                                       shape=shape), "SimplifyLayout")
    assert stats == {"UnsqueezeOfUnsqueeze": 1} and ops(model) == ["Unsqueeze", "Relu"]
    unsqueeze = node(model, "Unsqueeze")
    axes = unsqueeze.attr("axes") if opset < 13 else ints(unsqueeze.input(1))
    assert list(axes) == merged


@pytest.mark.parametrize("outer", ["[2, 2]", "[]"])
def test_unsqueezes_with_repeated_or_no_axes_stay(outer):
    # Repeated: onnxruntime refuses the outer one when it runs, which one merged node must not
    # hide. None: a no-op, EliminateNoOps' to remove (it crashed the merge).
    text = squeeze_pair(17, "Unsqueeze", "Unsqueeze", "[1]", outer, shape="N, 4") \
        .replace("<value_ints = []>", "<value_ints: ints = []>")
    model = load_onnx(onnx.parser.parse_model(text))
    ctx = PassContext(Options())
    PASSES["ConstantToInitializer"]().run(model, ctx)
    assert "UnsqueezeOfUnsqueeze" not in PASSES["SimplifyLayout"]().run(model, ctx).stats


@pytest.mark.parametrize("opset", [11, 13, 17])
@pytest.mark.parametrize("inner, outer, shape, merged", [
    ("[0]", "[1]", "1, N, 1, 4", [0, 2]),       # the outer axis counts in the middle rank
    ("[2]", "[0]", "1, N, 1, 4", [0, 2]),
    ("[-2]", "[-3]", "1, N, 1, 4", [0, 2]),     # negative axes, against each step's rank
    ("[1, 3]", "[0, -1]", "1, 1, 3, 1, 1", [0, 1, 3, 4]),
])
def test_two_squeezes_become_one(opset, inner, outer, shape, merged):
    model, stats, _ = run(squeeze_pair(opset, "Squeeze", "Squeeze", inner, outer, shape=shape),
                          "SimplifyLayout", dims={"N": 3})
    assert stats == {"SqueezeOfSqueeze": 1} and ops(model) == ["Squeeze", "Relu"]
    squeeze = node(model, "Squeeze")
    axes = squeeze.attr("axes") if opset < 13 else ints(squeeze.input(1))
    assert list(axes) == merged


def test_squeezes_without_axes_stay():
    # A Squeeze without axes drops whatever dims are 1 when it runs: not merged.
    model, stats, trace = run(header() + """
    g (float[1, N, 1, 4] x) => (float[?] y) <int64[1] a = {0}> {
        t = Squeeze(x, a)
        u = Squeeze(t)
        y = Relu(u)
    }""", "SimplifyLayout", dims={"N": 3}, trace="SqueezeOfSqueeze")
    assert stats == {} and any("every 1-dim" in line for line in trace)


def test_unsqueeze_of_squeeze_without_axes_on_a_static_shape():
    model, stats, _ = run(header() + """
    g (float[2, 1, 4, 1] x) => (float[2, 1, 4, 1] y) <int64[2] a = {1, 3}> {
        t = Squeeze(x)
        u = Unsqueeze(t, a)
        y = Relu(u)
    }""", "SimplifyLayout")
    assert stats == {"UnsqueezeOfSqueeze": 1} and ops(model) == ["Relu"]


@pytest.mark.parametrize("rule, text, dims, reason", [
    ("UnsqueezeOfSqueeze", squeeze_pair(13, "Squeeze", "Unsqueeze", "[1]", "[0]"), None,
     "are not the squeezed axes"),
    ("SqueezeOfUnsqueeze", squeeze_pair(11, "Unsqueeze", "Squeeze", "[0]", "[2]"), None,
     "are not the inserted axes"),
    ("UnsqueezeOfSqueeze", squeeze_pair(13, "Squeeze", "Unsqueeze", "[1]", "[1]",
                                        shape="2, M, 4"), {"M": 1}, "not known to be 1"),
    ("UnsqueezeOfSqueeze", header() + """g (float[2, 1, 4] x, int64[1] a) => (float[?] y) {
        t = Squeeze(x, a)
        u = Unsqueeze(t, a)
        y = Relu(u) }""", None, "not constant"),
    ("SqueezeOfUnsqueeze", header() + """g (float[2, 4] x, int64[1] a) => (float[?] y) {
        t = Unsqueeze(x, a)
        u = Squeeze(t)
        y = Relu(u) }""", None, "Squeeze has no axes"),
])
def test_squeeze_pairs_refused(rule, text, dims, reason):
    model, stats, trace = run(text, "SimplifyLayout", dims=dims, trace=rule)
    assert stats == {} and len(ops(model)) == 3
    assert any(reason in line for line in trace), trace


def test_squeeze_read_twice_is_left_alone():
    text = header() + """
    g (float[2, 1, 4] x) => (float[2, 1, 4] y, float[2, 4] z) <int64[1] a = {1}> {
        t = Squeeze(x, a)
        y = Unsqueeze(t, a)
        z = Relu(t)
    }"""
    model, stats, _ = run(text, "SimplifyLayout")
    assert stats == {} and ops(model) == ["Squeeze", "Unsqueeze", "Relu"]


@pytest.mark.parametrize("inner, rule", [
    ("t = Flatten <axis = 2> (x)", "ReshapeOfFlatten"),
    ("t = Squeeze(x, one)", "ReshapeOfSqueeze"),
    ("t = Unsqueeze(x, one)", "ReshapeOfUnsqueeze"),
])
def test_reshape_skips_an_inner_layout_op(inner, rule):
    model, stats, _ = run(header() + f"""
    g (float[2, 1, 3, 4] x) => (float[6, 4] y) <int64[1] one = {{1}}, int64[2] s = {{-1, 4}}> {{
        {inner}
        y = Reshape(t, s)
    }}""", "SimplifyLayout")
    assert stats == {rule: 1} and ops(model) == ["Reshape"]
    assert node(model, "Reshape").inputs[0].name == "x"


def test_reshape_copying_a_dim_is_refused():
    model, stats, trace = run(header() + """
    g (float[2, 1, 3, 4] x) => (float[?, ?] y) <int64[2] s = {0, -1}> {
        t = Flatten <axis = 2> (x)
        y = Reshape(t, s)
    }""", "SimplifyLayout", trace="ReshapeOfFlatten")
    assert stats == {} and ops(model) == ["Flatten", "Reshape"]
    assert any("copies a dim" in line for line in trace)


# -- Concat of Slices -----------------------------------------------------------------------

def concat_of_slices(ranges, shape="2, 7", axis=1, steps=None, slice_axis=None, opset=17):
    """Concat along `axis` of Slices of x, one per (start, end) in `ranges`."""
    lines, names = [], []
    along = axis if slice_axis is None else slice_axis
    for i, (start, end) in enumerate(ranges):
        if opset < 10:
            lines.append(f"s{i} = Slice <starts = [{start}], ends = [{end}], axes = [{along}]> (x)")
        else:
            step = f", st{i}" if steps else ""
            lines.append(f"b{i} = Constant <value_ints = [{start}]> ()\n"
                         f"e{i} = Constant <value_ints = [{end}]> ()\n"
                         f"a{i} = Constant <value_ints = [{along}]> ()\n"
                         + (f"st{i} = Constant <value_ints = [{steps[i]}]> ()\n" if steps else "")
                         + f"s{i} = Slice(x, b{i}, e{i}, a{i}{step})")
        names.append(f"s{i}")
    body = "\n".join(lines)
    return header(opset) + f"""
    g (float[{shape}] x) => (float[?, ?] y) {{
        {body}
        c = Concat <axis = {axis}> ({", ".join(names)})
        y = Relu(c)
    }}"""


def slice_range(model) -> tuple[list[int], list[int], list[int]]:
    s = node(model, "Slice")
    if s.attr("starts") is not None:
        return s.attr("starts"), s.attr("ends"), s.attr("axes")
    return ints(s.inputs[1]), ints(s.inputs[2]), ints(s.inputs[3])


@pytest.mark.parametrize("opset", [9, 13])
def test_adjacent_slices_become_one_slice(opset):
    model, stats, _ = run(concat_of_slices([(1, 3), (3, 4), (4, 6)], opset=opset),
                          "SimplifySlicing")
    assert stats == {"ConcatOfSlices": 1} and ops(model) == ["Slice", "Relu"]
    assert slice_range(model) == ([1], [6], [1])


def test_adjacent_slices_of_an_unknown_size_axis():
    model, stats, _ = run(concat_of_slices([(0, 2), (2, 3)], shape="2, N"), "SimplifySlicing",
                          dims={"N": 5})
    assert stats == {"ConcatOfSlices": 1} and slice_range(model) == ([0], [3], [1])


@pytest.mark.parametrize("ranges", [[(0, 2), (2, 5), (5, 7)], [(-7, -4), (-4, BIG)],
                                    [(0, 3), (3, BIG)]])
def test_slices_covering_the_whole_axis_are_x(ranges):
    text = concat_of_slices(ranges).replace("float[2, 7] x) =>", "float[2, 7] x0) =>")
    text = text.replace("{\n", "{\n        x = Relu(x0)\n", 1)
    model, stats, _ = run(text, "SimplifySlicing")
    assert stats == {"ConcatOfSlices": 1} and ops(model) == ["Relu", "Relu"]
    assert node(model, "Relu").output.uses[0].node.op_type == "Relu"


def test_whole_axis_between_graph_input_and_output_keeps_one_full_slice():
    text = concat_of_slices([(0, 3), (3, 7)]).replace("c = Concat", "y = Concat")
    text = text.replace("y = Relu(c)\n", "").replace("float[?, ?] y", "float[2, 7] y")
    model, stats, _ = run(text, "SimplifySlicing")
    assert stats == {"ConcatOfSlices": 1} and ops(model) == ["Slice"]
    assert slice_range(model) == ([0], [7], [1]) and model.graph.outputs[0].name == "y"


def test_concat_of_slices_printed_after():
    model, _, _ = run(concat_of_slices([(1, 3), (3, 6)]), "SimplifySlicing")
    body = format_model(model).split("{\n", 1)[1]
    body = re.sub(r"  # .*", "", body)  # node names are the rewrite's business
    assert body == """\
  %x_starts<i64[1]> = initializer i64[1][1]
  %x_ends<i64[1]> = initializer i64[1][6]
  %x_axes<i64[1]> = initializer i64[1][1]
  %slice<f32[2,5]> = Slice(%x, %x_starts, %x_ends, %x_axes)
  %y<f32[2,5]> = Relu(%slice)
  return %y<f32[2,5]>
}
"""


@pytest.mark.parametrize("kwargs, reason", [
    ({"ranges": [(0, 2), (3, 5)]}, "a gap"),
    ({"ranges": [(0, 3), (2, 5)]}, "an overlap"),
    ({"ranges": [(2, 4), (0, 2)]}, "an overlap"),
    ({"ranges": [(0, 2), (2, 6)], "steps": [1, 2]}, "steps [2]"),
    ({"ranges": [(0, 1), (1, 2)], "slice_axis": 0}, "along axis 0, the Concat along 1"),
    ({"ranges": [(-3, 2), (2, 4)], "shape": "2, N"}, "mixes signs"),
])
def test_concat_of_slices_refused(kwargs, reason):
    model, stats, trace = run(concat_of_slices(**kwargs), "SimplifySlicing",
                              dims={"N": 6}, trace="ConcatOfSlices")
    assert stats == {} and "Concat" in ops(model)
    assert any(reason in line for line in trace), trace


@pytest.mark.parametrize("change, reason", [
    # starts fed at run time
    (("b1 = Constant <value_ints = [2]> ()\n", ""), "starts are not constant"),
    # one Slice is also an output
    (("=> (float[?, ?] y)", "=> (float[?, ?] y, float[?, ?] s1)"), "is a graph output"),
    # a Slice of another tensor
    (("s1 = Slice(x, ", "s1 = Slice(x2, "), "reads %x2, not %x"),
])
def test_concat_of_slices_refused_structurally(change, reason):
    text = concat_of_slices([(0, 2), (2, 4)]).replace(*change)
    extra = ", int64[1] b1" if "b1 = Constant" not in text else ""
    extra += ", float[2, 7] x2" if "x2" in text else ""
    text = text.replace("float[2, 7] x)", f"float[2, 7] x{extra})")
    model, stats, trace = run(text, "SimplifySlicing", trace="ConcatOfSlices")
    assert stats == {} and "Concat" in ops(model)
    assert any(reason in line for line in trace), trace


# -- Slice of Concat ------------------------------------------------------------------------

def slice_of_concat(start, end, axis=1, shapes=("2, 3", "2, 4", "2, 2"), step=1,
                    extra_out=""):
    return header() + f"""
    g (float[{shapes[0]}] u, float[{shapes[1]}] v, float[{shapes[2]}] w)
      => (float[?, ?] y{extra_out}) {{
        c = Concat <axis = 1> (u, v, w)
        b = Constant <value_ints = [{start}]> ()
        e = Constant <value_ints = [{end}]> ()
        a = Constant <value_ints = [{axis}]> ()
        st = Constant <value_ints = [{step}]> ()
        s = Slice(c, b, e, a, st)
        y = Relu(s)
    }}"""


@pytest.mark.parametrize("start, end, picked", [(3, 7, "v"), (-6, -2, "v"), (0, 3, "u"),
                                                 (7, BIG, "w"), (-2, 9, "w")])
def test_slice_selecting_one_concat_input_is_that_input(start, end, picked):
    model, stats, _ = run(slice_of_concat(start, end), "SimplifySlicing")
    assert stats == {"SliceOfConcat": 1} and ops(model) == ["Relu"]
    assert node(model, "Relu").inputs[0].name == picked


def test_slice_of_a_concat_read_elsewhere_still_goes():
    # The Concat stays for its other reader; the Slice still becomes a plain read of v.
    model, stats, _ = run(slice_of_concat(3, 7, extra_out=", float[2, 9] c"), "SimplifySlicing")
    assert stats == {"SliceOfConcat": 1} and ops(model) == ["Concat", "Relu"]


@pytest.mark.parametrize("kwargs, reason", [
    ({"start": 2, "end": 7}, "is not exactly one Concat input"),
    ({"start": 3, "end": 9}, "is not exactly one Concat input"),
    ({"start": 3, "end": 7, "step": 2}, "steps [2]"),
    ({"start": 0, "end": 2, "axis": 0}, "along axis 0, the Concat along 1"),
    ({"start": 3, "end": 7, "shapes": ("2, N", "2, 4", "2, 2")}, "not all known"),
])
def test_slice_of_concat_refused(kwargs, reason):
    model, stats, trace = run(slice_of_concat(**kwargs), "SimplifySlicing", dims={"N": 3},
                              trace="SliceOfConcat")
    assert stats == {} and ops(model) == ["Concat", "Slice", "Relu"]
    assert any(reason in line for line in trace), trace


# -- Concat of Split ------------------------------------------------------------------------

def concat_of_split(order="s0, s1, s2", split_axis=1, concat_axis=1, opset=17, outputs="",
                    sizes="[2, 3, 1]"):
    if opset >= 13:
        split = f"""sz = Constant <value_ints = {sizes}> ()
        s0, s1, s2 = Split <axis = {split_axis}> (r, sz)"""
    else:
        split = f"s0, s1, s2 = Split <axis = {split_axis}, split = {sizes}> (r)"
    return header(opset) + f"""
    g (float[7, 6] x) => (float[?, ?] y{outputs}) {{
        r = Relu(x)
        {split}
        c = Concat <axis = {concat_axis}> ({order})
        y = Relu(c)
    }}"""


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_concat_of_every_split_output_is_x(opset):
    model, stats, _ = run(concat_of_split(opset=opset), "SimplifySlicing")
    assert stats == {"ConcatOfSplit": 1} and ops(model) == ["Relu", "Relu"]
    assert node(model, "Relu").output.uses[0].node.op_type == "Relu"


def test_concat_of_equal_split_without_sizes():
    model, stats, _ = run(header(18) + """
    g (float[2, 6] x) => (float[2, 6] y) {
        r = Relu(x)
        s0, s1, s2 = Split <axis = -1, num_outputs = 3> (r)
        y = Concat <axis = 1> (s0, s1, s2)
    }""", "SimplifySlicing")
    assert stats == {"ConcatOfSplit": 1} and ops(model) == ["Relu"]
    assert model.graph.outputs[0].name == "y"


@pytest.mark.parametrize("kwargs, reason", [
    ({"order": "s1, s0, s2"}, "out of order"),
    ({"order": "s0, s1"}, "makes 3"),
    ({"concat_axis": 0, "sizes": "[2, 2, 2]"}, "Split along axis 1, Concat along axis 0"),
    ({"outputs": ", float[?, ?] s1"}, "is a graph output"),
])
def test_concat_of_split_refused(kwargs, reason):
    model, stats, trace = run(concat_of_split(**kwargs), "SimplifySlicing",
                              trace="ConcatOfSplit")
    assert stats == {} and "Split" in ops(model) and "Concat" in ops(model)
    assert any(reason in line for line in trace), trace


def test_nested_concats_along_one_axis_join_once():
    model, stats, _ = run(header(17) + """
    g (float[1, 2, 4] a, float[1, 3, 4] b, float[1, 1, 4] c, float[1, 2, 4] d)
      => (float[1, 8, 4] y, float[2, 8, 4] z) {
        inner = Concat <axis = -2> (b, c)
        y = Concat <axis = 1> (a, inner, d)
        kept = Concat <axis = 0> (a, d)
        other = Concat <axis = 0> (kept, kept)
        z = Concat <axis = 1> (other, other, other, other)
    }""", "SimplifySlicing")
    assert stats == {"ConcatOfConcat": 1}
    joined = [n for n in model.graph if n.output.name == "y"][0]
    assert [v.name for v in joined.inputs] == ["a", "b", "c", "d"]
    # along another axis, or read twice, an inner Concat stays
    assert ops(model).count("Concat") == 4


def test_split_output_read_elsewhere_is_refused():
    text = concat_of_split(outputs=", float[?, ?] z").replace(
        "y = Relu(c)", "y = Relu(c)\n        z = Neg(s2)")
    _, stats, trace = run(text, "SimplifySlicing", trace="ConcatOfSplit")
    assert stats == {} and "also read by Neg" in "\n".join(trace)


# -- Gather of an unpacked piece ------------------------------------------------------------

def unpacked_pieces(perm: str = "3, 1, 2, 0, 4") -> str:
    """nn.MultiheadAttention's unpacking of y [S, B, 3·E]: Reshape [S, B, 3, E], Unsqueeze(0),
    Transpose(perm), Squeeze(3), Gather 0, 1 and -1."""
    return header() + f"""
    g (float[5, 2, 12] y) => (float[?, ?, ?] q, float[?, ?, ?] k, float[?, ?, ?] v) {{
        split = Constant <value = int64[4] {{5, 2, 3, 4}}> ()
        zero = Constant <value = int64[1] {{0}}> ()
        three = Constant <value = int64[1] {{3}}> ()
        i0 = Constant <value = int64 {{0}}> ()
        i1 = Constant <value = int64 {{1}}> ()
        i2 = Constant <value = int64 {{-1}}> ()
        r = Reshape(y, split)
        u = Unsqueeze(r, zero)
        t = Transpose <perm = [{perm}]> (u)
        p = Squeeze(t, three)
        q = Gather <axis = 0> (p, i0)
        k = Gather <axis = 0> (p, i1)
        v = Gather <axis = 0> (p, i2)
    }}"""


def test_gathers_of_unpacked_pieces_become_slices():
    model, stats, _ = run(unpacked_pieces(), "SimplifySlicing")
    assert stats == {"GatherOfUnpackedPieces": 3}
    assert ops(model) == ["Slice", "Slice", "Slice"]
    assert [ints(n.inputs[1]) + ints(n.inputs[2]) for n in model.graph] == [[0, 4], [4, 8],
                                                                            [8, 12]]


def test_pieces_whose_other_axes_move_stay_gathers():
    # (3, 2, 1, 0, 4) swaps S and B as well: a piece is no Slice of y then.
    _, stats, trace = run(unpacked_pieces("3, 2, 1, 0, 4"), "SimplifySlicing",
                          trace="GatherOfUnpackedPieces")
    assert stats == {}
    assert "not moved to the front with the other axes in order" in "\n".join(trace)


# -- SequenceAt ∘ SplitToSequence -----------------------------------------------------------

def split_to_sequence(split: str = ", sizes", attrs: str = "axis = 1", positions=(0, 1, 2),
                      sizes: str = "{2, 3, 2}", opset: int = 17) -> str:
    outputs = ", ".join(f"float[?, ?] y{i}" for i in range(len(positions)))
    picks = "\n".join(f"        i{k} = Constant <value = int64 {{{p}}}> ()\n"
                      f"        y{k} = SequenceAt(seq, i{k})" for k, p in enumerate(positions))
    return header(opset) + f"""
    g (float[2, 7] x) => ({outputs}) {{
        sizes = Constant <value = int64[3] {sizes}> ()
        seq = SplitToSequence <{attrs}> (x{split})
{picks}
    }}"""


def test_pieces_of_a_split_sequence_become_slices():
    model, stats, _ = run(split_to_sequence(), "SimplifySlicing")
    assert stats == {"SequenceAtOfSplit": 3}
    assert ops(model) == ["Slice", "Slice", "Slice"]
    assert [ints(n.inputs[1]) + ints(n.inputs[2]) for n in model.graph] == [[0, 2], [2, 5], [5, 7]]


@pytest.mark.parametrize("opset", [11, 13])
def test_pieces_of_one_are_squeezed_when_keepdims_is_0(opset):
    text = split_to_sequence(split="", attrs="axis = -1, keepdims = 0", positions=(0, -1),
                             opset=opset).replace("float[?, ?] y", "float[?] y")
    model, stats, _ = run(text, "SimplifySlicing")
    assert stats == {"SequenceAtOfSplit": 2}
    assert ops(model) == ["Slice", "Squeeze", "Slice", "Squeeze"]


def test_scalar_split_size_makes_a_short_last_piece():
    text = split_to_sequence(positions=(2,)).replace(
        "sizes = Constant <value = int64[3] {2, 3, 2}> ()", "sizes = Constant <value = int64 {3}> ()")
    model, stats, _ = run(text, "SimplifySlicing")
    assert stats == {"SequenceAtOfSplit": 1}
    assert ints(node(model, "Slice").inputs[1]) + ints(node(model, "Slice").inputs[2]) == [6, 7]


def test_position_read_at_run_time_is_refused():
    text = header() + """
    g (float[2, 7] x, int64 i) => (float[?, ?] y) {
        seq = SplitToSequence <axis = 1> (x)
        y = SequenceAt(seq, i)
    }"""
    proto = onnx.parser.parse_model(text)
    model = load_onnx(proto)
    infer_shapes(model)
    ctx = PassContext(Options(), tracer=Tracer({"SequenceAtOfSplit"}))
    assert not PASSES["SimplifySlicing"]().run(model, ctx).changed
    assert "not a constant scalar" in "\n".join(ctx.tracer.report())


# -- GatherND reading its input in order ----------------------------------------------------

def gather_nd(indices: str, index_shape: str, data: str = "bool[1, 5]",
              out: str = "bool[?, ?, ?, ?]", attrs: str = "") -> str:
    """GatherND of a mask by constant index tuples, as dynamo writes torch's mask[:, None, None, :]."""
    return header() + f"""
    g ({data} m) => ({out} y) {{
        i = Constant <value = int64{index_shape} {{{indices}}}> ()
        y = GatherND {attrs}(m, i)
    }}"""


IN_ORDER = "0, 0, 0, 1, 0, 2, 0, 3, 0, 4"


def test_gather_nd_reading_in_order_becomes_a_reshape():
    model, stats, _ = run(gather_nd(IN_ORDER, "[1, 1, 1, 5, 2]"), "SimplifySlicing")
    assert stats == {"GatherNDInOrder": 1} and ops(model) == ["Reshape"]
    assert ints(node(model, "Reshape").inputs[1]) == [1, 1, 1, 5]


def test_gather_nd_of_leading_dims_keeps_the_trailing_ones():
    # Tuples of 1 over [3, 4]: rows 0, 1, 2 (the last one spelled -1) under a [3, 1] layout.
    text = gather_nd("0, 1, -1", "[3, 1, 1]", data="float[3, 4]", out="float[?, ?, ?]")
    model, stats, _ = run(text, "SimplifySlicing")
    assert stats == {"GatherNDInOrder": 1}
    assert ints(node(model, "Reshape").inputs[1]) == [3, 1, 4]


@pytest.mark.parametrize("indices, index_shape, attrs, reason", [
    ("0, 0, 0, 2, 0, 1, 0, 3, 0, 4", "[1, 5, 2]", "", "not read the positions in order"),
    ("0, 0, 0, 1, 0, 2, 0, 3, 0, 3", "[1, 5, 2]", "", "not read the positions in order"),
    ("0, 0, 0, 1, 0, 2, 0, 3", "[1, 4, 2]", "", "pick each of the 5 positions once"),
    ("0, 1, 2, 3, 4", "[1, 5, 1]", "<batch_dims = 1> ", "batch_dims is 1"),
])
def test_gather_nd_refused(indices, index_shape, attrs, reason):
    text = gather_nd(indices, index_shape, attrs=attrs)
    model, stats, trace = run(text, "SimplifySlicing", trace="GatherNDInOrder")
    assert stats == {} and ops(model) == ["GatherND"]
    assert any(reason in line for line in trace), trace


def test_gather_nd_of_an_empty_tensor_is_left_alone():
    # Reshape's target would hold a 0, which it reads as "copy the input's dim".
    text = header() + """
    g (float[4, 0] m) => (float[?] y) {
        i = Constant <value = int64[0, 2] {}> ()
        y = GatherND (m, i)
    }"""
    model, stats, trace = run(text, "SimplifySlicing", trace="GatherNDInOrder")
    assert stats == {} and any("are empty" in line for line in trace), trace


def test_gather_nd_of_an_unknown_shape_is_refused():
    text = gather_nd(IN_ORDER, "[1, 5, 2]", data="bool[1, N]")
    model, stats, trace = run(text, "SimplifySlicing", dims={"N": 5}, trace="GatherNDInOrder")
    assert stats == {} and any("is not known" in line for line in trace), trace


# -- names ----------------------------------------------------------------------------------

def test_rules_can_be_switched_off_by_name():
    proto = onnx.parser.parse_model(concat_of_split())
    model = load_onnx(proto)
    infer_shapes(model)
    ctx = PassContext(Options(disabled_passes={"ConcatOfSplit", "TransposeOfTranspose"}))
    PassManager(Pipeline("t", "", ("ConstantToInitializer", "SimplifySlicing")), ctx).run(model)
    assert "Split" in ops(model)


# -- Reshape/Transpose chains that split and merge axes ---------------------------------------

# nn.MultiheadAttention's head split, sequence-first: q [S,B,8] → [S, B·2, 4] with the target
# read from q's own shape at run time, heads to the front, then split to [B,2,S,4]; FuseAttention
# then merges the heads back ([B,S,2,4] → [B,S,8]).
SEQUENCE_FIRST_SPLIT = """
        s = Shape(x)
        s0 = Gather <axis = 0> (s, zero)
        seq = Unsqueeze(s0, zero1)
        s1 = Gather <axis = 0> (s, one)
        batch = Unsqueeze(s1, zero1)
        heads = Mul(batch, two)
        t1 = Concat <axis = 0> ({seq_piece}, heads, four)
        v1 = Reshape(x, t1)
        u1 = Transpose <perm = [1, 0, 2]> (v1)
        t2 = Concat <axis = 0> (batch, two, {seq_piece}, four)
        v2 = Reshape(u1, t2)
"""
CHAIN_CONSTANTS = """
        zero = Constant <value = int64 {0}> ()
        one = Constant <value = int64 {1}> ()
        zero1 = Constant <value_ints = [0]> ()
        two = Constant <value_ints = [2]> ()
        four = Constant <value_ints = [4]> ()
        ten = Constant <value_ints = [10]> ()
        merged = Constant <value_ints = [0, 0, 8]> ()
"""


def sequence_first_chain(seq_piece: str = "seq", x_type: str = "float[S, B, 8]") -> str:
    return header() + f"""
    g ({x_type} x) => (float[?, ?, 8] y) {{
        {CHAIN_CONSTANTS}
        {SEQUENCE_FIRST_SPLIT.format(seq_piece=seq_piece)}
        u2 = Transpose <perm = [0, 2, 1, 3]> (v2)
        m = Reshape(u2, merged)
        y = Relu(m)
    }}"""


@pytest.mark.parametrize("dims", [{"S": 5, "B": 3}, {"S": 1, "B": 1}, {"S": 7, "B": 2}])
def test_sequence_first_head_split_and_merge_is_one_transpose(dims):
    """Five layout nodes whose shapes are read at run time: the split/merge is proven from
    the symbolic dims, and all that is left is [S,B,8] → [B,S,8]."""
    model, stats, _ = run(sequence_first_chain(), "SimplifyLayout", dims=dims)
    assert stats == {"ReshapeChain": 1}
    assert ops(model) == ["Transpose", "Relu"]
    transpose = node(model, "Transpose")
    assert transpose.inputs[0].name == "x" and transpose.attr("perm") == [1, 0, 2]


def test_a_number_a_reshape_proves_stands_for_the_name():
    """A TorchScript trace bakes the sequence (10) into the key's Reshape of [S, B, 8]: the
    Reshape only runs where S is 10, so the chain is still one Transpose."""
    model, stats, _ = run(sequence_first_chain("ten"), "SimplifyLayout",
                          dims={"S": 10, "B": 3})
    assert stats == {"ReshapeChain": 1} and ops(model) == ["Transpose", "Relu"]
    assert node(model, "Transpose").output.shape == ("B", 10, 8)


def test_head_merge_after_the_fused_attention_keeps_a_transpose_and_the_last_reshape():
    """MultiHeadAttention's [B,S,8] → [B,S,2,4] → (S,B,2,4) → [S·B, 8] for the output
    projection: Transpose [S,B,8], then the chain's own [-1, 8]."""
    model, stats, _ = run(header() + """
    g (float[B, S, 8] x) => (float[?, 8] y) {
        split = Constant <value_ints = [0, 0, 2, 4]> ()
        rows = Constant <value_ints = [-1, 8]> ()
        h = Reshape(x, split)
        t = Transpose <perm = [1, 0, 2, 3]> (h)
        y = Reshape(t, rows)
    }""", "SimplifyLayout", dims={"S": 5, "B": 3})
    assert stats == {"ReshapeChain": 1} and ops(model) == ["Transpose", "Reshape"]
    assert node(model, "Transpose").attr("perm") == [1, 0, 2]
    assert ints(node(model, "Reshape").inputs[1]) == [-1, 8]
    assert model.graph.outputs[0].name == "y"


def test_reshapes_back_to_the_input_dims_vanish():
    """The padding mask's [B,2,1,S] → [B·2, 1, S] → [B, 2, -1, S]: x itself."""
    model, stats, _ = run(header() + """
    g (float[B, 2, 1, S] x) => (float[B, 2, 1, S] y) {
        s = Shape(x)
        c0 = Constant <value_ints = [0]> ()
        c1 = Constant <value_ints = [1]> ()
        c2 = Constant <value_ints = [2]> ()
        c3 = Constant <value_ints = [3]> ()
        c4 = Constant <value_ints = [4]> ()
        c2m = Constant <value_ints = [2, -1]> ()
        b = Slice(s, c0, c1)
        n = Slice(s, c3, c4)
        rows = Mul(b, c2)
        t1 = Concat <axis = 0> (rows, c1, n)
        r1 = Reshape <allowzero = 1> (x, t1)
        t2 = Concat <axis = 0> (b, c2m, n)
        r2 = Reshape(r1, t2)
        y = Relu(r2)
    }""", "SimplifyLayout", dims={"S": 5, "B": 3})
    assert stats == {"ReshapeChain": 1} and ops(model) == ["Relu"]
    assert node(model, "Relu").inputs[0].name == "x"


def test_bert_head_split_is_already_as_short_as_it_gets():
    model, stats, trace = run(header() + """
    g (float[B, S, 8] x) => (float[?, ?, ?, ?] y) {
        split = Constant <value_ints = [0, 0, 2, 4]> ()
        h = Reshape(x, split)
        t = Transpose <perm = [0, 2, 1, 3]> (h)
        y = Relu(t)
    }""", "SimplifyLayout", dims={"S": 5, "B": 3}, trace="TransposeChain")
    assert stats == {} and ops(model) == ["Reshape", "Transpose", "Relu"]
    assert any("no single node can replace" in line for line in trace), trace


def test_dims_under_other_names_are_not_proven_equal():
    """The chain reads the sequence from another input z, whose dim is named T, not S: the
    Reshape of [S, B, 8] to [T, B·2, 4] is not proven a split."""
    text = header() + f"""
    g (float[S, B, 8] x, float[T] z) => (float[?, ?, 8] y) {{
        {CHAIN_CONSTANTS}
        seqz = Shape(z)
        {SEQUENCE_FIRST_SPLIT.format(seq_piece="seqz")}
        u2 = Transpose <perm = [0, 2, 1, 3]> (v2)
        m = Reshape(u2, merged)
        y = Relu(m)
    }}"""
    model, stats, trace = run(text, "SimplifyLayout", dims={"S": 5, "B": 3, "T": 5},
                              trace="ReshapeChain")
    assert stats == {} and ops(model).count("Reshape") == 3
    assert any("element counts not proven equal" in line for line in trace), trace


def test_a_chain_value_read_elsewhere_ends_the_chain_there():
    """u1 is also an output: the chain starts after it, at a value whose first dim ONNX
    inference leaves unnamed (unk__0), so the split of it into [B, 2] is not proven."""
    text = sequence_first_chain().replace("y = Relu(m)", "y = Relu(m)\n        w = Relu(u1)")
    text = text.replace("=> (float[?, ?, 8] y)", "=> (float[?, ?, 8] y, float[?, ?, 4] w)")
    model, stats, trace = run(text, "SimplifyLayout", dims={"S": 5, "B": 3},
                              trace="ReshapeChain")
    assert stats == {} and ops(model).count("Transpose") == 2
    assert any("matched 3 pattern node(s)" in line and "not proven equal" in line
               for line in trace), trace


@pytest.mark.parametrize("last", [16, -1])
def test_a_run_time_target_holding_a_zero_is_not_reused_on_another_input(last):
    """A target built at run time, Concat([0], 4·T, [16]), copies dim 0 of its own Reshape's
    input (B·S here). Reused for a new Reshape of x's transposed dims, its 0 would copy B:
    onnxruntime refused the result, or (with -1 last) it ran with the wrong shape."""
    model, _, _ = run(header() + f"""
        g (float[T, B, S, 64] x) => (float[?, ?, 16] y)
        <int64[4] c1 = {{0, -1, 4, 16}}, int64 zi = {{0}}, int64[1] ax = {{0}},
         int64[1] four = {{4}}, int64[1] zero = {{0}}, int64[1] end = {{{last}}}> {{
            r1 = Reshape (x, c1)
            t1 = Transpose <perm = [1, 0, 2, 3]> (r1)
            s = Shape (x)
            tt = Gather <axis = 0> (s, zi)
            tu = Unsqueeze (tt, ax)
            t4 = Mul (tu, four)
            tgt = Concat <axis = 0> (zero, t4, end)
            r3 = Reshape (t1, tgt)
            y = Relu (r3)
        }}""",
                      "SimplifyLayout", dims={"T": 3, "B": 2, "S": 5})
    assert ops(model).count("Reshape") == 2  # the chain stays: no target it could reuse
