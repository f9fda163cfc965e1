"""Weight pre-packing: which CPU partitions skip it (prepacking.py), the manifest field that
records it, and the runtime's session option."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import onnxruntime as ort
import pytest

import graphopt
from graphopt.codegen import OmPartition, load_om, write_om
from graphopt.codegen import partition_sessions
from graphopt.codegen.prepacking import prepacking_pays
from graphopt.ir import load_onnx
from tests.helpers import conv_classifier, parse_model

RNG = np.random.default_rng(3)


def weight(*shape: int, dtype=np.float32) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.1).astype(dtype)


def pays(text: str, **weights) -> bool:
    return prepacking_pays(load_onnx(parse_model(text, **weights)))


@pytest.mark.parametrize("rows, expected", [(1, False), (2, True), ("N", True)])
def test_a_gemm_packs_unless_it_has_one_row(rows, expected):
    text = f"g (float[{rows},64] x) => (float[{rows},32] y) {{ y = MatMul (x, w) }}"
    assert pays(text, w=weight(64, 32)) is expected


def test_gemm_rows_follow_trans_a():
    one_row = "g (float[64,1] x) => (float[1,32] y) { y = Gemm <transA = 1, transB = 1> (x, w) }"
    assert pays(one_row, w=weight(32, 64)) is False
    four_rows = "g (float[64,4] x) => (float[4,32] y) { y = Gemm <transA = 1> (x, w) }"
    assert pays(four_rows, w=weight(64, 32)) is True


def test_batched_matmul_rows_are_all_leading_dims():
    text = "g (float[1,3,64] x) => (float[1,3,32] y) { y = MatMul (x, w) }"
    assert pays(text, w=weight(64, 32)) is True  # 3 rows


def test_a_weight_computed_from_constants_counts_as_one():
    # onnxruntime folds Transpose(w) into an initializer at load and packs it.
    text = """g (float[4,64] x) => (float[4,32] y) {
        t = Transpose (w)
        y = MatMul (x, t)
    }"""
    assert pays(text, w=weight(32, 64)) is True


def test_gemms_of_two_activations_pack_nothing():
    # Attention-style Q·Kᵀ: nothing is known at load, so nothing decides either way.
    text = """g (float[8,64] q, float[64,8] k) => (float[8,8] y) { y = MatMul (q, k) }"""
    assert pays(text) is True  # nothing to pack: the default stays
    with_fc = """g (float[8,64] q, float[64,8] k, float[1,8] x) => (float[8,8] y, float[1,4] z) {
        y = MatMul (q, k)
        z = MatMul (x, w)
    }"""
    assert pays(with_fc, w=weight(8, 4)) is False


def test_a_deep_activation_chain_does_not_recurse():
    relus = "\n".join(f"a{i + 1} = Relu (a{i})" for i in range(3000))
    text = f"""g (float[8,64] a0, float[64,8] k) => (float[8,8] y) {{
        {relus}
        y = MatMul (a3000, k)
    }}"""
    assert pays(text) is True


def test_fp32_convolutions_do_not_need_packing():
    text = """g (float[4,8,16,16] x) => (float[4,8,16,16] y) {
        y = Conv <pads = [1,1,1,1]> (x, w)
    }"""
    assert pays(text, w=weight(8, 8, 3, 3)) is False


@pytest.mark.parametrize("text, weights", [
    ("""g (float[1,8,16,16] x) => (float[1,8,16,16] y) {
            d = DequantizeLinear (q, s, z)
            y = Conv <pads = [1,1,1,1]> (x, d)
        }""", dict(q=np.ones((8, 8, 3, 3), np.int8), s=np.float32(0.1), z=np.int8(0))),
    ("""g (float16[1,64] x) => (float16[1,32] y) { y = MatMul (x, w) }""",
     dict(w=weight(64, 32, dtype=np.float16))),
    ("""g (float[1,64] x) => (float[1,32] y) {
            y = Custom.Op (x, w)
            }""", dict(w=weight(64, 32))),
])
def test_kernels_that_gain_from_packing_keep_it(text, weights):
    header = '<ir_version: 8, opset_import: ["" : 17, "Custom" : 1]>\n'
    assert prepacking_pays(load_onnx(parse_model(text, header=header, **weights))) is True


def test_matmul_nbits_keeps_packing():
    text = """g (float[1,64] x) => (float[1,32] y) {
        y = com.microsoft.MatMulNBits <K = 64, N = 32, bits = 4, block_size = 32> (x, b, s)
    }"""
    header = '<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n'
    model = parse_model(text, header=header, b=np.zeros((32, 2, 16), np.uint8),
                        s=np.ones(64, np.float32))
    assert prepacking_pays(load_onnx(model)) is True


def _manifest_parts(path) -> list[dict]:
    with zipfile.ZipFile(path) as zf:
        return json.loads(zf.read("manifest.json"))["partitions"]


def _disabled(session: graphopt.OmSession) -> list[str]:
    """Each partition session's session.disable_prepacking entry ("-": none)."""
    entries = []
    for step in session._steps:
        options = step.session.get_session_options()
        try:
            entries.append(options.get_session_config_entry("session.disable_prepacking"))
        except Exception:  # noqa: BLE001 - onnxruntime raises its own type for a missing key
            entries.append("-")
    return entries


