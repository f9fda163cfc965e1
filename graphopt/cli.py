"""The `graphopt` command: thin argument parsing over the library."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import threading

from graphopt import __version__
from graphopt.atomic import noting_written
from graphopt.atc_flags import ATC_ONLY, JSON_FILE, atc_hints
from graphopt.cli_atc import add_atc_parser
from graphopt.cli_bisect import add_bisect_parser
from graphopt.cli_calibrate import add_calibrate_parser
from graphopt.cli_compare import add_compare_parser
from graphopt.cli_diff import add_diff_parser
from graphopt.cli_optimize import COMMON_EXAMPLES, add_optimize_parser
from graphopt.cli_partition import add_partition_parser
from graphopt.cli_passes import add_passes_parser
from graphopt.cli_profile import add_profile_parser
from graphopt.cli_report import add_report_parser
from graphopt.cli_run import add_inspect_parser, add_run_parser
from graphopt.cli_streams import streams_as_files
from graphopt.cli_targets import add_targets_parser
from graphopt.cli_tune import add_kb_parser, add_tune_parser
from graphopt.cli_zoo import add_zoo_parser
from graphopt.errors import GraphoptError, UsageError, interrupt_behind
from graphopt.help_format import CommandsHelpFormatter
from graphopt.option_names import command_line, spellings_in_use
from graphopt.terminal_text import (ClosedStreamError, OutputFailed, ReaderGone, escaped_output,
                                    paths_shown_as, silence_stdout)


class _Parser(argparse.ArgumentParser):
    """argparse with graphopt's one-line error format (exit status 2 for usage errors), and
    without abbreviated options: `run --output y.npz` quietly meant `--outputs`, and a later
    option sharing a prefix would change what a script's abbreviation means."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.given: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        self.given = list(sys.argv[1:] if args is None else args)  # for error()'s hints
        return super().parse_known_args(args, namespace)

    def error(self, message: str):  # type: ignore[override]
        if self.prog == "graphopt":  # no or unknown command: the usage line is the best help
            self.print_usage(sys.stderr)
            self.exit(2, f"graphopt: error: {_command_hint(message, self.given)}\n")
        command = self.prog.removeprefix("graphopt ")
        if command == "inspect" and message.startswith("argument --json: ignored explicit"):
            message += f" (--json=FILE is {JSON_FILE})"  # atc --mode=1 --json=x.json pasted
        if message.startswith("the following arguments are required"):
            # A pasted atc command line names its model with --model=: argparse stops at the
            # missing positional, before the unrecognized flags _parse would give hints for.
            hints = atc_hints(self, self.given)
            message += f" ({'; '.join(hints)})" if hints else ""
        message += _precision_hint(message)
        message += _dash_file_hint(message, self.given)
        if spellings_in_use():  # graphopt atc's translation: the user wrote atc's flags
            self.exit(2, f"graphopt: error: atc: {_as_atc_wrote(message)} "
                         "(see graphopt atc --help)\n")
        self.exit(2, f"graphopt: error: {command}: {message} (see {self.prog} --help)\n")


def _dash_file_hint(message: str, given: list[str]) -> str:
    """A file whose name starts with a dash (`-model.onnx`) is read as an option, and argparse
    then names only the argument it left missing: say which file it was and how to name it."""
    if not (message.startswith("the following arguments are required")
            or message.endswith("expected one argument")):
        return ""
    files = [arg for arg in given if arg.startswith("-") and len(arg) > 1 and os.path.exists(arg)]
    if not files:
        return ""
    return f" ({files[0]} is a file, read as an option: write ./{files[0]})"


def _as_atc_wrote(message: str) -> str:
    """argparse's message about a translated flag, naming the flag as the atc line spelled it
    (a check that already names it drops argparse's own "argument --input-shape: ")."""
    found = re.match(r"argument (--[\w-]+)(?:/-\w+)?: ", message)
    if not found or found.group(1) not in spellings_in_use():
        return message
    flag, rest = spellings_in_use()[found.group(1)], message[found.end():]
    return rest if rest.startswith(flag) else f"argument {flag}: {rest}"


