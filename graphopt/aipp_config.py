"""ATC's AIPP configuration file (--insert-op-conf): the static image preprocessing it describes.

The file is ATC's prototxt: one `aipp_op { key: value … }` block per model input. graphopt
reads the static mode's keys for packed RGB, XRGB/ARGB, grey and YUV420SP images, colour
conversion and normalization; a key it does not implement is refused at any value but its
default, so that a configuration never compiles into something other than what it says.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np

from graphopt.errors import InputError, OptionError
from graphopt.input_files import refuse_device
from graphopt.option_names import option

# Channels each input format delivers per pixel (YUV420SP: Y, U, V once its chroma is upsampled).
FORMAT_CHANNELS = {"RGB888_U8": 3, "YUV400_U8": 1, "YUV420SP_U8": 3, "XRGB8888_U8": 3,
                   "ARGB8888_U8": 3}
# The formats of 4 bytes a pixel: the X (or alpha) byte first, or last with ax_swap_switch;
# the model gets R, G and B.
FOUR_BYTE_FORMATS = ("XRGB8888_U8", "ARGB8888_U8")
# Formats ATC knows that graphopt does not implement: refused by name rather than as unknown.
OTHER_FORMATS = ("YUYV_U8", "YUV422SP_U8",
                 "AYUV444_U8", "RAW10", "RAW12", "RAW16", "RAW24", "YUV400_U8_NV")

_INTEGER_KEYS = ("related_input_rank", "src_image_size_w", "src_image_size_h",
                 "load_start_pos_w", "load_start_pos_h", "crop_size_w", "crop_size_h")
_LARGEST = 2**31 - 1  # the integer keys are int32 or uint32 fields of ATC's AippOpParams
_BOOLEAN_KEYS = ("crop", "rbuv_swap_switch", "csc_switch", "ax_swap_switch")
# The colour conversion: out = ((M · (in - input_bias)) >> 8) + output_bias, per ATC's manual.
MATRIX_KEYS = tuple(f"matrix_r{r}c{c}" for r in range(3) for c in range(3))
BIAS_KEYS = {kind: tuple(f"{kind}_bias_{i}" for i in range(3)) for kind in ("input", "output")}
MATRIX_RANGE = (-32768, 32767)  # int16 fixed point, 256 = 1.0
# The largest sum of a row's |entries| whose products with 8-bit values, and their sums, stay
# exact in float32 (below 2**24 steps of 1/256): far past any colour standard's (about 1,100).
ROW_LIMIT = 2**16
# The normalization's constants and values are float32 in the model: past this they are inf.
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_NORMALIZATION_KEYS = tuple(f"{kind}_chn_{i}" for kind in ("mean", "min", "var_reci")
                            for i in range(4))
# ATC keys graphopt leaves at their defaults only: resizing, padding, …
_DEFAULT_ONLY = {
    "resize": False, "padding": False,
    "single_line_mode": False, "support_rotation": False,
}
# The settings of those steps: ATC ignores them while their switch is off, as it must be here.
# Read as numbers, unused.
_UNUSED_SETTINGS = (
    "resize_input_w", "resize_input_h", "resize_output_w", "resize_output_h",
    "left_padding_size", "right_padding_size", "top_padding_size", "bottom_padding_size",
    "padding_value")


@dataclass(frozen=True)
class AippOp:
    """One `aipp_op` block: the preprocessing of one model input."""

    line: int                      # where the block starts, for messages
    input_rank: int                # which graph input (feedable ones, in order)
    input_format: str
    src_size: tuple[int, int]      # (h, w); 0: as the model's input, or the crop
    crop: bool
    crop_start: tuple[int, int]    # (h, w)
    crop_size: tuple[int, int]     # (h, w); 0: as the model's input
    swap_rb: bool                  # R and B, or U and V (YUV420SP: NV21 read as NV12)
    mean: tuple[float, ...]        # per output channel, after the swap (ATC applies it so)
    minimum: tuple[float, ...]
    var_reci: tuple[float, ...]
    # Colour conversion (csc_switch), after the swap: 3x3 row-major fixed point, biases 0-255.
    csc_matrix: tuple[int, ...] | None = None
    input_bias: tuple[int, int, int] = (0, 0, 0)
    output_bias: tuple[int, int, int] = (0, 0, 0)
    x_last: bool = False           # ax_swap_switch: a 4-byte pixel's X or alpha byte comes last
    # The line of each key the block sets: a check made against the model names the key's.
    key_lines: dict = field(default_factory=dict, compare=False)

    @property
    def channels(self) -> int:
        return FORMAT_CHANNELS[self.input_format]

    def line_of(self, key: str) -> int:
        """The line that sets `key`, else the block's."""
        return self.key_lines.get(key, self.line)

    def to_json(self) -> dict:
        """What a compiled model records of this preprocessing (its metadata, an .om's extra)."""
        recorded = {"input_format": self.input_format, "src_size": list(self.src_size),
                    "crop": self.crop, "crop_start": list(self.crop_start),
                    "crop_size": list(self.crop_size), "swap_rb": self.swap_rb,
                    "mean": list(self.mean), "min": list(self.minimum),
                    "var_reci": list(self.var_reci)}
        if self.input_format in FOUR_BYTE_FORMATS:
            recorded["x_last"] = self.x_last
        if self.csc_matrix is not None:
            recorded.update(csc_matrix=list(self.csc_matrix), input_bias=list(self.input_bias),
                            output_bias=list(self.output_bias))
        return recorded


