"""accuracy_report: cosine, top-1 agreement and perplexity change per output kind."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest
from helpers import parse_model, write_calibration

from graphopt import numerics, zoo
from graphopt.quant.probe import int8_gemm_saturates
from graphopt.tools.accuracy import accuracy_report, perplexity

RNG = np.random.default_rng(0)
CLASSIFIER = "g (float[4,8] x) => (float[4,5] y) { y = MatMul(x, w) }"
LM = """
g (int64[1,6] input_ids) => (float[1,6,7] logits) {
  logits = Gather(table, input_ids)
}"""


def test_identical_models_agree_fully():
    proto = parse_model(CLASSIFIER, w=RNG.standard_normal((8, 5)).astype(np.float32))
    report = accuracy_report(proto, proto)
    (out,) = report.outputs
    assert (out.kind, out.cosine, out.top1, out.perplexity) == ("classifier", 1.0, 1.0, None)
    assert report.inputs == "seeded random (seed 0)"


def test_top1_agreement_counts_rows_whose_argmax_matches():
    w = RNG.standard_normal((8, 5)).astype(np.float32)
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    moved = w.copy()
    moved[:, :] = w[:, [1, 0, 2, 3, 4]]  # classes 0 and 1 swap
    ref, cand = parse_model(CLASSIFIER, w=w), parse_model(CLASSIFIER, w=moved)
    expected = np.mean((x @ w).argmax(-1) == (x @ moved).argmax(-1))
    (out,) = accuracy_report(ref, cand, {"x": x}).outputs
    assert out.top1 == expected < 1.0
    assert out.cosine < 1.0


# A detector's head: 4 box channels in pixels, 2 class-score channels of ~0.01.
DETECTOR = """
g (float[1,3,16] x) => (float[1,6,16] out) {
  out = Conv(x, w)
}"""


def test_a_detector_channel_the_whole_tensor_cosine_hides_is_named():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((6, 3, 1)).astype(np.float32)
    w[:4] *= 300.0   # box coordinates
    w[4:] *= 0.01    # class scores
    x = {"x": rng.standard_normal((1, 3, 16)).astype(np.float32)}
    noisy = w.copy()
    noisy[5] = w[5] + rng.standard_normal((3, 1)).astype(np.float32) * 0.01
    report = accuracy_report(parse_model(DETECTOR, w=w), parse_model(DETECTOR, w=noisy), x)
    (out,) = report.outputs
    cosine, index = out.worst_slice
    assert out.cosine > 0.9999 and cosine < 0.99 and index == 5
    assert "worst slice" in report.format() and "at [:,5]" in report.format()
    (warning,) = report.warnings
    assert warning.startswith(f"out: cosine {out.cosine:.6f} over the whole tensor but "
                              f"{cosine:.6f} over [:,5] alone")

    # Noise in proportion to every channel: the slices agree as the whole does, no warning.
    even = w * (1 + rng.standard_normal(w.shape).astype(np.float32) * 0.01)
    report = accuracy_report(parse_model(DETECTOR, w=w), parse_model(DETECTOR, w=even), x)
    assert report.warnings == [] and report.outputs[0].worst_slice[0] > 0.99


def test_a_box_far_off_shows_in_the_largest_error_that_the_cosine_hides():
    # One box coordinate 90 px off among hundreds of pixels reads a cosine near 1; the
    # max |error| column gives the 90 beside the largest coordinate.
    rng = np.random.default_rng(7)
    w = rng.standard_normal((6, 3, 1)).astype(np.float32) * 300.0
    x = {"x": np.abs(rng.standard_normal((1, 3, 16))).astype(np.float32) + 1.0}
    ref = parse_model(DETECTOR, w=w)
    out = numerics.run(ref, x)["out"]
    bias = np.zeros((1, 6, 16), np.float32)
    bias[0, 2, 9] = 90.0
    cand = parse_model("""
    g (float[1,3,16] x) => (float[1,6,16] out) {
      conv = Conv(x, w)
      out = Add(conv, b)
    }""", w=w, b=bias)
    report = accuracy_report(ref, cand, x)
    (row,) = report.outputs
    assert row.cosine > 0.999
    error, largest = row.max_error
    assert error == pytest.approx(90.0, rel=1e-5) and largest == float(np.abs(out).max())
    assert "max |error|" in report.format() and f"{error:.3g} of {largest:.3g}" in report.format()


def test_the_largest_error_is_every_samples_largest():
    from graphopt.tools.accuracy import AccuracyReport, OutputAccuracy, _worst_of

    def report(cosine, error):
        return AccuracyReport("a.onnx", "b.om", "c.npz", outputs=[OutputAccuracy(
            "out", (1, 6), "tensor", cosine, max_error=error)])

    merged = _worst_of([report(0.999, (4.0, 10.0)), report(0.99, (0.5, 12.0))])
    assert merged.outputs[0].sample == 2 and merged.outputs[0].max_error == (4.0, 12.0)


def test_the_worst_slice_is_every_samples_worst():
    # A YOLO head's row came from the sample of the lowest whole cosine, whose worst score
    # channel read 0.87, while another sample's read 0.35 (its warning said so, the table not).
    from graphopt.tools.accuracy import AccuracyReport, OutputAccuracy, _worst_of

    def report(cosine, worst):
        return AccuracyReport("a.onnx", "b.om", "c.npz", outputs=[OutputAccuracy(
            "out", (1, 6, 16), "tensor", cosine, worst_slice=worst)])

    merged = _worst_of([report(0.99, (0.35, 7)), report(0.98, (0.87, 7)), report(0.995, None)])
    (row,) = merged.outputs
    assert row.cosine == 0.98 and row.sample == 2
    assert row.worst_slice == (0.35, 7) and row.slice_sample == 1
    assert "0.350000 at [:,7] (sample 1)" in merged.format()


def test_outputs_below_rank_3_have_no_slice_column():
    proto = parse_model(CLASSIFIER, w=RNG.standard_normal((8, 5)).astype(np.float32))
    report = accuracy_report(proto, proto)
    assert report.outputs[0].worst_slice is None and "worst slice" not in report.format()


def test_lm_perplexity_scores_the_next_input_ids():
    table = RNG.standard_normal((7, 7)).astype(np.float32)
    noisy = table + 0.3 * RNG.standard_normal((7, 7)).astype(np.float32)
    ids = np.array([[1, 4, 2, 6, 0, 3]])
    report = accuracy_report(parse_model(LM, table=table), parse_model(LM, table=noisy),
                             {"input_ids": ids})
    (out,) = report.outputs
    assert out.kind == "lm" and out.targets == "input_ids"
    # Position t predicts input_ids[t + 1]: rows 0..4 of the logits score ids 1..5.
    ref_ppl = perplexity(table[ids[:, :-1]], ids[:, 1:])
    logp = table[ids[0, :-1]] - np.log(np.exp(table[ids[0, :-1]]).sum(-1, keepdims=True))
    assert np.isclose(ref_ppl, np.exp(-np.mean(logp[np.arange(5), ids[0, 1:]])))
    assert np.isclose(out.perplexity[0], ref_ppl)
    assert np.isclose(out.perplexity[1], perplexity(noisy[ids[:, :-1]], ids[:, 1:]))
    assert np.isclose(out.perplexity_change, out.perplexity[1] / out.perplexity[0] - 1)
    text = report.format()
    assert "logits" in text and "on input_ids" in text and "top-1 agree" in text


def test_a_masked_lm_is_scored_on_each_positions_own_token():
    # Each position's logits read the whole sequence (a mean over it), as a bidirectional
    # encoder's do: a masked LM predicts its own token, and the next one was the wrong target.
    masked = LM.replace("logits = Gather(table, input_ids)", """
      rows = Gather(table, input_ids)
      context = ReduceMean <axes = [1], keepdims = 1> (rows)
      logits = Add(rows, context)""")
    table = RNG.standard_normal((7, 7)).astype(np.float32)
    noisy = table + 0.3 * RNG.standard_normal((7, 7)).astype(np.float32)
    ids = np.array([[1, 4, 2, 6, 0, 3]])
    report = accuracy_report(parse_model(masked, table=table), parse_model(masked, table=noisy),
                             {"input_ids": ids})
    (out,) = report.outputs
    assert out.kind == "lm" and out.targets == "own input_ids" and out.positions == 6

    def logits(t):
        rows = t[ids]
        return rows + rows.mean(axis=1, keepdims=True)

    assert np.isclose(out.perplexity[0], perplexity(logits(table), ids))
    assert np.isclose(out.perplexity[1], perplexity(logits(noisy), ids))
    assert "on own input_ids" in report.format()


def test_lm_without_input_ids_scores_the_reference_argmax():
    table = RNG.standard_normal((7, 7)).astype(np.float32)
    proto = parse_model(LM.replace("input_ids", "tokens"), table=table)
    (out,) = accuracy_report(proto, proto, {"tokens": np.array([[1, 2, 3, 4, 5, 6]])}).outputs
    assert out.targets == "reference argmax" and out.perplexity_change == 0.0


def _kinds(proto, feeds=None) -> dict[str, str]:
    return {o.name: o.kind for o in accuracy_report(proto, proto, feeds).outputs}


def test_outputs_shaped_like_logits_are_only_labelled_so_when_they_plausibly_are():
    """A detector's [1, 12, 64] boxes and scores, a token encoder's [1, 6, 4] hidden states and
    [1, 4] pooled vector, pooled conv features: cosine only. Logits wider than the embedding,
    or named so, and a linear head's scores keep their kind."""
    detector = parse_model("""
        g (float[1,3,8,8] images) => (float[1,12,64] boxes, float[1,12] pooled, float[1,5] y) {
          c = Conv(images, k)
          boxes = Reshape(c, shape)
          p = GlobalAveragePool(c)
          pooled = Flatten(p)
          z = MatMul(pooled, head)
          y = Softmax(z)
        }""", k=RNG.standard_normal((12, 3, 1, 1)).astype(np.float32),
        shape=np.array([1, 12, 64]), head=RNG.standard_normal((12, 5)).astype(np.float32))
    assert _kinds(detector) == {"boxes": "tensor", "pooled": "tensor", "y": "classifier"}
    encoder = parse_model("""
        g (int64[1,6] input_ids, int64[1,6] attention_mask) =>
          (float[1,6,4] last_hidden_state, float[1,4] pooler_output, float[1,6,9] out,
           float[1,6,3] logits) {
          flat = Reshape(input_ids, flat_shape)
          e = Gather(table, flat)
          last_hidden_state = Reshape(e, hidden_shape)
          first = Gather <axis = 1> (last_hidden_state, zero)
          pooler_output = MatMul(first, pool)
          out = MatMul(last_hidden_state, wide)
          logits = MatMul(last_hidden_state, narrow)
        }""", table=RNG.standard_normal((9, 4)).astype(np.float32), flat_shape=np.array([6]),
        hidden_shape=np.array([1, 6, 4]), zero=np.array(0),
        pool=RNG.standard_normal((4, 4)).astype(np.float32),
        wide=RNG.standard_normal((4, 9)).astype(np.float32),
        narrow=RNG.standard_normal((4, 3)).astype(np.float32))
    feeds = {"input_ids": np.array([[1, 4, 2, 6, 0, 3]]), "attention_mask": np.ones((1, 6), int)}
    assert _kinds(encoder, feeds) == {"last_hidden_state": "tensor", "pooler_output": "tensor",
                                      "out": "lm", "logits": "lm"}


