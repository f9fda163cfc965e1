"""The shortcuts agree with what they shortcut: scalar constant tests against numpy's, reused
node counts against fresh ones, the runtime's exact-feeds check against its general one."""

from __future__ import annotations

import numpy as np
from helpers import parse_model
from hypothesis import given, settings
from hypothesis import strategies as st

from graphopt.ir import Value, load_onnx
from graphopt.ir.pattern import Const, _const_ok
from graphopt.ir.tensor import Tensor
from graphopt.passes import Options, PassContext, PassManager
from graphopt.passes.instruments import Instrument
from graphopt.passes.noops import _all_equal
from graphopt.passes.pipelines import FixedPoint, Pipeline

DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8, np.bool_]
SPECIAL = [0.0, -0.0, 1.0, 0.5, 1e-7, 1 + 1e-4, 1 + 1e-2, np.inf, -np.inf, np.nan, 1e30, -3.0]
numbers = st.one_of(st.sampled_from(SPECIAL), st.floats(allow_nan=True, width=64),
                    st.integers(-300, 300).map(float))


@settings(max_examples=400, deadline=None)
@given(data=numbers, literal=st.sampled_from(SPECIAL + [2.0, 0.7071, 1.4142]),
       dtype=st.sampled_from(DTYPES), rank=st.sampled_from([0, 1]))
def test_scalar_constant_test_agrees_with_isclose(data, literal, dtype, rank):
    # The rule: an integer constant equals the literal; a float one is within 4 ulps of its
    # own type of the literal rounded to that type.
    with np.errstate(all="ignore"):
        array = np.array(data).astype(dtype).reshape((1,) * rank)
        if np.dtype(dtype).kind == "f":
            rounded = np.array(literal).astype(dtype)
            expected = bool(np.isclose(array, rounded, rtol=4 * np.finfo(dtype).eps, atol=0))
        else:
            expected = bool(array.astype(np.float64) == literal)
    assert _const_ok(Const(literal), array) == expected


@settings(max_examples=300, deadline=None)
@given(data=numbers, scalar=st.sampled_from([0, 1]), dtype=st.sampled_from(DTYPES),
       rank=st.sampled_from([0, 1, 2]))
def test_neutral_element_test_agrees_with_numpy(data, scalar, dtype, rank):
    with np.errstate(all="ignore"):
        array = np.array(data).astype(dtype).reshape((1,) * rank)
    value = Value("c", const=Tensor(array))
    assert _all_equal(value, scalar) == bool(np.all(array == scalar))


class _DropLastRelu(Instrument):
    """Edits the model between passes, as an instrument may."""

    def after_pass(self, model, record, log) -> None:
        relus = [n for n in model.graph if n.op_type == "Relu"]
        if len(relus) > 1:
            last = relus[-1]
            last.output.replace_all_uses_with(last.inputs[0])
            model.graph.remove(last)


def test_node_counts_reused_between_passes_match_fresh_counts():
    model = load_onnx(parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2] x) => (float[2] y) {
            a = Relu(x)
            b = Relu(a)
            c = Identity(b)
            d = Relu(c)
            y = Add(d, d)
        }""", header=""))
    steps = (FixedPoint(("EliminateIdentity", "EliminateDeadNodes")), "EliminateDeadNodes")
    log = PassManager(Pipeline("t", "", steps), PassContext(Options())).run(model)
    assert [r.nodes_before for r in log.records[1:]] == [r.nodes_after for r in log.records[:-1]]
    assert log.records[-1].nodes_after == model.graph.count_nodes() == 4

    model = load_onnx(parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2] x) => (float[2] y) {
            a = Relu(x)
            b = Relu(a)
            y = Add(b, b)
        }""", header=""))
    log = PassManager(Pipeline("t", "", ("EliminateDeadNodes", "EliminateDeadNodes")),
                      PassContext(Options()), [_DropLastRelu()]).run(model)
    assert [(r.nodes_before, r.nodes_after) for r in log.records] == [(3, 3), (2, 2)]


FEED_VARIANTS = {
    "exact": lambda x: {"x": x},
    "float64": lambda x: {"x": x.astype(np.float64)},
    "shape": lambda x: {"x": x[:1]},
    "list": lambda x: {"x": x.tolist()},
    "non-contiguous": lambda x: {"x": np.asfortranarray(x)},
    "extra": lambda x: {"x": x, "y": x},
    "missing": lambda x: {},
    "mapping": lambda x: __import__("types").MappingProxyType({"x": x}),
}