def _command_hint(message: str, given: list[str]) -> str:
    """argparse's error about graphopt's command, with what was meant: the command a typo is
    closest to, or, for options given before any command, that the command comes first."""
    import difflib
    import shlex

    found = re.match(r"argument COMMAND: invalid choice: '([^']*)' \(choose from (.*)\)$",
                     message)
    if found:
        if found.group(1) == "help":  # git's and pip's spelling
            rest = [arg for arg in given[1:2] if not arg.startswith("-")]
            return (message + f"; graphopt {rest[0] if rest else 'COMMAND'} --help shows a "
                    "command's help, graphopt --help the commands")
        if given and given[0].startswith("-"):  # an option's value read as the command
            return (message + f"; the command comes first (graphopt COMMAND {given[0]} …; "
                    "graphopt --help lists the commands)")
        close = difflib.get_close_matches(found.group(1), re.findall(r"'([^']+)'",
                                                                     found.group(2)), n=1)
        return message + (f"; did you mean {close[0]}?" if close else "")
    options = [arg for arg in given if arg.startswith("-")]
    if message.startswith("the following arguments are required") and not given:
        return message + " (graphopt --help lists the commands)"
    if options and options[0] in ("-V", "-v", "-version"):
        return f"{options[0]} is not an option of graphopt: graphopt --version"
    if message.startswith("the following arguments are required") and options:
        flag = options[0].split("=", 1)[0]
        if flag == "--model" or flag in ATC_ONLY:  # a whole atc command line, pasted
            return (f"{flag} is ATC's: graphopt atc takes an atc command line as it is "
                    f"(graphopt atc {shlex.join(given)})")
        return (f"{options[0]} is not an option of graphopt itself: the command comes first "
                f"(graphopt COMMAND {options[0]} …; graphopt --help lists the commands)")
    return message


def _precision_hint(message: str) -> str:
    """What a --precision choice that is not one means in graphopt's flags: quantization is
    --quantize, and mixed precision names its half type."""
    found = re.match(r"argument --precision: invalid choice: '([^']*)'", message)
    if not found:
        return ""
    wanted = found.group(1).lower()
    if wanted in ("int8", "int4"):
        return (f" ({wanted} is quantization: --quantize {wanted}"
                + (" --calibration DATA" if wanted == "int8" else "") + ")")
    if wanted in ("mixed", "mix"):
        return " (mixed precision names its half type: mixed-fp16 or mixed-bf16)"
    from graphopt.cli_atc import PRECISION_MODES, PRECISION_MODES_V2

    ours = PRECISION_MODES.get(wanted) or PRECISION_MODES_V2.get(wanted)
    if ours and ours != "keep":  # ATC's --precision_mode value: force_fp16, allow_mix_precision
        return f" (ATC's {wanted} is --precision {ours} here)"
    if wanted in ("fp32", "float32", "float", "origin", "must_keep_origin_dtype"):
        return " (the model's own dtypes are keep, the default)"
    return ""


EXAMPLES = f"""examples:
{COMMON_EXAMPLES}  graphopt partition model.onnx --target ascend310
  graphopt targets ascend910b
  graphopt tune model.onnx --target ascend310 --tuning-db tuning.db --trials 50
  graphopt inspect model.om
  graphopt run model.om --inputs x.npz --repeat 100
  graphopt passes
  graphopt zoo build resnet50 -o resnet50.onnx
"""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="graphopt",
        description="graphopt: an ahead-of-time graph compiler for ONNX models.",
        formatter_class=CommandsHelpFormatter, epilog=EXAMPLES)
    parser.add_argument("--version", action="version", version=f"graphopt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=_Parser)
    add_optimize_parser(sub)
    add_partition_parser(sub)
    add_targets_parser(sub)
    add_calibrate_parser(sub)
    add_tune_parser(sub)
    add_kb_parser(sub)
    add_run_parser(sub)
    add_profile_parser(sub)
    add_inspect_parser(sub)
    add_compare_parser(sub)
    add_diff_parser(sub)
    add_bisect_parser(sub)
    add_report_parser(sub)
    add_atc_parser(sub)
    add_passes_parser(sub)
    add_zoo_parser(sub)
    parser.commands = sub.choices  # name -> the command's parser
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, docker stop, Kubernetes), SIGHUP (a closed terminal, a dropped SSH
    session) or SIGQUIT, raised where the command is, as Ctrl-C's KeyboardInterrupt is: atomic
    writes then remove their temporary files, and tuning stops its workers."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def message(self) -> str:
        named = "" if self.signum == signal.SIGTERM else f" ({signal.Signals(self.signum).name})"
        return f"graphopt: terminated{named}"


