"""The names of the precision modes, quantizations and their methods, and of keep_dtype's op type
entries, which the CLI offers and the precision passes check (kept apart from them: building
`--help` imports no pass)."""

MODES = ("keep", "fp16", "bf16", "mixed-fp16", "mixed-bf16")
QUANTIZE = ("none", "int8", "int4")
INT4_METHODS = ("rtn", "gptq")
CALIBRATION_METHODS = ("minmax", "percentile", "entropy", "mse")
# How a keep_dtype entry names an op type rather than a node, as ATC's --keep_dtype list does.
OP_TYPE_ENTRY = "OpType::"
