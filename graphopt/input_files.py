"""Input paths no reader should read whole: devices, whose bytes (/dev/zero) never end."""

from __future__ import annotations

import os
import stat

from graphopt.errors import InputError


def refuse_device(path: str | os.PathLike, what: str = "") -> None:
    """InputError for a character or block device (/dev/zero, /dev/urandom, a terminal): read
    whole, it filled memory until the kernel ended the process. A regular file, a pipe and a
    path that does not exist (its reader says so) pass. `what` prefixes the path (an option)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        label = f"{what} {os.fspath(path)}" if what else os.fspath(path)
        raise InputError(f"{label}: a device, not a file (its bytes may never end)")


def looks_like_zip(path: str | os.PathLike) -> bool:
    """Whether the file begins as a zip does (an .om, an .npz: any of its records, "PK");
    False when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"PK"
    except OSError:
        return False


def utf8_named(path: str) -> bool:
    """Whether `path`'s bytes on the file system are its UTF-8 encoding: what onnxruntime and
    SQLAlchemy, which encode a path as UTF-8, need to reach the file. Not so for a non-ASCII
    name under a Latin-1 locale, or a C locale without Python's UTF-8 mode."""
    try:
        return path.encode("utf-8") == os.fsencode(path)
    except UnicodeError:
        return False