# A decimal number as ATC reads one: Python's float() also takes "1_000", "+5", "٣" and "１".
_DECIMAL = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", re.ASCII)
# A lone '"' opens a quote never closed; ',' and ';' may end a field, as in any prototxt.
_TOKEN = re.compile(r'[{}:]|"[^"]*"|"|[^\s{}:";,]+')


def read_aipp_config(path) -> list[AippOp]:
    """The aipp_op blocks of ATC configuration file `path`, checked (OptionError naming the
    file, line and key at fault; InputError when it cannot be read)."""
    path = os.fspath(path)
    refuse_device(path, option("insert_op_conf"))
    try:
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
    except UnicodeDecodeError as exc:  # a model or an image given for the text file
        raise InputError(f"{option('insert_op_conf')} {path}: not an ATC configuration file "
                         f"(not UTF-8 text: byte {exc.start})") from None
    except OSError as exc:
        raise InputError(f"{option('insert_op_conf')} {path}: cannot read it "
                         f"({exc.strerror or exc})") from None
    blocks = _blocks(text, path)
    if not blocks:
        raise OptionError(f"{option('insert_op_conf')} {path}: no aipp_op block")
    ops = [_aipp_op(fields, line, path) for line, fields in blocks]
    first_block: dict[int, int] = {}
    for op, (line, fields) in zip(ops, blocks):
        if op.input_rank in first_block:
            line = fields.get("related_input_rank", (line,))[0]
            raise OptionError(f"{path}:{line}: related_input_rank {op.input_rank} has an "
                              f"aipp_op block already (line {first_block[op.input_rank]}); one "
                              "block per input")
        first_block[op.input_rank] = line
    return ops


def _tokens(text: str, path: str) -> list[tuple[int, str]]:
    """(line, token) pairs of the prototxt, `#` comments dropped."""
    tokens = [(number, token) for number, line in enumerate(text.splitlines(), 1)
              for token in _TOKEN.findall(line.split("#", 1)[0])]
    for number, token in tokens:
        if token == '"':
            raise OptionError(f"{path}:{number}: a quote that is not closed on its line")
    return tokens


def _blocks(text: str, path: str) -> list[tuple[int, dict[str, tuple[int, str]]]]:
    """Each `aipp_op { … }` block as (its line, {key: (line, value text)})."""
    tokens = _tokens(text, path)
    blocks = []
    i = 0
    while i < len(tokens):
        line, token = tokens[i]
        if token != "aipp_op":
            raise OptionError(f"{path}:{line}: expected aipp_op, found {token!r}")
        if tokens[i + 1:i + 2] and tokens[i + 1][1] == ":":
            i += 1  # "aipp_op: {" is also valid prototxt
        if not tokens[i + 1:i + 2] or tokens[i + 1][1] != "{":
            raise OptionError(f"{path}:{line}: expected '{{' after aipp_op")
        fields: dict[str, tuple[int, str]] = {}
        i += 2
        while True:
            if i >= len(tokens):
                raise OptionError(f"{path}:{line}: aipp_op block is not closed with '}}'")
            key_line, key = tokens[i]
            if key == "}":
                i += 1
                break
            if i + 1 >= len(tokens) or tokens[i + 1][1] != ":":
                raise OptionError(f"{path}:{key_line}: expected 'key: value', found {key!r}")
            if i + 2 >= len(tokens) or tokens[i + 2][1] in "{}:":
                raise OptionError(f"{path}:{key_line}: {key} has no value")
            if key in fields:
                raise OptionError(f"{path}:{key_line}: {key} is set twice in this aipp_op")
            fields[key] = (key_line, tokens[i + 2][1])
            i += 3
        blocks.append((line, fields))
    return blocks