_TERMINATING = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@contextlib.contextmanager
def _terminate_as_interrupt():
    def terminate(signum, frame):
        raise Terminated(signum)

    replaced = {}
    try:
        for signum in _TERMINATING:
            # An ignored signal stays ignored: `nohup graphopt tune …` must outlive its terminal.
            if signal.getsignal(signum) is not signal.SIG_IGN:
                replaced[signum] = signal.signal(signum, terminate)
    except ValueError:  # not the main thread: leave signals to the embedding program
        yield
        return
    try:
        yield
    finally:  # None: a handler set outside Python, which cannot be put back
        for signum, previous in replaced.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)


def main(argv: list[str] | None = None) -> int:
    # Names from the models reach the messages: none acts on a terminal, and no character an
    # encoding lacks (nor a closed stdout) fails a command; --help included. Messages name the
    # flags (--input-shape), where the library's name its keyword arguments (input_shapes).
    with escaped_output(), command_line():
        try:
            try:
                args = _parse(argv)
            finally:  # --help's text: a reader gone is found here, not at the interpreter's exit
                sys.stdout.flush()
        except KeyboardInterrupt:
            print("graphopt: interrupted", file=sys.stderr)
            return 130
        except (ClosedStreamError, OutputFailed) as e:  # --help into a closed stdout
            print(f"graphopt: error: {e}", file=sys.stderr)
            return 1
        except ReaderGone:
            return _reader_gone()
        return _run_command(args)


# The exit statuses of an interrupted command: Ctrl-C, and Terminated's signals.
_INTERRUPTED = frozenset({130, *(128 + signum for signum in (signal.SIGTERM, signal.SIGHUP,
                                                              signal.SIGQUIT))})


def entry() -> None:
    """The `graphopt` console script: main(), then exit. An interrupted command whose
    libraries left a thread running exits at once rather than wait for it at the interpreter's
    shutdown: a Ctrl-C that lands as Optuna starts a trial's heartbeat thread orphans it, and
    the process hung after "graphopt: interrupted" until a second Ctrl-C."""
    status = main()
    if status in _INTERRUPTED and any(thread.is_alive() and not thread.daemon
                                      for thread in threading.enumerate()
                                      if thread is not threading.main_thread()):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)
    raise SystemExit(status)


def _reader_gone() -> int:
    """The exit status of a command whose output's reader went away (`| head -1`): as a
    program killed by SIGPIPE, which is what a shell's pipeline status (and `set -o
    pipefail`) expect; what is still buffered goes nowhere."""
    silence_stdout()
    return 128 + signal.SIGPIPE


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse ends a nargs="+" positional at the first option: `diff A --json B` leaves B
    # over. A command that takes more positionals after options names them (diff's models).
    more = getattr(args, "positionals_after_options", None)
    if extra and more:
        getattr(args, more).extend(text for text in extra if not text.startswith("-"))
        extra = [text for text in extra if text.startswith("-")]
    if extra:  # reported by the command's parser: its usage, not graphopt's, is the help
        command = parser.commands.get(getattr(args, "command", None), parser)
        nested = getattr(command, "commands", {})  # kb export, zoo build: theirs
        command = nested.get(getattr(args, f"{args.command}_command", None), command)
        hints = atc_hints(command, extra)  # `--input_shape=…` pasted from an atc command
        hints += _source_edit_hints(command, extra)
        hints += _before_command_hints(command, extra,
                                       sys.argv[1:] if argv is None else argv, args.command)
        hints += _other_meaning_hints(args.command, extra)
        hints += _command_as_option_hints(parser.commands, args.command, extra)
        command.error(f"unrecognized arguments: {' '.join(extra)}"
                      + (f" ({'; '.join(hints)})" if hints else ""))
    return args


