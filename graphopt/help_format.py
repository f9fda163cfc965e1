"""The layout of `--help`: descriptions wrapped to the terminal, example blocks as written."""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """A description of one paragraph is wrapped to the terminal's width, as argparse's own
    formatter wraps it; a text with line breaks (the examples) is laid out already and kept as
    written, as RawDescriptionHelpFormatter keeps every text (it left descriptions of up to
    380 characters on one line)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text.strip():
            return super()._fill_text(text, width, indent)
        return argparse.HelpFormatter._fill_text(self, text, width, indent)
