"""The checksums an .om's start-up defers, computed beside onnxruntime's session creation."""

from __future__ import annotations

import threading

from graphopt.codegen.om_read import OmArtifact, cpu_count
from graphopt.errors import ArtifactError


# Below this many bytes the deferred checksums are computed at once (~0.6 ms at most). A thread
# gains little there: onnxruntime keeps the GIL while it builds a session, so a hash that has
# not started by then waits for it, and handing over and waking the caller again costs ~0.1 ms
# on an idle machine and milliseconds on a busy one.
_INLINE_CHECK_BYTES = 1 << 20


class DeferredCheck:
    """The checksums load_om(defer_checks=True) left out (partitions and weights blobs),
    computed on a thread of their own while onnxruntime builds the sessions and runs the
    first inference. It hashes on every core but one: the sessions are built on that one,
    and a hash that took it too would delay them as much as it saves."""

    def __init__(self, artifact: OmArtifact) -> None:
        self._error: str | None = None
        self._artifact = artifact
        self._done = False  # set by the check itself, which a forked child's copy never ran
        self._thread = threading.Thread(target=self._check, args=(artifact,), daemon=True,
                                        name="graphopt-om-check")
        # threading's start() returns only once the thread runs, so it is under way before
        # onnxruntime, which keeps the GIL while it builds a session, is entered.
        self._thread.start()

    def _check(self, artifact: OmArtifact) -> None:
        try:
            artifact.verify_weights(max(1, cpu_count() - 1))  # first: the blobs are the bulk
            artifact.verify_members(artifact.partition_members)
        except ArtifactError as exc:
            self._error = str(exc)
        except BaseException as exc:  # noqa: BLE001 - unverified must never pass as verified
            self._error = (f"{artifact.path}: checksums could not be verified "
                           f"({str(exc) or type(exc).__name__}; was the file changed after it "
                           "was opened?)")
        finally:
            self._done = True

    def wait(self) -> None:
        self._thread.join()
        if not self._done:
            # A process forked from the loading one before the check ended (a pre-fork server
            # that loads in its master): the thread did not come along, and its join returns
            # at once. The child checks the sums itself before trusting a result.
            self._check(self._artifact)
        if self._error is not None:
            raise ArtifactError(self._error)

    def finish(self) -> None:
        """Wait for the thread, whatever it found (a session being closed needs no verdict)."""
        self._thread.join()


def deferred_check(artifact: OmArtifact) -> DeferredCheck | None:
    """Start checking an unverified artifact's sums; None when they are checked already."""
    if artifact.verified:
        return None
    partitions = artifact.partition_members  # load_om checked the others (but the details)
    size = sum(len(artifact.members[name]) for name in partitions)
    size += sum(length for _, length in artifact.spans.values())
    if size < _INLINE_CHECK_BYTES:
        artifact.verify_members(partitions)
        artifact.verify_weights()
        return None
    return DeferredCheck(artifact)