def test_a_classifier_whose_scores_leave_through_a_qdq_pair_is_one():
    # onnxruntime's quantize_static writes the head Gemm's output through Q → DQ: the scores
    # had been reported as a plain tensor, without top-1.
    head = parse_model("""
        g (float[1,8] x) => (float[1,5] y) {
          z = Gemm(x, w, b)
          q = QuantizeLinear(z, s, zp)
          y = DequantizeLinear(q, s, zp)
        }""", w=RNG.standard_normal((8, 5)).astype(np.float32),
        b=RNG.standard_normal(5).astype(np.float32), s=np.float32(0.05), zp=np.uint8(128))
    assert _kinds(head) == {"y": "classifier"}


SEGMENTER = """
    g (float[1,3,16,16] x) => (float[1,4,16,16] out, float[1,4,8,8] head) {
      f = Conv <strides = [2, 2], pads = [1, 1, 1, 1]> (x, w1)
      r = Relu (f)
      head = Conv (r, w2)
      out = Resize <mode = "linear"> (head, roi, scales)
    }"""


def _segmenter(w2):
    return parse_model(SEGMENTER, w1=RNG.standard_normal((8, 3, 3, 3)).astype(np.float32),
                       w2=w2, roi=np.zeros(0, np.float32),
                       scales=np.array([1, 1, 2, 2], np.float32))