def _command_as_option_hints(commands, name, extra: list[str]) -> list[str]:
    """Another command given as an option (`optimize … --report`): it runs on its own."""
    hints = []
    for text in extra:
        word = text.lstrip("-").split("=")[0]
        if text.startswith("--") and word in commands and word != name:
            hints.append(f"{word} is a command of its own: graphopt {word} --help")
    return hints


def _other_meaning_hints(name: str, extra: list[str]) -> list[str]:
    """Words that mean something else here than where they came from: ATC and AMCT users'
    calibration is INT8's, and optimize's -o is run's --outputs."""
    if name == "calibrate" and any(text.lower().endswith((".onnx", ".npz")) for text in extra):
        return ["graphopt calibrate measures the CPU cost model's constants on this machine and "
                "takes no model; INT8 calibration is graphopt optimize MODEL -o OUT --quantize "
                "int8 --calibration DATA.npz"]
    if name == "run" and any(text == "-o" or text.startswith("-o") for text in extra):
        return ["run writes the outputs with --outputs FILE.npz"]
    return []


def _before_command_hints(command, extra: list[str], given: list[str], name) -> list[str]:
    """`graphopt -O3 optimize …`: an option of the command given before the command."""
    if name not in given:
        return []
    before = set(given[:given.index(name)])
    known = {flag for action in command._actions for flag in action.option_strings}
    hints = []
    for text in extra:
        if text not in before:
            continue
        flag = text.split("=", 1)[0]
        flag = flag if flag in known or not flag.startswith("-O") else "-O"
        if flag in known:
            hints.append(f"{text} is an option of {command.prog}: it goes after the command, "
                         f"as in `{command.prog} {text} …`")
        else:
            hints.append(f"{text} goes after the command; graphopt itself takes only --help "
                         "and --version")
    return hints


# optimize's edits of the model before any pass, which the other commands take as a model edited
# once: their flags there get this hint.
_SOURCE_EDITS = ("--out-nodes", "--insert-op-conf", "--input-fp16-nodes", "--output-type")


def _source_edit_hints(command: argparse.ArgumentParser, extra: list[str]) -> list[str]:
    given = list(dict.fromkeys(text.split("=", 1)[0] for text in extra
                               if text.split("=", 1)[0] in _SOURCE_EDITS))
    if not given or command.prog.endswith(" atc"):  # atc takes them, in ATC's spelling
        return []
    name = command.prog.removeprefix("graphopt ")
    return [f"{', '.join(given)} edit{'s' * (len(given) == 1)} the model in graphopt optimize: "
            f"give {name} the edited model, from graphopt optimize -O0 {given[0]} … "
            "-o edited.onnx"]


def run_argv(argv: list[str]) -> int:
    """Run a command line from inside a command (graphopt atc's translation of its flags)."""
    return _run_command(_parse(argv))


def _run_command(args) -> int:
    """The command's exit status; errors are reported in one line, tracebacks only on request."""
    copies: dict[str, str] = {}  # inputs read from pipes: their files, as the user named them
    with paths_shown_as(copies):
        return _run_guarded(args, copies)


def _storage_error_behind(error: BaseException) -> BaseException | None:
    """The Optuna or SQLAlchemy error `error` is or was raised while handling: Optuna's trial
    loop, cleaning up after a database that went away, raises an UnboundLocalError or an
    AssertionError of its own on top of the storage's error."""
    seen, hops = error, 0
    while seen is not None and hops < 20:
        if type(seen).__module__.startswith(("optuna", "sqlalchemy")):
            return seen
        seen, hops = seen.__cause__ or seen.__context__, hops + 1
    return None


