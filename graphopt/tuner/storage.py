"""Where tuning studies live: an Optuna storage from an SQLite file, a URL or the default
database, checked before Optuna touches it (which would create tables in any file), opened
read-only for commands that only read the knowledge base."""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

from graphopt.cache_dir import cache_dir
from graphopt.errors import OptionError, interrupt_behind
from graphopt.input_files import utf8_named
from graphopt.interrupts import interrupts_deferred
from graphopt.option_names import spelled
from graphopt.tuner.workers import stop_if_asked
from graphopt.tuner.optuna_import import optuna
from graphopt.warning_scope import warnings_as

SQLITE_TIMEOUT_S = 60.0  # how long a worker waits for another's SQLite write lock
HEARTBEAT_S = 10         # how often a running trial says it is alive
GRACE_S = 30             # silence after which a running trial's worker counts as dead


def default_db_path() -> str:
    """$XDG_CACHE_HOME/graphopt/tuning.db (~/.cache when unset): the default knowledge base."""
    return os.path.join(cache_dir(), "tuning.db")


STORAGE_URLS = "sqlite:///FILE.db, postgresql://USER@HOST/DB or mysql://USER@HOST/DB"
SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every non-empty SQLite file


def storage_url(db_or_url: str | os.PathLike | None = None, *, option: str = "--tuning-db",
                must_exist: bool = False) -> str:
    """An Optuna storage URL: URLs pass through, a file path becomes sqlite:///<absolute path>,
    None the default database (default_db_path, whose directory is created). A given storage
    is checked without touching it: a known URL scheme, and for SQLite a file that is a
    database, or (not `must_exist`) can become one in an existing directory. `option` names
    the storage in errors, as the command line being run spells it."""
    option = spelled(option)
    if db_or_url is None:
        path = default_db_path()
        if must_exist and not os.path.isfile(path):
            raise OptionError(f"the default knowledge base {path} does not exist yet "
                              "(`graphopt tune` creates it; --tuning-db FILE names another)")
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        except OSError as exc:  # HOME unset, a file, or read-only
            raise OptionError(f"the default knowledge base {path}: cannot create its folder "
                              f"({exc.strerror or exc}); give --tuning-db FILE") from None
        return _sqlite_url(path)
    text = os.fspath(db_or_url)
    if not text:  # an unset shell variable: abspath("") would name the working folder
        raise OptionError(f"{option}: empty; give a knowledge-base file or a storage URL")
    if "://" not in text:
        path = os.path.abspath(text)
        _check_sqlite_file(path, option, text, must_exist)
        return _sqlite_url(path)
    database = _check_url(text, option)
    if database in ("", ":memory:") or (database or "").startswith("file::memory:"):
        # Each connection would see its own empty database: nothing would outlive it.
        raise OptionError(f"{option} {text}: an in-memory SQLite database lasts as long as "
                          "its connection, so nothing tuned there would be kept; give a file "
                          "(sqlite:///path/tuning.db)")
    if database is not None:
        _check_sqlite_file(os.path.abspath(database), option, text, must_exist)
    return text


def _sqlite_url(path: str) -> str:
    """sqlite:/// and the path, quoted: SQLAlchemy decodes %XX in a URL and reads ? as the
    start of options, so `p%41.db` would open pA.db and `kb.db?` another file. A name that is
    not UTF-8 text (a non-ASCII name under a C or Latin-1 locale) has no such URL, since
    SQLAlchemy decodes the URL as UTF-8: OptionError."""
    if not utf8_named(path):
        raise OptionError(f"{path!r}: an SQLite storage's name must be UTF-8, which this "
                          "locale does not give it: use an ASCII path, or a UTF-8 locale "
                          "(LANG=C.UTF-8)")
    return f"sqlite:///{quote(path, safe='/')}"