@pytest.fixture(scope="module")
def batch1_om(tmp_path_factory):
    model = conv_classifier("", "float[1,64] scores")
    path = tmp_path_factory.mktemp("prepack") / "b1.om"
    graphopt.save(graphopt.optimize(model, target="cpu"), path)
    return model, path


def test_a_batch1_classifier_runs_unpacked_with_the_same_outputs(batch1_om):
    model, path = batch1_om
    assert [p.get("prepack_weights") for p in _manifest_parts(path)] == [False]
    session = graphopt.load(path)
    assert _disabled(session) == ["1"]

    x = np.random.default_rng(0).standard_normal((1, 8, 32, 32)).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    reference = ort.InferenceSession(model.SerializeToString(), options,
                                     providers=["CPUExecutionProvider"])
    (expected,) = reference.run(None, {"x": x})
    np.testing.assert_allclose(session.run({"x": x})["scores"], expected, rtol=1e-5, atol=1e-5)


def test_the_callers_session_config_wins(batch1_om):
    _, path = batch1_om
    session = graphopt.load(path, session_config={"session.disable_prepacking": "0"})
    assert _disabled(session) == ["0"]


def test_only_where_unpacked_runs_were_measured(batch1_om, monkeypatch):
    _, path = batch1_om
    monkeypatch.setattr(partition_sessions, "_UNPACKED_MEASURED", False)
    assert _disabled(graphopt.load(path)) == ["-"]


@pytest.mark.parametrize("batch", [4, "N"])
def test_larger_or_unknown_batches_keep_packing(tmp_path, batch):
    model = conv_classifier("", f"float[{batch},64] scores", batch=batch)
    path = tmp_path / "b.om"
    graphopt.save(graphopt.optimize(model, target="cpu"), path)
    assert ["prepack_weights" in p for p in _manifest_parts(path)] == [False]
    assert _disabled(graphopt.load(path)) == ["-"]


def test_npu_partitions_leave_it_to_their_provider(tmp_path):
    model = conv_classifier("", "float[1,64] scores")
    path = tmp_path / "npu.om"
    graphopt.save(graphopt.optimize(model, target="ascend310"), path)
    assert all("prepack_weights" not in p for p in _manifest_parts(path))


def test_a_portable_compile_decides_too(tmp_path):
    path = tmp_path / "portable.om"
    graphopt.save(graphopt.optimize(conv_classifier("", "float[1,64] scores")), path)
    assert [p.get("prepack_weights") for p in _manifest_parts(path)] == [False]


def test_the_field_round_trips_and_is_type_checked(tmp_path, batch1_om):
    _, path = batch1_om
    part = load_om(path).partitions[0]
    assert part.prepack_weights is False
    copy = tmp_path / "copy.om"
    write_om(copy, [part])
    assert load_om(copy).partitions[0].prepack_weights is False
    with pytest.raises(ValueError, match="prepack_weights must be True or False"):
        OmPartition("p0", "cpu", part.model, prepack_weights="no")


def test_each_shape_profile_decides_for_its_own_batch(tmp_path):
    model = conv_classifier("", "float[N,64] scores", batch="N")
    path = tmp_path / "profiles.om"
    graphopt.save(graphopt.optimize(model, target="cpu", dynamic_dims="N:1,4"), path)
    flags = {p["name"]: p.get("prepack_weights", True) for p in _manifest_parts(path)}
    assert flags == {"profile0.p0_cpu": False, "profile1.p0_cpu": True}  # N=1, N=4
    session = graphopt.load(path)
    x = np.random.default_rng(1).standard_normal((1, 8, 32, 32)).astype(np.float32)
    assert session.run({"x": x})["scores"].shape == (1, 64)


MLP = """g (float[1,256] x) => (float[1,256] y) {
    a = Gemm <transB = 1> (x, w1)
    r = Relu (a)
    y = Gemm <transB = 1> (r, w2)
}"""


def test_small_one_row_gemms_pack_where_the_cpu_has_avx512():
    # An MLP of small one-row GEMMs ran 1.17x as long unpacked on an AVX-512 CPU.
    from graphopt.passes.infer_shapes import infer_shapes

    model = load_onnx(parse_model(MLP, w1=weight(256, 256), w2=weight(256, 256)))
    infer_shapes(model)
    assert prepacking_pays(model) is False
    assert prepacking_pays(model, wide_vectors=True) is True


def test_a_classifier_head_among_convolutions_still_skips_packing_with_avx512():
    text = """g (float[1,16,32,32] x) => (float[1,10] y) {
        c = Conv <pads = [1,1,1,1]> (x, w)
        p = GlobalAveragePool (c)
        f = Flatten (p)
        y = Gemm <transB = 1> (f, fc)
    }"""
    from graphopt.passes.infer_shapes import infer_shapes

    model = load_onnx(parse_model(text, w=weight(64, 16, 3, 3), fc=weight(10, 64)))
    infer_shapes(model)
    assert prepacking_pays(model, wide_vectors=True) is False
