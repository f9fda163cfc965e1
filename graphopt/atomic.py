"""Atomic file output: a destination holds either its old content or the complete new one."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from contextvars import ContextVar
from typing import BinaryIO, Iterator

from graphopt.errors import OutputError
from graphopt.interrupts import interrupts_deferred

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
    with interrupts_deferred():  # a Ctrl-C between open and close leaked the descriptor
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


# A check of a finished file before it replaces its destination (--verify runs the .om it
# wrote): raising leaves the destination as it was.
_BEFORE_REPLACE: ContextVar[Callable[[str], None] | None] = ContextVar(
    "graphopt_before_replace", default=None)


# The files put in place inside noting_written (the command line's), in order.
_WRITTEN: ContextVar[list[str] | None] = ContextVar("graphopt_written", default=None)


@contextlib.contextmanager
def noting_written() -> Iterator[list[str]]:
    """The list of paths whose new file the writes inside the block put in place: an
    interrupted command says which it had written already (a compile stopped after its .om
    landed had only said "interrupted")."""
    written: list[str] = []
    token = _WRITTEN.set(written)
    try:
        yield written
    finally:
        _WRITTEN.reset(token)


@contextlib.contextmanager
def scratch_folder(prefix: str) -> Iterator[str]:
    """A temporary folder for scratch files, removed afterwards. Where no temporary directory
    is usable (a read-only container: tempfile tries $TMPDIR, /tmp, /var/tmp and the working
    directory), an OutputError that says to set TMPDIR, not an internal error."""
    try:
        folder = tempfile.TemporaryDirectory(prefix=prefix)
    except FileNotFoundError as exc:
        if "temporary directory" not in str(exc):
            raise
        raise OutputError("no writable temporary directory (tried $TMPDIR, /tmp, /var/tmp and "
                          "the working directory): set TMPDIR to a writable folder") from None
    with folder as path:
        yield path


@contextlib.contextmanager
def scratch_writes() -> Iterator[None]:
    """Writes inside the block are scratch files the caller deletes (a tuning candidate's
    .om, a dump diff reads back): an interrupted command does not name them as written."""
    token = _WRITTEN.set(None)
    try:
        yield
    finally:
        _WRITTEN.reset(token)


def _note_written(path: str) -> None:
    written = _WRITTEN.get()
    if written is not None:
        written.append(path)


@contextlib.contextmanager
def checked_before_replace(check: Callable[[str], None]) -> Iterator[None]:
    """Inside the block, atomic_write calls `check(temporary path)` on each complete file
    before the rename that puts it in place; an exception from it removes the file instead."""
    token = _BEFORE_REPLACE.set(check)
    try:
        yield
    finally:
        _BEFORE_REPLACE.reset(token)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Yield a binary file; on a clean exit it replaces `path`, on any exception it vanishes.

    The temporary file sits in the destination's directory so the final os.replace is a
    same-filesystem rename, which is atomic on POSIX and Windows. A destination that cannot
    be written (read-only or full disk, missing folder, a directory at `path`) raises
    OutputError naming it.

    A symbolic link is written through (its target is replaced, as onnx.save and cp do); a
    destination that is no regular file (/dev/null, a FIFO) is written in place, since
    replacing it would put a file where the device or pipe was.
    """
    path = destination(path)
    directory = os.path.dirname(path)
    if is_special_file(path):
        # Built in memory first: a zip (.npz, .om) seeks back over what it wrote, which a
        # device or pipe cannot do.
        buffer = io.BytesIO()
        yield buffer
        try:
            with open(path, "wb") as f:
                f.write(buffer.getbuffer())
        except OSError as exc:
            raise cannot_write(path, exc) from None
        return
    # No `with` on the file: its close flushes again, and on a full disk that second failure
    # would replace the OutputError below with a bare OSError.
    f = tmp = None
    try:
        # A Ctrl-C between mkstemp and the handler below leaked the descriptor and the file.
        with interrupts_deferred():
            fd, tmp = _temporary(path)
            f = os.fdopen(fd, "wb")
        try:
            yield f
        except OSError as exc:
            if exc.errno not in _WRITE_ERRORS or isinstance(exc, OutputError):
                raise
            raise cannot_write(path, exc) from None
        try:
            f.flush()
            os.fsync(f.fileno())
            f.close()
        except OSError as exc:
            raise cannot_write(path, exc) from None
        check = _BEFORE_REPLACE.get()
        if check is not None:
            check(tmp)
        try:
            os.chmod(tmp, _final_mode(path))
            with interrupts_deferred():  # the rename and its note: one step for an interrupt
                os.replace(tmp, path)
                _note_written(path)
        except OSError as exc:
            raise cannot_write(path, exc) from None
    except BaseException:
        # BaseException too: a KeyboardInterrupt mid-write must not leave a stray temp file.
        with interrupts_deferred():
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()  # closes the descriptor even when its flush fails
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        raise
    _fsync_dir(directory)