def sqlite_path(db_or_url: str | os.PathLike | None) -> str | None:
    """The file of an SQLite storage (the default database for None); None for a server."""
    if db_or_url is None:
        return default_db_path()
    text = os.fspath(db_or_url)
    if "://" not in text:
        return text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(text)
    except ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return parsed.database


def _check_url(url: str, option: str) -> str | None:
    """The SQLite database path of `url` (None for a server, "" for an in-memory SQLite
    database); refuses a URL SQLAlchemy, which Optuna's storages build on, cannot load a
    dialect for."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise OptionError(f"{option} {url}: not a storage URL (use {STORAGE_URLS})") from None
    try:
        parsed.get_dialect()
    except NoSuchModuleError:
        raise OptionError(f"{option} {url}: unknown storage scheme '{parsed.drivername}' "
                          f"(use {STORAGE_URLS})") from None
    # SQLite without a database ("sqlite://") is an in-memory one: "".
    return (parsed.database or "") if parsed.get_backend_name() == "sqlite" else None


def _check_sqlite_file(path: str, option: str, given: str, must_exist: bool) -> None:
    # Optuna would create an empty database at a mistyped path (and its directory with it),
    # and SQLAlchemy reports a file that is no database only as an internal error.
    label = f"{option} {given}"
    if os.path.isdir(path):
        raise OptionError(f"{label}: is a directory, expected a knowledge-base file")
    if not os.path.exists(path):
        if must_exist:
            flag = "--storage" if "://" in given else "--tuning-db"
            raise OptionError(f"{label}: no such knowledge base (`graphopt tune … {flag} "
                              f"{given}` creates one)")
        folder = os.path.dirname(path)
        if not os.path.isdir(folder):
            problem = "is a file, not a folder" if os.path.exists(folder) else "does not exist"
            raise OptionError(f"{label}: directory {folder} {problem}")
        return
    try:  # through the kept descriptor: closing one would drop SQLite's locks (file_handle)
        head = os.pread(file_handle(path), len(SQLITE_MAGIC), 0)
    except OSError as e:
        raise OptionError(f"{label}: cannot read it ({e.strerror or e})") from None
    if head and head != SQLITE_MAGIC:  # an empty file is an empty SQLite database
        raise OptionError(f"{label}: not a graphopt knowledge base (SQLite: file is not a "
                          "database)")


def open_storage(storage: Any = None, *, option: str = "--tuning-db", must_exist: bool = False,
                 read_only: bool = False) -> optuna.storages.BaseStorage:
    """An Optuna storage from a URL, an SQLite file path, None (the default file) or a storage
    object (returned as is); storage_url checks it first, and a storage that still fails to
    open is an OptionError naming `option`. SQLite gets a lock timeout and WAL journaling so a
    few local workers can share one file; many workers want a server (postgresql://, mysql://).

    `read_only` (commands that only read the knowledge base): an SQLite file must exist and
    hold Optuna's tables, and is opened read-only, so that it may sit on a read-only disk and
    another program's database is refused rather than given tables of its own."""
    if isinstance(storage, optuna.storages.BaseStorage):
        return storage
    option = spelled(option)
    url = storage_url(storage, option=option, must_exist=must_exist or read_only)
    label = f"{option} {url if storage is None else os.fspath(storage)}"
    if read_only and url.startswith("sqlite:"):
        url = _read_only_url(url, label)
    elif url.startswith("sqlite:"):
        with setup_lock(url):  # a run creating Optuna's tables meanwhile shows some of them
            _refuse_another_programs_database(url, label)
    # Workers beat a heartbeat: a trial whose worker was killed stops beating, and the next
    # worker to start marks it failed instead of leaving it RUNNING for ever. Completed trials
    # are never touched, so a restarted job loses nothing.
    liveness = {"heartbeat_interval": HEARTBEAT_S, "grace_period": GRACE_S}
    sqlite = url.startswith("sqlite:")
    engine = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}} if sqlite else None
    with _storage_errors(label, url), \
            (setup_lock(url) if not read_only else contextlib.nullcontext()), \
            warnings_as("ignore", optuna.exceptions.ExperimentalWarning):
        # Heartbeats are "experimental" since Optuna 2.9, and what we need.
        storage = optuna.storages.RDBStorage(url, engine_kwargs=engine, **liveness)
    if sqlite:
        _OPEN_SQLITE[storage.engine] = read_only
        if not read_only:
            _enable_wal(storage)
    return storage


