"""User-facing errors: one line that names the file, node, op or option at fault."""

from collections.abc import Iterator
from contextlib import contextmanager


class GraphoptError(Exception):
    """An error graphopt reports to the user as one line, with a non-zero exit."""

    def __init__(self, *args: object) -> None:
        if len(args) == 1 and isinstance(args[0], str):
            args = (one_line(args[0]),)
        super().__init__(*args)


def one_line(text: str) -> str:
    """`text` with line breaks and other control characters escaped: names read from a damaged
    file may hold any byte, and the message must stay one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class InputError(GraphoptError):
    """The input model or file is unusable."""


class ModelAtFault(InputError):
    """The compiled model fails a final check for a fault of the model as given, not of a
    rewrite (bisect stops there, where it searches the rewrites for other such failures)."""


class OptionError(GraphoptError):
    """A command-line or API option is invalid."""


class UsageError(OptionError):
    """A command line malformed in a way argparse cannot tell (a count of positional arguments
    that depends on the options): exit status 2, as argparse's own usage errors."""


class OutputError(GraphoptError, OSError):
    """An output file cannot be written (a read-only or full disk, a directory in the way).
    Also an OSError, so that code which tolerates an unwritable file (a cache) still does."""

    def __str__(self) -> str:  # the message, not OSError's "[Errno N] strerror"
        return str(self.args[0]) if self.args else ""


class ArtifactError(GraphoptError):
    """An .om artifact is malformed, tampered with or from an incompatible version."""


class StandInError(ArtifactError):
    """A sound artifact that this machine cannot run: the CPU provider standing in for a device
    provider that is not installed has no kernel for an op compiled for the device (bfloat16
    ops for an NPU)."""


class VerificationError(GraphoptError):
    """The optimized model does not reproduce the original's outputs."""


class PassError(GraphoptError):
    """A pass failed or left the graph structurally invalid."""


def interrupt_behind(error: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C (or SIGTERM) `error` is, or whose unwinding raised it: a library's cleanup
    can fail on the state the interrupt left (Optuna's trial runner reads a variable the
    interrupted code never set), and that error is then what reaches the caller."""
    seen, hops = error, 0
    while seen is not None and hops < 20:
        if isinstance(seen, KeyboardInterrupt):
            return seen
        seen, hops = seen.__cause__ or seen.__context__, hops + 1
    return None


@contextmanager
def naming(where: str) -> Iterator[None]:
    """Refusals of a run made while the block runs, led by `where` (the artifact, and the
    inputs file it ran on), as the other input errors name the file at fault: "input shapes
    … fit none of the model's shape profiles" and "partition 'p0_cpu' failed in onnxruntime"
    named neither. An ArtifactError or another subclass says where it is already."""
    try:
        yield
    except GraphoptError as exc:
        if type(exc) not in (GraphoptError, InputError) or str(exc).startswith(where) \
                or f" {where}:" in str(exc):  # named already ("cannot run x.onnx: …")
            raise
        raise type(exc)(f"{where}: {exc}") from None


IN_MEMORY = "<model>"  # how messages name a model given as a proto or bytes


@contextmanager
def model_label(label: str) -> Iterator[None]:
    """Errors that name the model as IN_MEMORY named by `label`, the file a tool read it from
    before compiling its proto (bisect, profile said "<model>: …" of a file on disk)."""
    try:
        yield
    except GraphoptError as exc:
        text = str(exc)
        if label == IN_MEMORY or not text.startswith(IN_MEMORY):
            raise
        try:
            renamed = type(exc)(label + text[len(IN_MEMORY):])
        except TypeError:  # a subclass whose constructor takes more than the message
            raise exc from None
        raise renamed from None