def test_exact_feeds_shortcut_agrees_with_the_general_checks(tmp_path):
    # OmSession.run skips its general feed checks (and, for one partition, its general
    # path) for feeds that match a static signature exactly; any other feeds must meet the
    # same result or the same error either way.
    proto = parse_model("g (float[2,4] x) => (float[2,4] y) { y = Relu(x) }")
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 4
    for name, make in FEED_VARIANTS.items():
        fast, slow = _fast_and_slow(proto, tmp_path, make(x))
        assert fast == slow, name


def _fast_and_slow(proto, tmp_path, feeds) -> list:
    """What run(feeds) gives (outputs as lists, or the error's text) on an artifact of `proto`
    with the plain-feeds shortcut, and on one without it."""
    import graphopt
    from graphopt.errors import GraphoptError

    path = tmp_path / "m.om"
    if not path.exists():
        graphopt.save(graphopt.optimize(proto, target="cpu"), path)
    fast, slow = graphopt.load(path), graphopt.load(path)
    slow._plain = slow._direct = None
    assert fast._plain is not None and fast._direct is not None
    outcomes = []
    for session in (fast, slow):
        try:
            outcomes.append({k: v.tolist() for k, v in session.run(feeds).items()})
        except GraphoptError as exc:
            outcomes.append(str(exc))
    return outcomes


OPEN_FEED_VARIANTS = {
    "plain": lambda x, y: {"x": x, "y": y},
    "other sizes": lambda x, y: {"x": x[:1], "y": y[:1, :2]},
    "empty batch": lambda x, y: {"x": x[:0], "y": y[:0]},
    "batch disagrees": lambda x, y: {"x": x[:1], "y": y},
    "numbered dim": lambda x, y: {"x": x[:, :3], "y": y},
    "rank": lambda x, y: {"x": x[None], "y": y},
    "dtype": lambda x, y: {"x": x, "y": y.astype(np.float64)},
    "list": lambda x, y: {"x": x.tolist(), "y": y},  # taken as float32, as onnxruntime does
    "missing": lambda x, y: {"x": x},
    "extra": lambda x, y: {"x": x, "y": y, "z": y},
}


def test_plain_feeds_shortcut_at_open_dims_agrees_with_the_general_checks(tmp_path):
    # At symbolic dims, the shortcut checks rank, numbered dims and the dims two inputs name
    # alike; whatever it lets through or sends on must meet what the general checks decide.
    proto = parse_model("""
        g (float[N,4] x, float[N,M] y) => (float[N,4] s, float[N,M] t) {
            s = Relu(x)
            t = Neg(y)
        }""")
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 4
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    refused = {"batch disagrees", "numbered dim", "rank", "dtype", "missing", "extra"}
    for name, make in OPEN_FEED_VARIANTS.items():
        fast, slow = _fast_and_slow(proto, tmp_path, make(x, y))
        assert fast == slow, name
        assert isinstance(fast, str) == (name in refused), name


STRING_FEED_VARIANTS = {
    "str objects": lambda x: {"x": x},
    "numpy str": lambda x: {"x": x.astype(str)},  # converted, as the general checks do
    "np.str_ elements": lambda x: {"x": np.array([np.str_(s) for s in x.flat], object)},
    "bytes element": lambda x: {"x": np.array([b"a", "b", "c"], object)},
    "int element": lambda x: {"x": np.array(["a", 7, "c"], object)},
    "None element": lambda x: {"x": np.array(["a", None, "c"], object)},
    "rank": lambda x: {"x": x[None]},
}


def test_plain_feeds_shortcut_takes_strings_and_refuses_what_the_general_checks_do(tmp_path):
    # String signatures had no shortcut (an .om of a scikit-learn LabelEncoder ran 1.4x the
    # original's time at 16 rows); onnxruntime turns any object into its text (b'a' into
    # "b'a'"), so the shortcut must send every non-str element on to the general refusal.
    proto = parse_model("g (string[N] x) => (string[N] y) { y = Identity(x) }")
    x = np.array(["a", "b", "c"], object)
    refused = {"bytes element", "int element", "None element", "rank"}
    for name, make in STRING_FEED_VARIANTS.items():
        fast, slow = _fast_and_slow(proto, tmp_path, make(x))
        assert fast == slow, name
        assert isinstance(fast, str) == (name in refused), (name, fast)