def _aipp_op(fields: dict[str, tuple[int, str]], line: int, path: str) -> AippOp:
    # The mode first: a dynamic block's keys (max_src_image_size) are no static AIPP key.
    mode = fields["aipp_mode"][1].strip('"') if "aipp_mode" in fields else "static"
    if mode != "static":
        raise OptionError(f"{path}:{fields['aipp_mode'][0]}: aipp_mode {mode}: graphopt "
                          "compiles static AIPP only (the preprocessing is fixed in the model)")
    values: dict[str, object] = {}
    for key, (key_line, text) in fields.items():
        where = f"{path}:{key_line}: {key}"
        if key in ("aipp_mode", "input_format"):
            values[key] = text.strip('"')
        elif key in _INTEGER_KEYS:
            values[key] = _integer(text, where)
        elif key in _BOOLEAN_KEYS:
            values[key] = _boolean(text, where)
        elif key in MATRIX_KEYS:
            values[key] = _integer(text, where, MATRIX_RANGE)
        elif key in BIAS_KEYS["input"] + BIAS_KEYS["output"]:
            values[key] = _integer(text, where, (0, 255))
        elif key in _NORMALIZATION_KEYS:
            values[key] = _number(text, where)
        elif key in _DEFAULT_ONLY:
            _check_default(key, text, _DEFAULT_ONLY[key], where)
        elif key in _UNUSED_SETTINGS:
            _number(text, where)
        else:
            raise OptionError(f"{where}: not an AIPP key (graphopt reads ATC's static AIPP "
                              "keys: input_format, crop, src_image_size_*, csc_switch, "
                              "matrix_r*c*, mean/min/var_reci_chn_*, …)")
    where = f"{path}:{line}: aipp_op"
    fmt = values.get("input_format")
    if fmt is None:
        raise OptionError(f"{where}: input_format is required")
    if fmt not in FORMAT_CHANNELS:
        known = "an ATC format graphopt does not implement" if fmt in OTHER_FORMATS \
            else "not an AIPP input format"
        raise OptionError(f"{path}:{fields['input_format'][0]}: input_format {fmt} is {known} "
                          f"(graphopt takes {', '.join(FORMAT_CHANNELS)}; decode other formats "
                          "to RGB first)")
    channels = FORMAT_CHANNELS[fmt]
    for switch in ("rbuv_swap_switch", "csc_switch"):
        if values.get(switch) and channels == 1:
            raise OptionError(f"{path}:{fields[switch][0]}: {switch}: {fmt} has one channel")
    if values.get("ax_swap_switch") and fmt not in FOUR_BYTE_FORMATS:
        raise OptionError(f"{path}:{fields['ax_swap_switch'][0]}: ax_swap_switch moves the X "
                          f"or alpha byte of {' and '.join(FOUR_BYTE_FORMATS)}; {fmt} has none")
    csc = bool(values.get("csc_switch", False))
    if csc and not any(key in values for key in MATRIX_KEYS):
        raise OptionError(f"{path}:{fields['csc_switch'][0]}: csc_switch: true, but no "
                          "matrix_r*c* is given (ATC's manual lists the matrix of each colour "
                          "standard)")
    if csc:
        _check_matrix(values, fields, path)
    crop = bool(values.get("crop", False))
    for key in ("load_start_pos_w", "load_start_pos_h", "crop_size_w", "crop_size_h"):
        if key in values and not crop:
            raise OptionError(f"{path}:{fields[key][0]}: {key} applies with crop: true")
    for key in _NORMALIZATION_KEYS:
        if key in values and int(key[-1]) >= channels:
            raise OptionError(f"{path}:{fields[key][0]}: {key}: {fmt} has {channels} "
                              f"channel{'s' * (channels > 1)}")

    def per_channel(kind: str, default: float) -> tuple[float, ...]:
        return tuple(float(values.get(f"{kind}_chn_{i}", default)) for i in range(channels))

    op = AippOp(
        line=line, key_lines={key: key_line for key, (key_line, _) in fields.items()},
        input_rank=int(values.get("related_input_rank", 0)), input_format=fmt,
        src_size=(int(values.get("src_image_size_h", 0)), int(values.get("src_image_size_w", 0))),
        crop=crop,
        crop_start=(int(values.get("load_start_pos_h", 0)), int(values.get("load_start_pos_w", 0))),
        crop_size=(int(values.get("crop_size_h", 0)), int(values.get("crop_size_w", 0))),
        swap_rb=bool(values.get("rbuv_swap_switch", False)),
        mean=per_channel("mean", 0.0), minimum=per_channel("min", 0.0),
        var_reci=per_channel("var_reci", 1.0),
        # A matrix entry left out is 0, as in ATC's proto; ignored, as ATC does, with csc off.
        csc_matrix=tuple(int(values.get(key, 0)) for key in MATRIX_KEYS) if csc else None,
        input_bias=_biases(values, "input") if csc else (0, 0, 0),
        output_bias=_biases(values, "output") if csc else (0, 0, 0),
        x_last=bool(values.get("ax_swap_switch", False)))
    check_normalized(op, where)
    return op


