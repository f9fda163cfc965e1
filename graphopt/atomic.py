"""Atomic file output: a destination holds either its old content or the complete new one."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from typing import BinaryIO, Iterator

from graphopt.errors import OutputError

# What a write into the temporary file fails with when the destination cannot take it; any
# other OSError raised by the caller's code is the caller's (a failed read, say).
_WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO, errno.EACCES,
                 errno.EPERM}


def _umask() -> int:
    # Linux exposes the umask read-only; os.umask() would have to set it, which races other threads.
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def _final_mode(path: str) -> int:
    # mkstemp creates 0600; give the result the mode a plain open() would, or keep the old file's.
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def _fsync_dir(directory: str) -> None:
    # Makes the rename itself durable; not every platform or filesystem lets a directory be opened.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Yield a binary file; on a clean exit it replaces `path`, on any exception it vanishes.

    The temporary file sits in the destination's directory so the final os.replace is a
    same-filesystem rename, which is atomic on POSIX and Windows. A destination that cannot
    be written (read-only or full disk, missing folder, a directory at `path`) raises
    OutputError naming it.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".",
                                   suffix=".tmp")
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as f:
            try:
                yield f
            except OSError as exc:
                if exc.errno not in _WRITE_ERRORS or isinstance(exc, OutputError):
                    raise
                raise _cannot_write(path, exc) from None
            try:
                f.flush()
                os.fsync(f.fileno())
            except OSError as exc:
                raise _cannot_write(path, exc) from None
        try:
            os.chmod(tmp, _final_mode(path))
            os.replace(tmp, path)
        except OSError as exc:
            raise _cannot_write(path, exc) from None
    except BaseException:
        # BaseException too: a KeyboardInterrupt mid-write must not leave a stray temp file.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


def _cannot_write(path: str, exc: OSError) -> OutputError:
    directory = os.path.dirname(os.path.abspath(path))
    if isinstance(exc, IsADirectoryError) or os.path.isdir(path):
        reason = "it is a directory"
    elif not os.path.isdir(directory):
        reason = (f"{directory} is a file, not a folder" if os.path.exists(directory)
                  else f"{directory} does not exist")
    else:
        reason = exc.strerror or str(exc)
    error = OutputError(f"cannot write {path}: {reason}")
    # As an OSError's: callers that word their own message from strerror keep doing so.
    error.errno, error.strerror = exc.errno, reason
    return error


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically."""
    with atomic_write(path) as f:
        f.write(data)