@contextlib.contextmanager
def opened(storage: Any = None, **options) -> Iterator[optuna.storages.BaseStorage]:
    """open_storage(storage, **options) for the block: a storage it opened is closed after it
    (its pooled connections, and file handles, released; an SQLite file's journal
    checkpointed), so that a process that compiles with `tuning_db` again and again holds no
    more open files than one compile; a storage object the caller gave stays open."""
    store = open_storage(storage, **options)
    try:
        yield store
    finally:
        if store is not storage:
            close_storage(store)


def close_storage(storage: optuna.storages.BaseStorage) -> None:
    """Release the connections of a storage open_storage opened, leaving an SQLite file it
    wrote at rest (_at_rest)."""
    engine = getattr(storage, "engine", None)
    if engine is None:
        return
    read_only = _OPEN_SQLITE.pop(engine, None)
    with contextlib.suppress(Exception):
        engine.dispose()
    if read_only is False:
        _at_rest(_database_file(engine))
    elif read_only:
        _READ.add(_database_file(engine))
    if read_only is not None:
        _release_handle(_database_file(engine))


# Every SQLite engine this process opened and has not closed -> whether read-only, for
# _checkpoint_at_exit.
_OPEN_SQLITE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# The SQLite files this process read (and closed): a reader open when the last writer left
# kept that writer from putting the file at rest, so a reader that is the last process out
# does it at exit.
_READ: set[str | None] = set()


@atexit.register
def _checkpoint_at_exit() -> None:
    """Close every connection and leave each file this process wrote at rest (_at_rest), so
    the .db a tune leaves stands alone: `cp tuning.db` copies all of it, and a read-only
    folder (which gets no -shm file, so ignores the journal) reads it whole. Pooled
    connections are not closed at exit otherwise."""
    engines = list(_OPEN_SQLITE.items())
    for engine, _ in engines:
        with contextlib.suppress(Exception):
            engine.dispose()
    for engine, read_only in engines:
        (_READ.add if read_only else _at_rest)(_database_file(engine))
    for path in _READ:
        # Only a file writers left in WAL mode, and only where this process may write: a
        # reader on a read-only disk or of another user's file cannot, and need not, change it.
        if path is not None and os.path.exists(f"{path}-wal") and os.access(path, os.W_OK) \
                and os.access(os.path.dirname(path), os.W_OK):
            _at_rest(path)


def _at_rest(database: str | None) -> None:
    """The WAL journal moved into the database file and the file back in rollback-journal
    mode, if no other connection is at it (the last process out does it: a writer as it
    closes its storage, a reader at exit). In WAL mode even a read-only reader (`kb list`, a
    compile with --tuning-db) leaves -wal and -shm files beside it; a file at rest in the
    default mode gets none."""
    import random
    import sqlite3
    import time

    if database is None:
        return
    for attempt in range(2):
        if attempt:
            # Two processes leaving at once each keep the other's attempt from changing the
            # mode: the one that tries again after a random pause finds the other gone.
            time.sleep(random.uniform(0.05, 0.2))
        with contextlib.suppress(Exception), \
                contextlib.closing(sqlite3.connect(database)) as db:
            # Another process still at it does it as it leaves: no waiting on it (the
            # connection's 60 s lock timeout).
            db.execute("PRAGMA busy_timeout = 100")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            if db.execute("PRAGMA journal_mode = DELETE").fetchone() == ("delete",):
                return


# What every Optuna RDB storage has; a file without them is not a knowledge base.
_OPTUNA_TABLES = {"studies", "trials", "version_info"}


