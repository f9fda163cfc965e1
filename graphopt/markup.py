"""Text for HTML and SVG: markup characters escaped, and characters XML forbids (controls,
surrogates, U+FFFE/U+FFFF), for which a viewer refuses the whole file, shown as escapes."""

from __future__ import annotations

import html
import re

from graphopt.terminal_text import escape_controls

# Outside XML 1.0's Char production, besides the controls escape_controls already takes.
_NOT_XML = re.compile("[\ud800-\udfff\ufffe\uffff]")


def escape(text: str, quote: bool = True) -> str:
    """html.escape of `text` once the characters XML forbids are written out as escapes."""
    text = _NOT_XML.sub(lambda match: repr(match.group())[1:-1], escape_controls(text))
    return html.escape(text, quote=quote)