@contextlib.contextmanager
def _thread_storage_errors_in_one_line():
    """A storage error in one of Optuna's threads (the heartbeat of a running trial, when the
    database is locked or gone) is one line on standard error, not a page of traceback; the
    trial loop then fails with the same error, which the command reports."""
    default = threading.excepthook

    def hook(info) -> None:
        storage_error = _storage_error_behind(info.exc_value) if info.exc_value else None
        if storage_error is None or os.environ.get("GRAPHOPT_DEBUG"):
            default(info)
            return
        from graphopt.tuner.storage import failure_reason

        reason = failure_reason(storage_error) or type(storage_error).__name__
        print(f"graphopt: warning: the tuning storage failed in a background thread: {reason}",
              file=sys.stderr)

    threading.excepthook = hook
    try:
        yield
    finally:
        threading.excepthook = default


def _run_guarded(args, copies: dict[str, str]) -> int:
    # compare, bisect and diff exit 1 when the check fails (diff --exit-code: the models
    # differ), so their errors exit 2, as cmp's and diff's do: a CI step can tell a broken
    # model from a missing file.
    error_status = getattr(args, "error_status", 1)
    written: list[str] = []

    def stopped(message: str) -> str:  # what the stopped command had put in place already
        shown = ", ".join(written[:3]) + (f" and {len(written) - 3} more file(s)"
                                          if len(written) > 3 else "")  # a dump's hundreds
        return message + (f" (after writing {shown})" if written else "")

    try:
        with _terminate_as_interrupt(), streams_as_files(args, copies), \
                _thread_storage_errors_in_one_line(), noting_written() as written:
            # A command that will print its report finds a closed standard output first, not
            # after its work: a compile would write its file, then fail (`>&-`, as cat does).
            if getattr(sys.stdout, "closed_stream", False) and not getattr(args, "quiet", False):
                raise ClosedStreamError("standard output is closed")
            status = args.func(args)
            sys.stdout.flush()  # a reader gone, a full disk: reported here, not at exit
            return status
    except UsageError as e:
        print(f"graphopt: error: {e}", file=sys.stderr)
        return 2
    except GraphoptError as e:  # a later step's (a plot after the .om) says what is in place
        print(stopped(f"graphopt: error: {e}"), file=sys.stderr)
        return error_status
    except Terminated as e:
        print(stopped(e.message), file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        print(stopped("graphopt: interrupted"), file=sys.stderr)
        return 130
    except ReaderGone:  # output piped into `head` and the like: stop quietly
        return _reader_gone()
    except (ClosedStreamError, OutputFailed) as e:  # started with `>&-`, or a full disk
        print(stopped(f"graphopt: error: {e}"), file=sys.stderr)
        return error_status
    except Exception as e:  # noqa: BLE001 - a one-line report; GRAPHOPT_DEBUG=1 shows the traceback
        if os.environ.get("GRAPHOPT_DEBUG"):
            raise
        interrupt = interrupt_behind(e)
        if isinstance(interrupt, Terminated):
            print(stopped(interrupt.message), file=sys.stderr)
            return 128 + interrupt.signum
        if interrupt is not None:
            print(stopped("graphopt: interrupted"), file=sys.stderr)
            return 130
        storage_error = _storage_error_behind(e)
        if storage_error is not None:
            from graphopt.tuner.storage import failure_reason

            reason = failure_reason(storage_error)
            if reason:  # the database failed under a storage that had opened
                # Named as given: the storage the caught error came through may be a URL
                named = [f"{flag} {getattr(args, dest)}" for flag, dest in
                         (("--storage", "storage"), ("--tuning-db", "tuning_db"))
                         if getattr(args, dest, None)]
                where = f" ({named[0]})" if named else ""
                print(f"graphopt: error: the tuning storage failed{where}: {reason}",
                      file=sys.stderr)
                return 1
        print(f"graphopt: internal error: {type(e).__name__}: {e} "
              "(set GRAPHOPT_DEBUG=1 for a traceback)", file=sys.stderr)
        return 3
