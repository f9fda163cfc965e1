"""How accuracy rules and cosines read in messages: a threshold as it was given, a cosine with
the digits a comparison against it needs (`:g` printed 0.9999999 as 1, and .6f a failing
0.99999996 as 1.000000)."""

from __future__ import annotations


def exact(value: float) -> str:
    """The shortest text that reads back as `value` (1.0 as "1")."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def rule_text(rtol: float, atol: float, min_cosine: float | None) -> str:
    """"allclose(rtol=0.0001, atol=1e-05)" or "cosine >= 0.999, norm within ±4.5%": the scale
    a cosine rule also holds outputs to (compare.scale_text), named wherever the rule is, as
    compare's text had alone (its JSON and the report said the cosine only)."""
    if min_cosine is not None:
        return f"cosine >= {exact(min_cosine)}{_norm_clause(min_cosine)}"
    return f"allclose(rtol={exact(rtol)}, atol={exact(atol)})"


def _norm_clause(min_cosine: float) -> str:
    if not 0 < min_cosine < 1:
        return ""
    return f", norm within ±{(1.0 / min_cosine ** 2 - 1.0) ** 0.5:.1%}"


def cosine_text(cosine: float, threshold: float | None = None) -> str:
    """`cosine` with 6 decimals, or, below `threshold`, as many more as it takes to read below
    it (0.9999994 against 0.999999 is not "0.999999 < 0.999999", nor 0.99999996 against 1
    "1.000000")."""
    for digits in range(6, 17):
        text = f"{cosine:.{digits}f}"
        if threshold is None or not cosine < threshold or float(text) < threshold:
            return text
    return repr(cosine)
