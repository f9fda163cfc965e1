"""The layout of `--help`: descriptions wrapped to the terminal, example blocks as written."""

from __future__ import annotations

import argparse
import re
import textwrap


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """A description of one paragraph is wrapped to the terminal's width, as argparse's own
    formatter wraps it; a text with line breaks (the examples) is laid out already and kept as
    written, as RawDescriptionHelpFormatter keeps every text (it left descriptions of up to
    380 characters on one line)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" not in text.strip():
            return argparse.HelpFormatter._fill_text(self, text, width, indent)
        # Paragraphs of prose (no line indented, no `label:` heading) are filled to the
        # terminal; example blocks (indented lines, a heading such as `examples:`) are kept.
        blocks = []
        for block in re.split(r"\n\s*\n", text.strip("\n")):
            lines = block.splitlines()
            prose = all(line and not line[0].isspace() for line in lines) and \
                not lines[0].rstrip().endswith(":")
            if prose:  # not at a flag's hyphen: `--input-` / `shape` reads as two words
                text_ = self._whitespace_matcher.sub(" ", block).strip()
                blocks.append(textwrap.fill(text_, width, initial_indent=indent,
                                            subsequent_indent=indent, break_on_hyphens=False))
            else:
                blocks.append(super()._fill_text(block, width, indent))
        return "\n\n".join(blocks) + ("\n" if text.endswith("\n") else "")


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
