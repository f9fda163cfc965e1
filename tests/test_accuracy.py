"""accuracy_report: cosine, top-1 agreement and perplexity change per output kind."""

from __future__ import annotations

import numpy as np
from helpers import parse_model

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


def test_lm_without_input_ids_scores_the_reference_argmax():
    table = RNG.standard_normal((7, 7)).astype(np.float32)
    proto = parse_model(LM.replace("input_ids", "tokens"), table=table)
    (out,) = accuracy_report(proto, proto, {"tokens": np.array([[1, 2, 3, 4, 5, 6]])}).outputs
    assert out.targets == "reference argmax" and out.perplexity_change == 0.0
