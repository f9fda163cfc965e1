"""Text for HTML and SVG: markup characters escaped, and characters XML forbids (controls,
surrogates, U+FFFE/U+FFFF), for which a viewer refuses the whole file, shown as escapes; line
breaks too, but in the text that lays out lines of its own (a tooltip)."""

from __future__ import annotations

import html
import re

from graphopt.terminal_text import escape_controls

# Outside XML 1.0's Char production, besides the controls escape_controls already takes.
_NOT_XML = re.compile("[\ud800-\udfff\ufffe\uffff]")


# Kept by escape_controls for graphopt's own text; in a name they pass for the layout's own.
_LINE_BREAKS = str.maketrans({c: repr(c)[1:-1] for c in "\t\n\r"})


def escape(text: str, quote: bool = True, lines: bool = False) -> str:
    """html.escape of `text` once the characters XML forbids are written out as escapes, and
    its line breaks and tabs too unless `lines` (text whose lines are graphopt's own, its names
    passed through unbroken() first): a name "out\\nFAKE" read as two in a tooltip, and as
    another name in a table cell."""
    text = _NOT_XML.sub(lambda match: repr(match.group())[1:-1], escape_controls(text))
    if not lines:
        text = text.translate(_LINE_BREAKS)
    return html.escape(text, quote=quote)


def unbroken(text: str) -> str:
    """A name for text that escape(…, lines=True) takes: its line breaks written as escapes."""
    return text.translate(_LINE_BREAKS)
