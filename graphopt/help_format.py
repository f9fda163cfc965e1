"""The layout of `--help`: descriptions wrapped to the terminal, example blocks as written."""

from __future__ import annotations

import argparse
import re


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """A description of one paragraph is wrapped to the terminal's width, as argparse's own
    formatter wraps it; a text with line breaks (the examples) is laid out already and kept as
    written, as RawDescriptionHelpFormatter keeps every text (it left descriptions of up to
    380 characters on one line)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text.strip():
            return super()._fill_text(text, width, indent)
        return argparse.HelpFormatter._fill_text(self, text, width, indent)


class CommandsHelpFormatter(HelpFormatter):
    """The top-level `--help`: every command's summary on the command's line. argparse sizes
    the column by the commands' names without the indent it lists them at, so the two longest
    (`partition`, `calibrate`) had theirs on the line below."""

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        indent = self._current_indent + self._indent_increment
        for command in getattr(action, "_choices_actions", ()):
            width = len(self._format_action_invocation(command)) + indent
            self._action_max_length = max(self._action_max_length, width)


def first_sentence(doc: str, limit: int = 110) -> str:
    """A docstring's first sentence on one line (its first paragraph, up to the first full
    stop that ends a sentence), cut at a word with `…` beyond `limit` characters."""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    match = re.search(r"(?<!\be\.g)(?<!\bi\.e)(?<!\betc)\.(?=\s|$)", paragraph)
    sentence = paragraph[:match.end()] if match else paragraph
    if len(sentence) <= limit:
        return sentence
    return sentence[:sentence.rfind(" ", 0, limit)] + " …"
