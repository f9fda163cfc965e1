"""Fusion rule families, one per module; importing this package registers their passes."""

from graphopt.passes.fusion import (  # noqa: F401
    activation, attention, batched_heads, conv_affine_input, conv_bn, device_expand, elementwise,
    gelu, hardswish, layernorm, layout, lrn, matmul, parallel_conv, prelu, rotary, slicing,
    softplus, stft, transpose_sinking)
