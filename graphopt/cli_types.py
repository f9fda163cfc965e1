"""argparse value types shared by the subcommands: a bad value is a usage error (exit 2)."""

from __future__ import annotations

import argparse


def non_negative_int(text: str) -> int:
    """An integer ≥ 0, such as a seed."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give 0 or more")
    return value
