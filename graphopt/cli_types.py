"""argparse value types shared by the subcommands: a bad value is a usage error (exit 2)."""

from __future__ import annotations

import argparse
import math

from graphopt.api_args import THREAD_LIMIT  # the API's bound on onnxruntime threads


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None


def non_negative_int(text: str) -> int:
    """An integer ≥ 0, such as a seed."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give 0 or more")
    return value


def path_text(text: str) -> str:
    """A file or folder path: not empty (`--switch-file "$CFG"` with CFG unset would otherwise
    read as the option not given)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    return text


def name_text(text: str) -> str:
    """A name, such as a study's: not empty (an unset shell variable would otherwise read as the
    option not given)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty name")
    return text


def positive_int(text: str) -> int:
    """An integer ≥ 1, such as a count of runs."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not allowed; give 1 or more")
    return value


# Timed runs are kept, one float each, for the percentiles: a count past this (a typo's extra
# digits) would run for days and fill memory rather than be refused.
RUN_COUNT_LIMIT = 10_000_000


def run_count(text: str) -> int:
    """A count of timed runs: 1 to RUN_COUNT_LIMIT."""
    return _at_most_the_limit(positive_int(text), 1)


def warmup_count(text: str) -> int:
    """A count of untimed runs: 0 to RUN_COUNT_LIMIT."""
    return _at_most_the_limit(non_negative_int(text), 0)


def _at_most_the_limit(value: int, least: int) -> int:
    if value > RUN_COUNT_LIMIT:
        raise argparse.ArgumentTypeError(f"{value} is too many; give {least} to "
                                         f"{RUN_COUNT_LIMIT:,}")
    return value


def thread_count(text: str) -> int:
    """onnxruntime's intra-op threads: 0 (its default) to THREAD_LIMIT."""
    value = non_negative_int(text)
    if value > THREAD_LIMIT:
        raise argparse.ArgumentTypeError(f"{value} is too many; give 0 to {THREAD_LIMIT}")
    return value


def positive_thread_count(text: str) -> int:
    """A thread count from 1 to THREAD_LIMIT."""
    value = _integer(text)
    if not 1 <= value <= THREAD_LIMIT:
        raise argparse.ArgumentTypeError(f"{value} is not allowed; give 1 to {THREAD_LIMIT}")
    return value


SEED_LIMIT = 2 ** 32  # numpy's RandomState, which Optuna's samplers seed, takes seeds below it


def seed(text: str) -> int:
    """A sampler seed: an integer from 0 to 2**32 - 1."""
    value = non_negative_int(text)
    if value >= SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"{value} is too large; give 0 to {SEED_LIMIT - 1}")
    return value


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def tolerance(text: str) -> float:
    """A finite number ≥ 0, such as --rtol: inf would turn a check off, nan fail it always."""
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give 0 or more")
    return value


def cosine(text: str) -> float:
    """A cosine similarity to reach, from -1 to 1 (above 1 no output could pass)."""
    value = _finite(text)
    if not -1 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{value} is not a cosine; give -1 to 1")
    return value


def dynamic_dims(text: str) -> str:
    """--dynamic-dims' `DIM:v1,v2;…` or `DIM=v,DIM=v;…`, checked for its form (the model is
    checked later), so a malformed value is a usage error before any file is read."""
    from graphopt.shape_profiles import parse_dynamic_dims

    return _form_checked(text, parse_dynamic_dims, "--dynamic-dims")


def input_shapes(text: str) -> str:
    """--input-shape's `name:d0,d1,…;…`, checked for its form (the model is checked later)."""
    from graphopt.input_shapes import parse_input_shapes

    return _form_checked(text, parse_input_shapes, "--input-shape")


class JoinedShapes(argparse.Action):
    """A repeated --input-shape adds its pins to the earlier ones (`--input-shape a:1,4
    --input-shape b:2,4` is "a:1,4;b:2,4"); an input pinned twice is refused, naming it."""

    def __call__(self, parser, namespace, values, option_string=None):
        earlier = getattr(namespace, self.dest, None)
        text = f"{earlier};{values}" if earlier else values
        try:
            input_shapes(text)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        setattr(namespace, self.dest, text)


def _form_checked(text: str, parse, flag: str) -> str:
    """`text` once `parse` takes it; its OptionError, which names `flag`, as argparse's."""
    from graphopt.errors import OptionError
    from graphopt.option_names import command_line

    try:
        with command_line():  # its message speaks of the flag, whoever parses
            parse(text)
    except OptionError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{flag}: ")) from None
    return text


def positive_seconds(text: str) -> float:
    """A finite number of seconds > 0, such as --timeout."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not above 0")
    return value


def target_name(text: str) -> str:
    """A target's name or profile file: not empty (an empty --target would read as none)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty; give a target name (`graphopt targets` lists "
                                         "them) or a profile .json file")
    return text


def parse_size(text: str) -> int:
    """Bytes with an optional K/M/G suffix (powers of 1024)."""
    from graphopt.api_args import parse_size as parse

    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