def check_writable(storage, option: str = "--tuning-db") -> None:
    """Refuse, before any work, an SQLite knowledge base this process cannot write: the file
    read-only, or its folder (SQLite writes its journal beside it)."""
    path = sqlite_path(storage)
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise OptionError(f"{option} {path}: read-only; tuning writes its trials into it "
                          "(copy it somewhere writable, or name a new file)")
    if os.path.isdir(folder) and not os.access(folder, os.W_OK):
        raise OptionError(f"{option} {path}: its folder {folder} is read-only, and SQLite "
                          "writes its journal beside the file")


def _refuse_another_programs_database(url: str, label: str) -> None:
    """An SQLite file that holds tables but not Optuna's is another program's database: Optuna
    would add its own tables to it (a mistyped `--tuning-db app.db` altered app.db)."""
    import sqlite3
    from urllib.parse import quote

    from sqlalchemy.engine import make_url

    database = make_url(url).database
    if database in (None, "", ":memory:") or not os.path.isfile(database) or \
            os.path.getsize(database) == 0:
        return
    path = quote(os.path.abspath(database))
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error:
        return  # open_storage's own attempt says what is wrong with it
    if tables and not _OPTUNA_TABLES <= tables:
        shown = ", ".join(sorted(tables)[:4]) + (", …" if len(tables) > 4 else "")
        raise OptionError(f"{label}: another program's SQLite database (tables {shown}), not a "
                          "graphopt knowledge base: it is left as it is; name a new file")