@contextlib.contextmanager
def atomic_files(paths: list[str]) -> Iterator[list[BinaryIO]]:
    """Yield one binary file per path, for files that belong together (a model and its
    external data): on a clean exit each replaces its path in turn, and when one of them
    cannot, those already replaced get their old content back (or vanish when they were
    new), so the set never mixes old and new files. On any exception all of them vanish."""
    paths = [destination(p) for p in paths]
    temps: list[str] = []
    files: list[BinaryIO] = []
    try:
        for path in paths:
            fd, tmp = _temporary(path)
            temps.append(tmp)
            files.append(os.fdopen(fd, "wb"))
        try:
            yield files
        except OSError as exc:
            if exc.errno not in _WRITE_ERRORS or isinstance(exc, OutputError):
                raise
            raise cannot_write(paths[0], exc) from None
        for path, f, tmp in zip(paths, files, temps):
            try:
                f.flush()
                os.fsync(f.fileno())
                f.close()
                os.chmod(tmp, _final_mode(path))
            except OSError as exc:
                raise cannot_write(path, exc) from None
        # An interrupt between two renames (or between a rename and its bookkeeping) had left
        # the new model beside the old data and the old files' hard links behind.
        with _folder_locks(paths), interrupts_deferred():
            _replace_all(paths, temps)
    except BaseException:
        for f, tmp in zip(files, temps):
            with contextlib.suppress(OSError):
                f.close()
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    for directory in {os.path.dirname(os.path.abspath(p)) for p in paths}:
        _fsync_dir(directory)


@contextlib.contextmanager
def _folder_locks(paths: list[str]) -> Iterator[None]:
    """Hold an exclusive lock on each destination folder while a set of files moves in: two
    processes saving the same model at once each move in a whole set, rather than one's
    model beside the other's data. A folder that cannot be locked (no flock there) is moved
    into without one."""
    import fcntl

    held = []
    try:
        for folder in sorted({os.path.dirname(os.path.abspath(p)) for p in paths}):
            try:
                fd = os.open(folder, os.O_RDONLY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                os.close(fd)
                continue
            held.append(fd)
        yield
    finally:
        for fd in held:
            os.close(fd)  # closing releases the lock


def _replace_all(paths: list[str], temps: list[str]) -> None:
    """Move each temporary onto its path; on a failure, put back what was there before."""
    done: list[tuple[str, str | None]] = []  # (path, hard link to its old content or None)
    try:
        for path, tmp in zip(paths, temps):
            backup = None
            if os.path.isfile(path):
                backup = _link_aside(path)
            try:
                os.replace(tmp, path)
            except OSError as exc:
                if backup is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(backup)
                raise cannot_write(path, exc) from None
            done.append((path, backup))
    except BaseException:
        for path, backup in reversed(done):
            with contextlib.suppress(OSError):
                if backup is not None:
                    os.replace(backup, path)
                else:
                    os.unlink(path)
        raise
    for path, backup in done:  # in place together, or not at all
        _note_written(path)
        if backup is not None:
            with contextlib.suppress(OSError):
                os.unlink(backup)


def destination(path: str | os.PathLike) -> str:
    """The file a write to `path` replaces: its absolute path with symbolic links resolved
    (a link's target; `LINK/../out.om` where LINK leads), as the kernel would open it."""
    return os.path.realpath(os.fspath(path))


def is_special_file(path: str) -> bool:
    """Whether `path` exists as something other than a regular file or a folder (a device,
    a FIFO, a socket): what a rename over it would destroy."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def side_name(path: str) -> str:
    """The stem of the hidden files written beside `path`: its name, or for a name near the
    filesystem's 255-byte limit (which the added prefix and suffix would pass) a digest."""
    base = os.path.basename(path)
    if len(os.fsencode(base)) > 200:
        base = hashlib.sha256(os.fsencode(base)).hexdigest()[:16]
    return "." + base


def _link_aside(path: str) -> str:
    """A second name for `path`'s current content (a hard link; a copy where links fail)."""
    directory = os.path.dirname(os.path.abspath(path))
    while True:
        aside = os.path.join(directory,
                             f"{side_name(path)}.{os.getpid()}.{os.urandom(4).hex()}.old")
        try:
            os.link(path, aside)
            return aside
        except FileExistsError:
            continue
        except OSError as exc:
            try:
                shutil.copy2(path, aside)
                return aside
            except OSError:
                raise cannot_write(path, exc) from None


def _temporary(path: str) -> tuple[int, str]:
    """(fd, name) of a new hidden file beside `path`, so the final os.replace is a rename on
    one filesystem; OutputError naming `path` when its folder takes no file."""
    try:
        return tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                                prefix=side_name(path) + ".", suffix=".tmp")
    except OSError as exc:
        raise cannot_write(path, exc) from None


def cannot_write(path: str, exc: OSError) -> OutputError:
    """The one-line OutputError for a write to `path` that failed with `exc`."""
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
