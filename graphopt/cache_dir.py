"""Where graphopt keeps its caches and default knowledge base: $XDG_CACHE_HOME/graphopt."""

from __future__ import annotations

import os


def cache_dir() -> str:
    """$XDG_CACHE_HOME/graphopt, else ~/.cache/graphopt, else a folder of this user's in the
    temporary directory. An XDG_CACHE_HOME that is not absolute is ignored, as the XDG spec
    says; a user without a home (an arbitrary UID in a container, no passwd entry) has "~"
    expanded to itself, and os.path made a `./~` folder of it in the working directory."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return os.path.join(xdg, "graphopt")
    home = os.path.expanduser("~")
    if os.path.isabs(home):
        return os.path.join(home, ".cache", "graphopt")
    import tempfile  # here: loading an .om imports this module, and needs no tempfile

    user = os.getuid() if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"graphopt-cache-{user}")