def _read_only_url(url: str, label: str) -> str:
    """The SQLite URL opened read-only, once the file holds Optuna's tables. A database that
    tune left in WAL mode needs its -shm file, which a read-only folder cannot get: it is
    then read as immutable (nothing can be writing it there)."""
    import sqlite3
    from urllib.parse import quote

    from sqlalchemy.engine import make_url

    database = make_url(url).database
    if database in (None, "", ":memory:"):
        return url
    path = quote(os.path.abspath(database))
    for flags in ("mode=ro", "mode=ro&immutable=1"):
        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?{flags}", uri=True)) as db:
                tables = {row[0] for row in db.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table'")}
                # Optuna stamps the schema's version last: a tune killed before then left
                # tables that Optuna, opened read-only, would try to finish setting up.
                stamped = "alembic_version" in tables and db.execute(
                    "SELECT count(*) FROM alembic_version").fetchone()[0] > 0
            break
        except sqlite3.OperationalError as e:
            problem = str(e)
        except sqlite3.DatabaseError as e:
            raise OptionError(f"{label}: not a graphopt knowledge base (SQLite: {e})") from None
    else:
        raise OptionError(f"{label}: cannot open the storage ({problem})")
    # What a tune interrupted before Optuna made its tables, or finished them, leaves.
    if not tables or _OPTUNA_TABLES <= tables and not stamped:
        raise OptionError(f"{label}: an empty knowledge base, with no tuning results yet "
                          "(`graphopt tune` fills it; an interrupted one can leave it empty)")
    if not _OPTUNA_TABLES <= tables:
        raise OptionError(f"{label}: not a graphopt knowledge base (an SQLite file without "
                          "tuning studies)")
    # Decoded twice, by SQLAlchemy and then by SQLite's URI parser: quoted twice.
    return f"sqlite:///file:{quote(path, safe='/')}?{flags}&uri=true"


@contextlib.contextmanager
def _storage_errors(label: str, url: str):
    """Opening failures as one-line OptionErrors: a missing driver, a damaged SQLite file, a
    server that refuses the connection."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import DatabaseError, SQLAlchemyError

    try:
        yield
    except ImportError:
        driver = make_url(url).get_dialect().driver
        raise OptionError(f"{label}: the Python database driver '{driver}' this URL needs is "
                          "not installed") from None
    except SQLAlchemyError as e:
        cause = e.orig if isinstance(e, DatabaseError) and e.orig is not None else e
        reason = str(cause).splitlines()[0]
        if url.startswith("sqlite:") and "not a database" in reason:
            problem = f"not a graphopt knowledge base (SQLite: {reason})"
        else:
            problem = f"cannot open the storage ({reason})"
        raise OptionError(f"{label}: {problem}") from None


def failure_reason(error: BaseException) -> str | None:
    """What went wrong in the database behind a storage error Optuna or SQLAlchemy raised
    after the storage opened (a damaged SQLite page, a dropped server connection): the first
    line of the innermost database error; None for any other error."""
    if not type(error).__module__.startswith(("optuna", "sqlalchemy")):
        return None
    from sqlalchemy.exc import SQLAlchemyError

    reason, seen = None, error
    while seen is not None:
        if isinstance(seen, SQLAlchemyError) or type(seen).__module__ == "sqlite3" or \
                "DatabaseError" in type(seen).__name__:
            cause = getattr(seen, "orig", None) or seen
            reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        seen = seen.__cause__ or seen.__context__
    if reason is None and isinstance(error, optuna.exceptions.StorageInternalError):
        reason = str(error).splitlines()[0]
    return reason


def _enable_wal(storage: optuna.storages.RDBStorage) -> None:
    from sqlalchemy import event

    def on_connect(connection, _record) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    event.listen(storage.engine, "connect", on_connect)
    storage.engine.dispose()  # connections opened before the listener reopen with WAL


def optimize_failing_on_interrupt(study: optuna.Study, objective, **options) -> None:
    """study.optimize(objective, **options); on Ctrl-C, a trial this process started and left
    running is marked failed. Optuna fails the trial whose objective Ctrl-C interrupts, but
    not one interrupted in its own bookkeeping around it (sampling, the storage's commits),
    which then stayed RUNNING until the heartbeat grace period, and a rerun within it did
    not queue the default again. A trial counts as started from the moment the storage
    creates it (or a queued one is taken): one stopped in between, before the objective ran,
    had been left running, about one Ctrl-C in 16."""
    started: list[int] = []
    storage = study._storage
    create, set_state = storage.create_new_trial, storage.set_trial_state_values

    # A Ctrl-C inside the storage's commit of a new trial lands after the row is written and
    # before its id is returned (one stop in 16 at the command line): it waits until the id
    # is noted.
    def created(*args, **kwargs):
        with interrupts_deferred():
            trial_id = create(*args, **kwargs)
            started.append(trial_id)
        return trial_id

    def taken(trial_id, state, *args, **kwargs):  # a queued trial popped to run
        with interrupts_deferred():
            changed = set_state(trial_id, state, *args, **kwargs)
            if changed and state == optuna.trial.TrialState.RUNNING:
                started.append(trial_id)
        return changed

    hidden = {name: vars(storage)[name] for name in ("create_new_trial", "set_trial_state_values")
              if name in vars(storage)}  # a wrapper of a caller's own, put back after
    storage.create_new_trial, storage.set_trial_state_values = created, taken
    # A worker asked to stop (its parent's terminate()) ends after the trial it runs.
    options["callbacks"] = [*options.get("callbacks", ()), stop_if_asked]
    try:
        study.optimize(objective, **options)
    except BaseException as exc:
        # Optuna, interrupted while it records a trial, raises an error of its own on top
        # (UnboundLocalError): the KeyboardInterrupt is behind it.
        interrupt = interrupt_behind(exc)
        if interrupt is None:
            raise
        _stop_heartbeats(started)
        _end_open_transaction(storage)
        for trial_id in started:
            with contextlib.suppress(Exception):  # the storage may be what failed
                if storage.get_trial(trial_id).state == optuna.trial.TrialState.RUNNING:
                    set_state(trial_id, optuna.trial.TrialState.FAIL)
        if interrupt is exc:
            raise
        # A library caller catches KeyboardInterrupt, not Optuna's UnboundLocalError on top of it.
        raise interrupt.with_traceback(None) from exc
    finally:  # the storage's own methods again (instance attributes hid them)
        del storage.create_new_trial, storage.set_trial_state_values
        vars(storage).update(hidden)


def _stop_heartbeats(trial_ids: list[int]) -> None:
    """Stop the heartbeat threads of these trials that a Ctrl-C orphaned: one landing as Optuna
    started a trial's heartbeat thread, before its `with` took it, left the thread beating (and
    holding a database connection) for the life of the process."""
    import threading

    try:  # Optuna's own module: a release without it has nothing to stop here
        from optuna.storages._heartbeat import HeartbeatThread
    except ImportError:
        return
    wanted = set(trial_ids)
    for thread in threading.enumerate():
        args = getattr(thread, "_args", None)
        if getattr(thread, "_target", None) is HeartbeatThread._record_heartbeat and args \
                and args[0] in wanted:
            args[2].set()
            with contextlib.suppress(RuntimeError):  # one still starting ends by itself
                thread.join(timeout=1)


def _end_open_transaction(storage) -> None:
    """Roll back the database session an interrupt left inside a transaction: on an SQLite
    file its write lock stays held, and marking the trial failed, on another connection,
    would wait for it until SQLite's 60 s timeout."""
    backend = getattr(storage, "_backend", storage)  # Optuna's cache wraps an RDB storage
    session = getattr(backend, "scoped_session", None)
    if session is not None:
        with contextlib.suppress(Exception):
            session.remove()


def fail_silent_trials(study: optuna.Study) -> int:
    """Mark failed the RUNNING trials whose worker is plainly dead: those whose heartbeat
    stopped more than GRACE_S ago, and those that never beat one and started more than
    GRACE_S ago (a worker killed after creating its trial but before its heartbeat thread's
    first write, which Optuna's own stale check never sees, and which would stay RUNNING,
    counted, for ever). Returns how many never beat.

    Optuna fails the stale ones itself, but only inside study.optimize: a rerun deciding
    beforehand whether the default trial is still pending saw a killed one as RUNNING."""
    with warnings_as("ignore", optuna.exceptions.ExperimentalWarning):
        optuna.storages.fail_stale_trials(study)
    storage = study._storage
    # Optuna wraps an RDB storage in a cache: the query goes to the database behind it, the
    # update through the cache, which then knows.
    engine = getattr(getattr(storage, "_backend", storage), "engine", None)
    if engine is None:
        return 0
    import datetime

    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    if not running:
        return 0
    try:
        with engine.connect() as connection:
            beating = {row[0] for row in connection.execute(text(
                "SELECT trial_id FROM trial_heartbeats"))}
    except SQLAlchemyError:  # an Optuna schema without heartbeats: nothing to judge by
        return 0
    now, failed = datetime.datetime.now(), 0
    for trial in running:
        started = trial.datetime_start
        if trial._trial_id in beating or started is None \
                or (now - started).total_seconds() <= GRACE_S:
            continue
        try:
            failed += bool(storage.set_trial_state_values(trial._trial_id,
                                                          optuna.trial.TrialState.FAIL))
        except optuna.exceptions.UpdateFinishedTrialError:  # it finished meanwhile
            continue
    return failed


# The setup locks this thread holds, by URL: taken again inside, a lock is already held (an
# inner flock's release would drop the outer one, and a second advisory lock would wait for
# the first for ever).
_held = threading.local()
# Threads of one process share the file an flock is taken on, which an flock does not keep
# apart: they wait on a lock of the process first.
_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


@contextlib.contextmanager
def setup_lock(url: str):
    """Hold an exclusive lock on a knowledge base while a process sets it up (Optuna's
    tables, a study's default trial) or adds to it what it checked was missing (kb import):
    two `graphopt tune` runs started together otherwise both created the tables (one
    failed), or both queued the default. On an SQLite file an flock, which SQLite's own
    byte-range locks ignore; on a PostgreSQL server an advisory lock of the database's;
    other servers' setup is not locked. Reentrant within a thread; other threads wait."""
    held = getattr(_held, "urls", None)
    if held is None:
        held = _held.urls = set()
    if url in held:
        yield
        return
    with _thread_locks_guard:
        in_process = _thread_locks.setdefault(url, threading.Lock())
    with in_process:
        held.add(url)
        try:
            yield from _setup_lock(url)
        finally:
            held.discard(url)


def _setup_lock(url: str):
    from sqlalchemy.engine import make_url

    if url.startswith("postgresql"):
        yield from _postgres_setup_lock(url)
        return
    database = make_url(url).database if url.startswith("sqlite:") else None
    if database in (None, "", ":memory:"):
        yield
        return
    import fcntl

    try:
        handle = file_handle(os.path.abspath(database), create=True)
    except OSError:  # a dangling link, an unwritable folder: Optuna's open says why
        yield
        return
    fcntl.flock(handle, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)


# The advisory lock's key: "graphopt" in ASCII, as a signed 64-bit integer.
_SETUP_LOCK_KEY = int.from_bytes(b"graphopt", "big", signed=True)


def _postgres_setup_lock(url: str):
    """pg_advisory_lock for the setup, on a connection of its own; no lock when the server
    cannot be reached (opening the storage then says why)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.pool import NullPool

    engine = None
    try:
        engine = create_engine(url, poolclass=NullPool)
        connection = engine.connect()
        connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _SETUP_LOCK_KEY})
    except (SQLAlchemyError, ImportError):
        if engine is not None:
            engine.dispose()
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(SQLAlchemyError):
            connection.execute(text("SELECT pg_advisory_unlock(:key)"),
                               {"key": _SETUP_LOCK_KEY})
        connection.close()
        engine.dispose()


# One descriptor per process and file, never closed: closing any descriptor of the database
# file drops every POSIX lock SQLite holds on it in this process (a second writer then
# corrupted the file). A process of its own opens its own, so the flocks exclude each other.
_HANDLES: dict[tuple[int, str], int] = {}


def file_handle(path: str, create: bool = False) -> int:
    """This process's descriptor of `path`, for flock and reads (see _HANDLES); reopened when
    the path now names another file."""
    key = (os.getpid(), path)
    handle = _HANDLES.get(key)
    if handle is not None and os.path.exists(path) \
            and os.fstat(handle).st_ino == os.stat(path).st_ino:
        return handle
    if handle is not None and not _in_use(path):  # the file it names was replaced
        os.close(_HANDLES.pop(key))
    # A stale descriptor that an open storage may still use stays open: its file may carry an
    # SQLite connection's locks. SQLite takes the empty file O_CREAT may make as a new database.
    _HANDLES[key] = os.open(path, os.O_RDONLY | (os.O_CREAT if create else 0), 0o644)
    return _HANDLES[key]


def _database_file(engine) -> str | None:
    """The absolute path of the SQLite file behind `engine` (a plain or a `file:` URI URL)."""
    database = engine.url.database
    if engine.url.get_backend_name() != "sqlite" or database in (None, "", ":memory:"):
        return None
    if database.startswith("file:"):
        from urllib.parse import unquote

        database = unquote(database[len("file:"):].partition("?")[0])
    return os.path.abspath(database)


def _in_use(path: str) -> bool:
    """Whether a storage this process opened, and has not closed, reads the file at `path`."""
    return any(_database_file(engine) == path for engine in list(_OPEN_SQLITE))


def _release_handle(path: str | None) -> None:
    """Close this process's descriptor of `path` once no storage it opened reads the file: a
    compile service that rotates its knowledge base would otherwise keep one per file."""
    if path is None or _in_use(path):
        return
    handle = _HANDLES.pop((os.getpid(), path), None)
    if handle is not None:
        os.close(handle)
