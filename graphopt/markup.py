"""Text for HTML and SVG: markup characters escaped, and control characters, which XML forbids
and a viewer then refuses the whole file for, shown as escapes (`\\x1b`)."""

from __future__ import annotations

import html

from graphopt.terminal_text import escape_controls


def escape(text: str, quote: bool = True) -> str:
    """html.escape of `text` once its control characters are written out as escapes."""
    return html.escape(escape_controls(text), quote=quote)