def check_normalized(op: AippOp, where: str) -> None:
    """Refuse constants under which a pixel (0-255) normalizes past float32, as the model
    computes it: the model would return inf or NaN for it."""
    with np.errstate(over="ignore", invalid="ignore"):
        offset = np.add(op.mean, op.minimum).astype(np.float32)
        ends = (np.float32([[0.0], [255.0]]) - offset) * np.array(op.var_reci, np.float32)
    for i in range(op.channels):
        if not np.isfinite(ends[:, i]).all():
            raise OptionError(f"{where}: channel {i}'s (pixel - mean_chn_{i} - min_chn_{i}) * "
                              f"var_reci_chn_{i} reaches past float32's largest value "
                              f"({_FLOAT32_MAX:.4g})")


def matrix_problem(entries) -> str | None:
    """Why the colour matrix `entries` (matrix_r0c0 to r2c2) makes no image, or one too large
    to convert exactly; None when it converts."""
    if not any(entries):
        return "every matrix_r*c* is 0: the conversion would make a black image"
    for row in range(3):
        total = sum(abs(v) for v in entries[3 * row:3 * row + 3])
        if total > ROW_LIMIT:
            return (f"matrix_r{row}c0 to c2 add up to {total} in magnitude, past {ROW_LIMIT} "
                    f"(x{ROW_LIMIT // 256} in 8-bit steps; graphopt converts exactly up to "
                    "there)")
    return None


def _check_matrix(values: dict, fields: dict, path: str) -> None:
    """Refuse a matrix that makes no image, or one too large to convert exactly."""
    problem = matrix_problem([int(values.get(key, 0)) for key in MATRIX_KEYS])
    if problem:
        raise OptionError(f"{path}:{fields['csc_switch'][0]}: csc_switch: {problem}")


def _biases(values: dict, kind: str) -> tuple[int, int, int]:
    first, second, third = (int(values.get(key, 0)) for key in BIAS_KEYS[kind])
    return first, second, third


def _integer(text: str, where: str, bounds: tuple[int, int] = (0, _LARGEST)) -> int:
    # Digits as ATC reads them: Python's int() also takes "1_000", "+5" and "٣".
    digits = text[1:] if text.startswith("-") else text
    if not (digits.isascii() and digits.isdigit()):
        raise OptionError(f"{where}: expected a whole number, found {text!r}")
    value = int(text)
    low, high = bounds
    if value < 0 and low == 0:
        raise OptionError(f"{where}: {value} is negative")
    if high == _LARGEST and value > high:  # past int64, numpy's OverflowError was an internal error
        raise OptionError(f"{where}: {value} is too large (ATC's fields are 32-bit)")
    if not low <= value <= high:
        raise OptionError(f"{where}: {value} is outside {low} to {high}")
    return value


def _number(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise OptionError(f"{where}: expected a number, found {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise OptionError(f"{where}: {text} is not a finite number")
    if not _DECIMAL.fullmatch(text):
        raise OptionError(f"{where}: expected a number, found {text!r}")
    if not _finite_float32(value):  # finite in Python, inf in the model's float32 constants
        raise OptionError(f"{where}: {text} is past float32's largest value "
                          f"({_FLOAT32_MAX:.4g})")
    return value


def _finite_float32(value: float) -> bool:
    """Whether `value` rounds to a finite float32 (FLT_MAX as printed, 3.4028235e38, does)."""
    with np.errstate(over="ignore"):
        return bool(np.isfinite(np.float32(value)))


def _boolean(text: str, where: str) -> bool:
    # The spellings protobuf's text format reads, as ATC does.
    if text not in _TRUE + _FALSE:
        raise OptionError(f"{where}: expected true or false, found {text!r}")
    return text in _TRUE


_TRUE, _FALSE = ("true", "True", "t", "1"), ("false", "False", "f", "0")


def _check_default(key: str, text: str, default: bool, where: str) -> None:
    """Refuse a switch of a step graphopt does not implement unless it is off."""
    if _boolean(text, where) == default:
        return
    raise OptionError(f"{where}: {text}: graphopt does not implement this AIPP step (resizing, "
                      "padding, rotation, single-line mode); do it before feeding the model")
