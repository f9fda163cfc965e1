"""Precision passes: ConvertPrecision (fp16/bf16, mixed) and QuantizeInt4Weights; importing this
package registers them."""

from graphopt.passes.precision import convert, int4  # noqa: F401
