"""The .om file a loaded artifact with weights blobs keeps open: its blobs are hashed and read
through this handle, whatever later happens to the path (a new file renamed over it, the
file deleted, the working directory changed)."""

from __future__ import annotations

import mmap
import os
import stat

from graphopt.errors import ArtifactError


class ReplacedWhileLoading(ArtifactError):
    """The path named another file once the load had read this one (a save renamed a new
    artifact over it): loading again reads the new one whole."""


class OpenedFile:
    """An open, read-only .om and the size, mtime and change time it had when opened."""

    __slots__ = ("label", "location", "fd", "size", "regular", "_stamp", "_changed", "reverify")

    def __init__(self, fd: int, label: str) -> None:
        self.fd = fd
        self.label = label                        # the path as the caller gave it, for messages
        self.location = _location(label)          # where onnxruntime finds the weights
        info = os.fstat(fd)
        self.size = info.st_size
        self.regular = stat.S_ISREG(info.st_mode)  # not a pipe, a device or a folder
        self._stamp = (info.st_size, info.st_mtime_ns, info.st_dev, info.st_ino)
        self._changed = info.st_ctime_ns
        # Checks the mapped bytes against their checksums (the runtime's: OmSession sets it),
        # for check_unchanged when the inode changed but its size and mtime did not.
        self.reverify = None

    def read(self, offset: int, size: int) -> bytes:
        """`size` bytes from `offset` (fewer if the file shrank since)."""
        pieces = []
        while size > 0:
            piece = os.pread(self.fd, size, offset)
            if not piece:
                break
            pieces.append(piece)
            offset += len(piece)
            size -= len(piece)
        return b"".join(pieces)

    def mapped(self) -> mmap.mmap:
        return mmap.mmap(self.fd, 0, access=mmap.ACCESS_READ)

    def check_unchanged(self) -> None:
        """ArtifactError if the file was rewritten in place since it was opened: sessions that
        map their weights from it would read the new bytes as the old weights.

        Its size or mtime changed: rewritten. Only its change time changed: a chmod, a link
        or an unlink (a new file renamed over the path leaves this one unlinked), or a rewrite
        whose mtime was set back (`cp -p`, `rsync --inplace -t`), which only the bytes tell
        apart: `reverify` hashes them again, once per such change."""
        info = os.fstat(self.fd)
        if (info.st_size, info.st_mtime_ns) != self._stamp[:2]:
            raise self._rewritten()
        if info.st_ctime_ns != self._changed:
            if self.reverify is not None:
                try:
                    self.reverify()
                except ArtifactError:
                    raise self._rewritten() from None
            self._changed = info.st_ctime_ns

    def _rewritten(self) -> ArtifactError:
        return ArtifactError(f"{self.label} was rewritten in place after it was loaded, and its "
                             "weights are mapped from it: load it again (replace an .om by "
                             "renaming a new file over it)")

    def check_still_at_path(self) -> None:
        """ArtifactError if the path no longer names this file: onnxruntime, which maps the
        weights by path, would have read another file's than the ones checked here."""
        try:
            info = os.stat(self.location)
            same = (info.st_dev, info.st_ino) == self._stamp[2:]
        except OSError:
            same = False
        if not same:
            raise ReplacedWhileLoading(f"{self.label} was replaced or removed while it was "
                                       "being loaded: load it again")

    def close(self) -> None:
        """Close the handle now (OmSession.close); reads afterwards fail."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def __del__(self) -> None:
        # No contextlib here: at interpreter exit the module's globals may already be None.
        try:
            self.close()
        except (OSError, AttributeError, TypeError):
            pass


def _location(label: str) -> str:
    """The absolute path of `label`, its folder's symbolic links resolved before its `..`: in
    `linkdir/../m.om` the `..` leaves where linkdir points, as the kernel reads it, not where
    os.path.abspath's text rule puts it. The file's own name stays (a link to an .om is found
    by its name)."""
    folder, name = os.path.split(label)
    return os.path.join(os.path.realpath(folder or os.curdir), name)