def test_per_pixel_class_scores_report_per_pixel_top1():
    # An int8 FCN read cosine 0.9998 while 2% of its pixels changed class: the report had no
    # top-1 for [N, C, H, W] logits. A head at a fraction of the image (a detector's) stays a
    # tensor: argmax over its channels means nothing.
    w2 = RNG.standard_normal((4, 8, 1, 1)).astype(np.float32)
    ref, cand = _segmenter(w2), _segmenter(w2 + np.float32(0.3) * RNG.standard_normal(
        w2.shape).astype(np.float32))
    feeds = {"x": RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    report = accuracy_report(ref, cand, feeds)
    rows = {o.name: o for o in report.outputs}
    assert rows["out"].kind == "segmentation" and rows["head"].kind == "tensor"
    expected = numerics.run(ref, feeds)["out"].argmax(axis=1)
    actual = numerics.run(cand, feeds)["out"].argmax(axis=1)
    assert rows["out"].top1 == pytest.approx(float(np.mean(expected == actual)))
    assert rows["out"].rows == 16 * 16 and 0 < rows["out"].top1 < 1


def test_an_output_of_the_inputs_own_shape_is_no_segmentation():
    # A diffusion UNet's predicted noise ([1, 4, 16, 16], as its latent input) out of a Conv
    # had read "segmentation, top-1 agree 98.4%": an argmax over latent channels.
    denoiser = parse_model("""
        g (float[1,4,16,16] x) => (float[1,4,16,16] y) {
          f = Conv <pads = [1, 1, 1, 1]> (x, w1)
          r = Relu (f)
          y = Conv (r, w2)
        }""", w1=RNG.standard_normal((8, 4, 3, 3)).astype(np.float32),
        w2=RNG.standard_normal((4, 8, 1, 1)).astype(np.float32))
    assert _kinds(denoiser) == {"y": "tensor"}


def test_zoo_language_models_and_classifiers_keep_their_kinds():
    gpt2 = zoo.build("gpt2_small", layers=1, hidden=64, heads=2, vocab=100, positions=32)
    bert = zoo.build("bert_base", layers=1, hidden=64, heads=2, intermediate=128, vocab=100)
    tiny = zoo.build("tiny")
    for proto, expected in ((gpt2, {"logits": "lm"}), (bert, {"last_hidden_state": "tensor"}),
                            (tiny, {"logits": "classifier"})):
        feeds = zoo.sample_inputs(proto, seed=0, dims={"sequence_length": 8})
        assert _kinds(proto, feeds) == expected


def _first_sample_model():
    one = "g (float[1,8] x) => (float[1,5] y) { y = MatMul(x, w) }"
    return (parse_model(one, w=RNG.standard_normal((8, 5)).astype(np.float32)),
            parse_model(one, w=RNG.standard_normal((8, 5)).astype(np.float32)))


@pytest.mark.parametrize("layout", ["stacked", "batch", "float64", "directory"])
def test_calibration_feeds_are_the_first_samples_of_any_layout(tmp_path, layout):
    ref, cand = _first_sample_model()
    samples = np.random.default_rng(1).standard_normal((4, 1, 8))
    path = write_calibration(tmp_path, samples, layout)
    report = accuracy_report(ref, cand, calibration=path)
    each = [accuracy_report(ref, cand, {"x": sample.astype(np.float32)}).outputs[0].cosine
            for sample in samples]
    assert report.outputs[0].cosine == min(each) < 1.0
    assert report.inputs == (f"{path} (samples 1-4 of 4: cosines from each output's worst, "
                             "top-1 and perplexity over those 4)")


def test_an_output_is_reported_on_the_sample_where_it_agrees_least(tmp_path):
    # The candidate differs only where x[0] is nonzero: sample 1 (x[0] = 0) agrees exactly,
    # sample 2 does not. One sample hid this (Mask2Former's fp16 mask threshold flipped on its
    # second image only).
    w = RNG.standard_normal((8, 5)).astype(np.float32)
    changed = w.copy()
    changed[0] += 1.0
    one = "g (float[1,8] x) => (float[1,5] y) { y = MatMul(x, w) }"
    ref, cand = parse_model(one, w=w), parse_model(one, w=changed)
    samples = np.ones((2, 1, 8), np.float32)
    samples[0, 0, 0] = 0.0
    np.savez(tmp_path / "c.npz", x=samples)
    report = accuracy_report(ref, cand, calibration=tmp_path / "c.npz")
    assert report.outputs[0].cosine < 0.99 and report.outputs[0].sample == 2
    assert "sample" in report.format().splitlines()[1]  # the column names the row's sample
    first_only = accuracy_report(ref, cand, {"x": samples[0]})
    assert first_only.outputs[0].cosine == pytest.approx(1.0)
    assert first_only.outputs[0].sample is None and "sample" not in first_only.format()


def test_top1_counts_every_samples_rows_not_only_the_worst_cosines(tmp_path):
    # The row shown was the sample with the lowest cosine, top-1 included: a classifier read
    # 100% there while another sample's class flipped (near-tied logits, cosine ~1).
    w = np.eye(5, dtype=np.float32)
    ref = parse_model("g (float[1,5] x) => (float[1,5] y) { y = MatMul(x, w) }", w=w)
    cand = parse_model("g (float[1,5] x) => (float[1,5] y) { m = MatMul(x, w) "
                       "y = Add(m, b) }", w=w, b=np.array([0, 0.02, 0, 0, 0], np.float32))
    samples = np.zeros((2, 1, 5), np.float32)
    samples[0, 0, :2] = 10.0, 9.99  # flips to class 1, cosine 0.999998
    samples[1, 0, 0] = 0.1          # keeps class 0, cosine 0.98
    np.savez(tmp_path / "c.npz", x=samples)
    (row,) = accuracy_report(ref, cand, calibration=tmp_path / "c.npz").outputs
    assert row.kind == "classifier" and row.sample == 2 and row.cosine < 0.99
    assert row.top1 == 0.5


def test_reference_label_names_a_reference_given_as_a_proto():
    ref, cand = _first_sample_model()
    report = accuracy_report(ref, cand, reference_label="model.onnx")
    assert report.reference == "model.onnx" and "accuracy vs model.onnx" in report.format()


def test_verify_judges_a_lossy_compile_by_cosine_unless_told_otherwise(tmp_path, capsys):
    # fp16 rounds every output beyond allclose's 1e-4/1e-5 by design; --verify then judges by
    # cosine, as `graphopt compare` does, and says so. Explicit tolerances keep allclose.
    import onnx
    from helpers import run_cli

    import graphopt
    from graphopt.errors import VerificationError

    proto = parse_model("g (float[4,64] x) => (float[4,32] y) { y = MatMul(x, w) }",
                        w=RNG.standard_normal((64, 32)).astype(np.float32))
    result = graphopt.optimize(proto, precision="fp16", verify=True)
    assert max(result.max_abs_error.values()) > 1e-4
    assert "judged by cosine >= 0.999, norm within ±4.5% (the default after ConvertPrecision)" in result.verify_note
    assert result.verify_note.endswith("rtol/atol judge by allclose")
    with pytest.raises(VerificationError, match=r"output 'y': \d+/128 element\(s\) beyond rtol"):
        graphopt.optimize(proto, precision="fp16", verify=True, rtol=1e-4)
    assert graphopt.optimize(proto, verify=True).verify_note == ""  # lossless: allclose

    src = tmp_path / "m.onnx"
    onnx.save(proto, src)
    rc, out, err = run_cli(capsys, "optimize", src, "-o", tmp_path / "m16.onnx", "--precision",
                           "fp16", "--verify", "--no-accuracy-report")
    assert rc == 0, err
    assert "verified: 1 output(s) match the original" in out
    assert "verify: compiled with ConvertPrecision, lossy by design" in out
    rc, _, err = run_cli(capsys, "optimize", src, "-o", tmp_path / "strict.onnx", "--precision",
                         "fp16", "--verify", "--atol", "1e-6")
    assert rc != 0 and "beyond rtol=0.0001 atol=1e-06" in err
    assert not (tmp_path / "strict.onnx").exists()


def test_verify_on_seeded_inputs_says_so_when_it_fails(tmp_path):
    # Ranges fitted to small positive inputs clip the seeded standard normal ones: the
    # report on the calibration data reads fine while --verify fails, and its error said
    # nothing of what it had run on.
    import graphopt
    from graphopt.errors import VerificationError

    proto = parse_model("""
        g (float[1,64] x) => (float[1,16] y) {
            h = Relu (x)
            y = Gemm <transB = 1> (h, w, b)
        }""", w=RNG.standard_normal((16, 64)).astype(np.float32), b=np.zeros(16, np.float32))
    rng = np.random.default_rng(3)
    np.savez(tmp_path / "c.npz", x=rng.uniform(0, 0.05, (8, 1, 64)).astype(np.float32))
    options = {"quantize": "int8", "calibration": tmp_path / "c.npz",
               "pass_options": {"quant_keep_ends": False}}
    with pytest.raises(VerificationError, match=r"cosine [\d.]+ < 0\.999 \(on seeded random "
                       r"inputs: standard normal values, which the int8 ranges fitted to "
                       r"calibration may clip; give inputs like the deployment's with inputs\)"):
        graphopt.optimize(proto, verify=True, **options)
    np.savez(tmp_path / "real.npz", x=rng.uniform(0, 0.05, (1, 64)).astype(np.float32))
    graphopt.optimize(proto, verify=True, inputs=tmp_path / "real.npz", **options)


def test_verify_by_cosine_still_fails_a_broken_output():
    from graphopt.tools.accuracy_rule import below_cosine

    y = RNG.standard_normal((4, 8))
    judge = {"rtol": 1e-4, "atol": 1e-5, "min_cosine": 0.999}
    assert below_cosine({"y": y}, {"y": y + 1e-3}, judge) == []
    (problem,) = below_cosine({"y": y}, {"y": -y}, judge)
    assert problem == "output 'y': cosine -1.000000 < 0.999"
    (problem,) = below_cosine({"i": np.arange(3)}, {"i": np.arange(3)[::-1]}, judge)
    assert problem == "output 'i': 2 element(s) differ"
    # A cosine just below the rule is printed with the digits that show it below.
    z = np.array([1.0, 0.0])
    near = np.array([1.0, 0.0015])  # cosine 0.99999887…
    (problem,) = below_cosine({"z": z}, {"z": near}, {**judge, "min_cosine": 0.999999})
    assert problem == "output 'z': cosine 0.9999989 < 0.999999"
    # A sequence's tensors are judged one by one; a missing output is named.
    assert below_cosine({"s": [y, y]}, {"s": [y, -y]}, judge) == [
        "output 's[1]': cosine -1.000000 < 0.999"]
    assert below_cosine({"y": y}, {}, judge) == ["output 'y': missing"]


SATURATING_GEMM = """
    g (float[1, 512] x) => (float[1, 64] y) {
        h = Relu(x)
        y = Gemm <transB = 1> (h, w, b)
    }"""


def _symmetric_int8(tmp_path, **options):
    """A Gemm (uniform weights, as an untrained PyTorch Linear has) quantized with symmetric
    activations, and the float original: the compiled proto, or OptimizeResult with `options`."""
    import graphopt

    rng = np.random.default_rng(0)
    proto = parse_model(SATURATING_GEMM, w=rng.uniform(-0.05, 0.05, (64, 512)).astype(np.float32),
                        b=np.zeros(64, np.float32))
    calibration = write_calibration(tmp_path, rng.standard_normal((8, 1, 512)), "stacked")
    result = graphopt.optimize(proto, **options, pass_options={
        "quantize": "int8", "calibration": calibration, "quant_keep_ends": False,
        "activation_symmetric": True})
    return (result if options else graphopt.to_onnx(result.model)), proto


def test_a_lossy_candidate_onnx_runs_at_the_level_a_deployment_does(tmp_path, monkeypatch):
    # QDQ pairs become onnxruntime's int8 kernels only at ORT_ENABLE_ALL; at ORT_DISABLE_ALL
    # they are simulated in float, which would report an accuracy no deployment sees.
    from graphopt import numerics

    levels = []
    session = numerics.session
    monkeypatch.setattr(numerics, "session", lambda model, level="disable", **settings:
                        levels.append(level) or session(model, level, **settings))
    quantized, proto = _symmetric_int8(tmp_path)
    levels.clear()
    accuracy_report(proto, quantized)
    assert levels == ["disable", "all"]  # the reference, then the candidate
    levels.clear()
    accuracy_report(proto, proto)
    assert levels == ["disable", "disable"]  # lossless: graphopt's rewrites alone


@pytest.mark.skipif(not int8_gemm_saturates(),
                    reason="onnxruntime's int8 GEMM does not saturate on this CPU (VNNI)")
def test_the_accuracy_report_and_verify_see_the_int8_kernels_saturate(tmp_path, monkeypatch):
    from graphopt.errors import VerificationError

    # As compiled before QuantizeInt8 knew of saturation: ±127 weights under codes that sit high.
    monkeypatch.setattr("graphopt.quant.int8.int8_gemm_saturates", lambda: False)
    quantized, proto = _symmetric_int8(tmp_path)
    (out,) = accuracy_report(proto, quantized).outputs
    assert out.cosine < 0.995  # float simulation says 0.99996
    with pytest.raises(VerificationError, match=r"output 'y': cosine 0\.9\d+ < 0\.999"):
        _symmetric_int8(tmp_path, verify=True)


@pytest.mark.parametrize("suffix", [".onnx", ".om"])
def test_fp16_overflow_the_cpu_provider_hides_is_a_warning(tmp_path, suffix):
    # h reaches ~1e5: float16 hardware makes it inf, while onnxruntime's CPU provider, which has
    # no float16 MatMul, computes it in float32 and the outputs look perfect.
    import graphopt

    proto = parse_model("""
        g (float[2,8] x) => (float[2,4] y) {
            h = MatMul(x, w1)
            r = Relu(h)
            y = MatMul(r, w2)
        }""", w1=np.full((8, 16), 2e4, np.float32), w2=np.full((16, 4), 1e-5, np.float32))
    for node, name in zip(proto.graph.node, ("mm1", "relu", "mm2")):
        node.name = name  # what --keep-dtype takes, which the warning names
    x = {"x": np.ones((2, 8), np.float32)}
    path = tmp_path / f"m16{suffix}"
    graphopt.save(graphopt.optimize(proto, precision="fp16"), path)
    report = accuracy_report(proto, path, x)
    assert report.outputs[0].cosine == pytest.approx(1.0, abs=1e-6)
    (warning,) = report.warnings
    assert warning.startswith("float16 overflow: 2 tensor(s) the model holds in float16 exceed "
                              "±65504 on this input: h (max 1.6e+05, node mm1), r (max 1.6e+05, "
                              "node relu).")
    assert "warning: float16 overflow" in report.format()
    small = {"x": np.full((2, 8), 1e-3, np.float32)}  # h stays in range on this input
    assert accuracy_report(proto, path, small).warnings == []


def test_a_half_value_a_cast_back_to_float32_reads_is_named_in_the_overflow_warning(tmp_path):
    # Under mixed-fp16 the Relu output r feeds a Softmax kept float32 through a Cast: mapped
    # to the Cast's new name, which the float model has no value for, it was left out.
    import graphopt

    proto = parse_model("""
        g (float[2,8] x) => (float[2,16] y) {
            h = MatMul(x, w1)
            r = Relu(h)
            y = Softmax(r)
        }""", w1=np.full((8, 16), 2e4, np.float32))
    for node, name in zip(proto.graph.node, ("mm1", "relu", "softmax")):
        node.name = name
    path = tmp_path / "mixed.onnx"
    graphopt.save(graphopt.optimize(proto, precision="mixed-fp16"), path)
    (warning,) = accuracy_report(proto, path, {"x": np.ones((2, 8), np.float32)}).warnings
    assert warning.startswith("float16 overflow: 2 tensor(s) the model holds in float16 exceed "
                              "±65504 on this input: h (max 1.6e+05, node mm1), r (max 1.6e+05, "
                              "node relu)."), warning


def test_a_verify_failure_after_fp16_names_the_overflow():
    # The failure said only "candidate has 2 Inf" where the report, without --verify, named
    # the tensor past 65504 and the node making it (openwakeword's mel spectrogram at 1.9e10).
    import graphopt
    from graphopt.errors import VerificationError

    proto = parse_model("""
        g (float[2,8] x) => (float[4,2] y) {
            h = MatMul(x, w)
            y = Transpose(h)
        }""", w=np.full((8, 4), 2e4, np.float32))  # the CPU provider moves float16 data as is
    proto.graph.node[0].name = "mm"
    with pytest.raises(VerificationError, match=r"candidate has 8 Inf.*\. float16 overflow: "
                                                r"\d tensor\(s\) .*h \(max 1\.6e\+05, node mm\)"):
        graphopt.optimize(proto, precision="fp16", verify=True,
                          inputs={"x": np.ones((2, 8), np.float32)})


def test_a_mask_filled_with_the_float32_minimum_is_not_an_overflow(tmp_path):
    # -3.4e38 becomes -inf in float16, which softmax reads as a zero weight: a sentinel.
    import graphopt

    proto = parse_model("""
        g (float[2,4] x, bool[2,4] m) => (float[2,4] y) {
            s = Where(m, x, low)
            y = Softmax(s)
        }""", low=np.float32(np.finfo(np.float32).min))
    path = tmp_path / "m16.onnx"
    graphopt.save(graphopt.optimize(proto, precision="fp16"), path)
    feeds = {"x": np.ones((2, 4), np.float32), "m": np.array([[1, 1, 0, 0]] * 2, bool)}
    assert accuracy_report(proto, path, feeds).warnings == []


def _conv_bn(tail: str = "y = Conv(b, w2)") -> onnx.ModelProto:
    """A 1×1 Conv and the BatchNormalization FuseConvBatchNorm folds into it (their value `b`
    becomes the fused Conv's, under a name the model lacks), scaling by 5e4, then `tail`, whose
    weights bring it back into float16's range."""
    proto = parse_model(f"""
        g (float[1,2,4,4] x) => (float[1,2,4,4] y) {{
            c = Conv(x, w)
            b = BatchNormalization(c, gamma, beta, mean, var)
            {tail}
        }}""", w=np.ones((2, 2, 1, 1), np.float32), gamma=np.full(2, 5e4, np.float32),
        beta=np.zeros(2, np.float32), mean=np.zeros(2, np.float32), var=np.ones(2, np.float32),
        w2=np.full((2, 2, 1, 1), 1e-5, np.float32))
    for node in proto.graph.node:
        node.name = node.output[0] + "_node"
    return proto


@pytest.mark.parametrize("suffix", [".onnx", ".om"])
@pytest.mark.parametrize("level, tail, named", [
    (2, "y = Conv(b, w2)", "conv (inf in float16, node b_node/ConvBatchNorm/Conv)"),
    (3, "r = Relu(b)\n y = Conv(r, w2)",
     "fusedconv (inf in float16, node r_node/ConvRelu/FusedConv)")])
def test_fp16_overflow_in_a_value_a_fusion_renamed_is_a_warning(tmp_path, suffix, level, tail,
                                                                named):
    # b reaches 1e5 (2 channels of 1 times 5e4), but the reference's b and r are not values of
    # the compiled model: the fused Conv's output is, under a new name. The candidate's own run
    # returns it in float16, where it is inf although its operands were finite.
    import graphopt

    proto = _conv_bn(tail)
    path = tmp_path / f"m16{suffix}"
    graphopt.save(graphopt.optimize(proto, precision="fp16", level=level), path)
    x = np.ones((1, 2, 4, 4), np.float32)
    report = accuracy_report(proto, path, {"x": x})
    assert report.outputs[0].cosine == pytest.approx(1.0, abs=1e-6)
    (warning,) = report.warnings
    assert warning.startswith("float16 overflow: 1 tensor(s) the model holds in float16 exceed "
                              f"±65504 on this input: {named}.")
    assert accuracy_report(proto, path, {"x": x * 1e-3}).warnings == []  # b stays in range


def test_fp16_overflow_into_a_node_the_warning_named_and_kept_names_its_readers(tmp_path):
    # Kept float32 as the warning said, the fused Conv still makes 1e5, which a Cast ahead of
    # the float16 Conv after it makes inf: that Conv is named, which --keep-dtype takes (it
    # cannot take the Cast, which ConvertPrecision adds).
    import graphopt

    proto = _conv_bn()
    path = tmp_path / "m16.onnx"
    x = {"x": np.ones((1, 2, 4, 4), np.float32)}
    for kept, warned in [({"b_node/ConvBatchNorm/Conv"}, True),
                         ({"b_node/ConvBatchNorm/Conv", "y_node"}, False)]:
        graphopt.save(graphopt.optimize(proto, precision="fp16",
                                        pass_options={"keep_dtype": kept}), path)
        warnings = accuracy_report(proto, path, x).warnings
        assert [w.split(". ")[0] for w in warnings] == (
            ["float16 overflow: 1 tensor(s) the model holds in float16 exceed ±65504 on this "
             "input: conv_f16 (max 1e+05, read by node y_node)"] if warned else [])
        # what to keep is the node the warning names, not a maker it does not name
        assert all("list the nodes named in keep_dtype" in w for w in warnings)


def test_fp16_overflow_read_by_an_unnamed_node_names_its_op_type(tmp_path):
    # The input's float16 copy overflows and the Sqrt reading it has no name: the warning
    # fell back to "the nodes that make them", graphopt's own Cast, which --keep-dtype cannot
    # take. It names OpType::Sqrt, which it can, and which then keeps the value in range.
    import graphopt

    proto = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y) { s = Sqrt (x) y = Relu (s) }""")
    path = tmp_path / "m16.onnx"
    feeds = {"x": np.array([1, 4, 1e6, 9], np.float32)}
    graphopt.save(graphopt.optimize(proto, precision="fp16"), path)
    (warning,) = accuracy_report(proto, path, feeds).warnings
    assert "x_f16 (max 1e+06, read by OpType::Sqrt)" in warning, warning
    graphopt.save(graphopt.optimize(proto, precision="fp16",
                                    pass_options={"keep_dtype": {"OpType::Sqrt"}}), path)
    assert accuracy_report(proto, path, feeds).warnings == []


def test_a_mask_a_fusion_adds_in_float16_is_not_an_overflow(tmp_path):
    # MatMul + Add becomes one Gemm whose bias holds the mask at float16's lowest value (the
    # float32 lowest, clipped): a score of -32 plus it is -inf, the zero weight it stands for.
    import graphopt

    mask = np.where(np.arange(4) < 2, 0.0, np.finfo(np.float32).min).astype(np.float32)
    proto = parse_model("""
        g (float[2,8] x) => (float[2,4] y) {
            s = MatMul(x, w)
            t = Add(s, mask)
            y = Softmax(t)
        }""", w=np.full((8, 4), -4.0, np.float32), mask=mask)
    path = tmp_path / "m16.onnx"
    graphopt.save(graphopt.optimize(proto, precision="fp16"), path)
    assert "Gemm" in {n.op_type for n in onnx.load(path).graph.node}
    assert accuracy_report(proto, path, {"x": np.ones((2, 8), np.float32)}).warnings == []


def test_per_tensor_leaves_the_output_rows_of_a_quantized_onnx_as_deployed(tmp_path,
                                                                         monkeypatch):
    # An intermediate exposed as an output keeps its QDQ group out of onnxruntime's int8
    # kernel (on the dev YOLO export a Conv's: cosine 0.998939 as deployed, 0.999050 with
    # --per-tensor): the output rows come from a run of the model as it deploys.
    from graphopt import numerics
    from graphopt.tools.compare import compare_models

    quantized, proto = _symmetric_int8(tmp_path)
    runs = []
    session = numerics.session
    monkeypatch.setattr(numerics, "session", lambda model, level="disable", **settings:
                        runs.append((level, len(model.graph.output)))
                        or session(model, level, **settings))
    report = compare_models(proto, quantized, min_cosine=0.9, per_tensor=True)
    assert "h" in {row.name for row in report.intermediates}
    # The reference with h exposed; the candidate as deployed, then with h exposed.
    assert runs == [("disable", 2), ("all", 2), ("all", 1)]


def test_a_map_output_is_labelled_with_its_declared_value_type(tmp_path):
    # ZipMap's scores come back as Python floats (float64 to numpy); the model says float32.
    import onnx
    from onnx import TensorProto, helper

    import graphopt

    scores = helper.make_sequence_type_proto(helper.make_map_type_proto(
        TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))
    graph = helper.make_graph(
        [helper.make_node("ZipMap", ["x"], ["y"], domain="ai.onnx.ml", classlabels_int64s=[0, 1])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_value_info("y", scores)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.ml", 1)],
                              ir_version=8)
    source, om = tmp_path / "m.onnx", tmp_path / "m.om"
    onnx.save(model, source)
    graphopt.save(graphopt.optimize(str(source)), om)
    report = accuracy_report(str(source), str(om))
    assert [(o.name, o.kind) for o in report.outputs] == [("y", "seq(map(int64,float32))")]


@pytest.mark.parametrize("order", [[0, 1], [1, 0], [0, 2]])
def test_a_sample_with_non_finite_outputs_is_the_one_reported(tmp_path, order):
    # Log(Exp(x)) overflows to inf past x = 88: a row without a cosine, or with a note, ranks
    # below any clean one, so the sample that broke is the one shown.
    ref = parse_model("g (float[1,4] x) => (float[1,4] y) { y = Identity(x) }")
    cand = parse_model("g (float[1,4] x) => (float[1,4] y) { e = Exp(x)\n y = Log(e) }")
    samples = np.array([[[0.1, 0.2, 0.3, 0.4]], [[200., 300., 400., 500.]],
                        [[0.5, 300., 0.7, 0.8]]], np.float32)
    np.savez(tmp_path / "c.npz", x=samples[order])
    (row,) = accuracy_report(ref, cand, calibration=tmp_path / "c.npz").outputs
    assert "Inf" in row.note


def test_a_sample_the_reference_itself_cannot_compute_hides_no_other(tmp_path):
    # An input of inf on one sample: the float model makes NaN there, which measured nothing,
    # and that blank row stood for every sample.
    model = parse_model("g (float[1,4] x) => (float[1,1] y) { s = ReduceSum(x)\n"
                        "  y = Sub(s, s) }")
    samples = np.array([[[np.inf, 1, 2, 3]], [[0.5, 0.6, 0.7, 0.8]]], np.float32)
    np.savez(tmp_path / "c.npz", x=samples)
    report = accuracy_report(model, model, calibration=tmp_path / "c.npz")
    (row,) = report.outputs
    assert row.sample == 2 and not row.note and row.cosine == 1.0
    assert report.warnings == ["sample 1: output 'y' not measured: 1 NaN/Inf in both, alike"]


def test_the_report_runs_on_the_inputs_given_and_says_when_it_ran_on_fitted_data(tmp_path,
                                                                                capsys):
    # int8 ranges fitted to the calibration data read better on it than on inputs they did
    # not see: the report takes --verify's inputs when given, and otherwise says so.
    import onnx
    from helpers import run_cli

    # A Gemm: its int8 form takes a range fitted to the data (a MatMul's measures its own).
    proto = parse_model("g (float[4,64] x) => (float[4,32] y) { y = Gemm(x, w) }",
                        w=RNG.standard_normal((64, 32)).astype(np.float32))
    src = tmp_path / "m.onnx"
    onnx.save(proto, src)
    calibration = tmp_path / "calibration.npz"  # three samples of x, stacked
    np.savez(calibration, x=RNG.standard_normal((3, 4, 64)).astype(np.float32))
    held_out = tmp_path / "held_out.npz"
    np.savez(held_out, x=RNG.standard_normal((4, 64)).astype(np.float32))
    common = ["--quantize", "int8", "--calibration", calibration, "--quantize-ends"]
    rc, out, err = run_cli(capsys, "optimize", src, "-o", tmp_path / "a.onnx", *common)
    assert rc == 0, err
    assert "accuracy vs" in out and "calibration" in out.split("accuracy vs")[1].splitlines()[0]
    assert "note: measured on the calibration data, which its int8 ranges were fitted to" in out
    rc, out, err = run_cli(capsys, "optimize", src, "-o", tmp_path / "b.onnx", *common,
                           "--verify", "--inputs", held_out)
    assert rc == 0, err
    assert f"on {held_out}\n" in out and "note: measured on the calibration data" not in out
    rc, out, err = run_cli(capsys, "optimize", src, "-o", tmp_path / "c.onnx", "--quantize",
                           "int4", "--int4-method", "gptq", "--calibration", calibration)
    assert rc == 0, err
    assert "note: measured on the calibration data, which GPTQ's rounding was fitted to" in out


def test_random_inputs_say_which_open_dims_they_set_to_1():
    # A dynamic sequence filled with one token says little about attention: the label says so,
    # and says nothing of a batch of one.
    lm = parse_model(LM.replace("int64[1,6] input_ids", "int64[batch,seq] input_ids")
                     .replace("float[1,6,7] logits", "float[batch,seq,7] logits"),
                     table=RNG.standard_normal((7, 7)).astype(np.float32))
    report = accuracy_report(lm, lm)
    assert report.inputs == "seeded random (seed 0; open dims set to 1: input_ids [1,1])"
    assert accuracy_report(lm, lm, input_shapes={"input_ids": [1, 6]}).inputs == \
        "seeded random (seed 0)"
    batch_only = parse_model(CLASSIFIER.replace("float[4,8] x", "float[n,8] x")
                             .replace("float[4,5] y", "float[n,5] y"),
                             w=RNG.standard_normal((8, 5)).astype(np.float32))
    assert accuracy_report(batch_only, batch_only).inputs == "seeded random (seed 0)"


def test_an_output_below_the_rule_gets_a_warning_under_the_report(capsys):
    # The table showed 0.96 and the compile exited 0: nothing said it fails compare's rule.
    from types import SimpleNamespace

    from graphopt.cli_accuracy import below_the_rule
    from graphopt.tools.accuracy import AccuracyReport, OutputAccuracy

    report = AccuracyReport("m.onnx", "m.om", "calibration")
    report.outputs = [OutputAccuracy("logits", (1, 10), "classifier", 0.959743),
                      OutputAccuracy("aux", (1, 4), "tensor", 0.99995)]
    args = SimpleNamespace(quantize="int8", calibration_method="entropy")
    below_the_rule(args, report)
    # On standard error, as graphopt's other warnings: under -q it is all that is printed.
    assert capsys.readouterr().err == (
        "graphopt: warning: cosine below 0.999, the rule `graphopt compare` and --verify judge "
        "this compile by: 'logits' 0.959743; another --calibration-method may keep more "
        "(minmax is the default)\n")
    args = SimpleNamespace(quantize="int4", calibration_method=None)
    below_the_rule(args, report)  # 0.98 after int4: 0.96 still fails, 0.99995 passes
    assert "'logits' 0.959743\n" in capsys.readouterr().err
    # Past five, it says how many more the table shows.
    report.outputs = [OutputAccuracy(f"o{i}", (1, 4), "tensor", 0.9) for i in range(7)]
    below_the_rule(args, report)
    assert "'o4' 0.900000, and 2 more (in the table)\n" in capsys.readouterr().err
    report.outputs = [OutputAccuracy("aux", (1, 4), "tensor", 0.99995)]
    below_the_rule(args, report)
    assert capsys.readouterr() == ("", "")
    # On seeded random inputs (integers 0 and 1 for a byte model) the figure may say little.
    seeded = AccuracyReport("m.onnx", "m.om", "seeded random (seed 0)")
    seeded.outputs = [OutputAccuracy("label", (1, 10), "classifier", 0.973142)]
    below_the_rule(args, seeded)
    assert "'label' 0.973142; measured on seeded random inputs (standard normal floats, " \
        "integers 0 and 1), unlike a deployment's: --verify --inputs FILE.npz measures on " \
        "real ones\n" in capsys.readouterr().err


def test_a_model_that_fails_on_seeded_inputs_says_whether_their_open_dims_may_be_why():
    # A Reshape to 2×16 runs at batch 4 only: seeded inputs at batch 1 fail it, and other
    # inputs would not. A fixed-shape model onnxruntime cannot load fails whatever it is fed:
    # "give other inputs" would send the user the wrong way.
    from graphopt.errors import GraphoptError
    from graphopt.tools.accuracy import SeededInputsRefused

    sized = parse_model("""
        g (float[N, 8] x) => (float[2, 16] y) {
            m = MatMul (x, w)
            y = Reshape (m, shape)
        }""", w=np.eye(8, dtype=np.float32), shape=np.array([2, 16], np.int64))
    with pytest.raises(SeededInputsRefused, match="their open dims set to 1"):
        accuracy_report(sized, sized)
    unknown = parse_model("""
        <ir_version: 8, opset_import: ["" : 17, "my.domain" : 1]>
        g (float[1, 8] x) => (float[1, 8] y) {
            y = my.domain.MyOp (x)
        }""", header="")
    with pytest.raises(GraphoptError) as caught:
        accuracy_report(unknown, unknown)
    assert not isinstance(caught.value, SeededInputsRefused)


def test_an_integer_output_says_how_many_elements_differ(tmp_path, capsys):
    # A classifier's ArgMax flipped under int8 and its row was blank: no cosine, no note, and
    # the sample shown was the first, where it had not flipped.
    from types import SimpleNamespace

    from graphopt.cli_accuracy import below_the_rule

    text = """
        g (float[1,8] x) => (int64[1] cls, float[1,5] y) {
            y = MatMul(x, w)
            cls = ArgMax <axis = 1, keepdims = 0> (y)
        }"""
    w = np.zeros((8, 5), np.float32)
    w[0, 1], w[1, 2] = 1.0, 1.0
    changed = w.copy()
    changed[1, 3] = 2.0  # class 3 wins wherever x[1] is positive
    ref, cand = parse_model(text, w=w), parse_model(text, w=changed)
    samples = np.zeros((2, 1, 8), np.float32)
    samples[0, 0, 0], samples[1, 0, 1] = 1.0, 1.0
    np.savez(tmp_path / "c.npz", x=samples)
    report = accuracy_report(ref, cand, calibration=tmp_path / "c.npz")
    cls = report.outputs[0]
    assert (cls.differ, cls.note, cls.sample) == (1, "1 of 1 element(s) differ", 2)
    assert "1 of 1 element(s) differ" in report.format()
    same = accuracy_report(ref, ref, calibration=tmp_path / "c.npz").outputs[0]
    assert (same.differ, same.note) == (0, "all elements equal")
    below_the_rule(SimpleNamespace(quantize="int8", calibration_method=None), report)
    assert "changed, which `graphopt compare` and --verify require equal: 'cls' 1 of 1 " \
           "element(s) differ" in capsys.readouterr().err


def test_a_reference_quantized_already_says_part_of_the_gap_may_be_its_own():
    # A QDQ model compiled again read cosine 0.99995 over zero rewrites: its pairs run in
    # float in the reference and as int8 kernels in the candidate, which differ by themselves.
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)
    qdq = parse_model("""
        g (float[1,8] x) => (float[1,8] y) {
            q = QuantizeLinear (x, s, z)
            y = DequantizeLinear (q, s, z)
        }""", s=np.float32(0.01), z=np.uint8(128))
    plain = parse_model("g (float[1,8] x) => (float[1,8] y) { y = Identity (x) }")
    report = accuracy_report(qdq, qdq, {"x": x})
    assert report.notes == ["<reference> is quantized already: the reference runs its "
                            "QuantizeLinear/DequantizeLinear pairs in float (onnxruntime at "
                            "ORT_DISABLE_ALL), a deployment on onnxruntime's int8 kernels, which "
                            "differ by themselves: part of the gap may be the input model's own"]
    assert "\nnote: <reference> is quantized already" in report.format()
    assert accuracy_report(plain, qdq, {"x": x}).notes == []


def test_an_output_at_the_wrong_scale_is_warned_of():
    # Three scores 30% high read cosine 1.000000 in the table and nothing said otherwise.
    ref = parse_model("g (float[1,3] x) => (float[1,3] y) { y = Mul(x, k) }",
                      k=np.float32(1.0))
    cand = parse_model("g (float[1,3] x) => (float[1,3] y) { y = Mul(x, k) }",
                       k=np.float32(1.3))
    report = accuracy_report(ref, cand, {"x": np.array([[3.55, 2.17, 2.36]], np.float32)})
    assert report.outputs[0].cosine > 0.999999
    assert report.warnings == ["y: cosine 1.000000, but its norm is 1.3× the reference's: a "
                               "cosine does not see a change of scale"]
    fine = accuracy_report(ref, parse_model(
        "g (float[1,3] x) => (float[1,3] y) { y = Mul(x, k) }", k=np.float32(1.05)),
        {"x": np.array([[3.55, 2.17, 2.36]], np.float32)})
    assert fine.warnings == []


@pytest.mark.parametrize("original_fails", [True, False])
def test_verify_says_when_onnxruntimes_optimizer_fails_the_original_too(monkeypatch,
                                                                        original_fails):
    # A lossy compile is run at ORT_ENABLE_ALL, as it deploys; an -O1 fp16 compile of an
    # affine grid failed there in onnxruntime's constant folding, as the original does, and
    # --verify blamed the optimized model alone.
    import graphopt
    from graphopt import numerics
    from graphopt.errors import VerificationError
    from graphopt.tools.accuracy_rule import LOSSY_KEY

    real = numerics.run

    def run(model, feeds, level="disable", **settings):
        props = {p.key for p in model.metadata_props} if hasattr(model, "metadata_props") \
            else set()
        if level == "all" and (original_fails or LOSSY_KEY in props):
            raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Input to 'Range' op should be "
                               "scalars")
        return real(model, feeds, level, **settings)

    monkeypatch.setattr(numerics, "run", run)
    proto = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y) { y = Relu (x) }""")
    with pytest.raises(VerificationError) as failed:
        graphopt.optimize(proto, precision="fp16", verify=True)
    message = str(failed.value)
    assert "onnxruntime cannot run the optimized model" in message
    assert ("onnxruntime fails the original too at that level, ORT_ENABLE_ALL" in message) \
        == original_fails, message


def test_an_element_that_overflows_on_one_side_is_an_infinite_error():
    # A float16 overflow (inf where the reference is 4.0) had read "max |error| 0".
    from graphopt.tools.accuracy import _max_error

    ref = np.array([1.0, 4.0, np.inf, np.nan, -2.0], np.float32)
    assert _max_error(ref, np.array([1.0, np.inf, np.inf, np.nan, -2.5], np.float32)) \
        == (float("inf"), 4.0)
    assert _max_error(ref, np.array([1.0, 4.0, np.inf, np.nan, -2.5], np.float32)) == (0.5, 4.0)
    assert _max_error(ref, np.array([1.0, 4.0, -np.inf, np.nan, -2.0], np.float32))[0] \
        == float("inf")
    assert _max_error(np.array([np.nan], np.float32), np.array([1.0], np.float32)) is None
