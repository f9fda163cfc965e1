"""The tuning storage and knowledge-base files as the user names them (`tune`, `kb`, `report`,
`optimize --tuning-db`): a file that is no database, an unknown URL scheme, a missing file or
directory, an unwritable export, a model tuned with dynamic dims and the --plot picture are
one-line errors or labelled output, never internal errors or stray files."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import sqlite3
import struct
import zlib

import numpy as np
import onnx
import onnx.helper as oh
import optuna
import pytest

from graphopt.errors import InputError, OptionError
from graphopt.tuner import kb
from graphopt.tuner.storage import open_storage, storage_url
from helpers import IR_VERSION, run_cli

NOT_A_DB = "not a graphopt knowledge base (SQLite: file is not a database)"


def conv_model(path, batch=1) -> str:
    """Two 3×3 convs, 16 → 16 channels at 32×32: one NPU cube-kernel signature on ascend310;
    `batch` may be a symbolic dim name."""
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [batch, 16, 32, 32])
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [batch, 16, 32, 32])
    weights = [onnx.numpy_helper.from_array(np.full((16, 16, 3, 3), 0.01, "float32"), name)
               for name in ("w1", "w2")]
    nodes = [oh.make_node("Conv", ["x", "w1"], ["h"], name="conv1", pads=[1, 1, 1, 1]),
             oh.make_node("Relu", ["h"], ["r"], name="relu"),
             oh.make_node("Conv", ["r", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    graph = oh.make_graph(nodes, "two_convs", [x], [y], weights)
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)],
                            ir_version=IR_VERSION), path)
    return str(path)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A model, its ascend310 .om and a small knowledge base tuned for it."""
    from graphopt.cli import main

    root = tmp_path_factory.mktemp("kb_errors")
    model = conv_model(root / "m.onnx")
    om, db = str(root / "m.om"), str(root / "kb.db")
    assert main(["optimize", model, "-o", om, "--target", "ascend310", "-q"]) == 0
    assert main(["tune", model, "--target", "ascend310", "--trials", "4", "--tuning-db", db,
                 "-q"]) == 0
    return {"model": model, "om": om, "db": db}


def commands(built, out_dir, flag, storage):
    """Every command that opens a tuning storage, each with `flag storage`."""
    return {
        "tune": ["tune", built["model"], "--target", "ascend310", "--trials", "2", flag, storage],
        "kb list": ["kb", "list", flag, storage],
        "kb export": ["kb", "export", out_dir / "kb.json", flag, storage],
        "report": ["report", built["om"], "-o", out_dir / "r.html", flag, storage],
        "optimize": ["optimize", built["model"], "-o", out_dir / "x.om", "--target",
                     "ascend310", flag, storage],
    }


def assert_user_error(rc, err, expected):
    assert rc == 1, err
    assert "internal error" not in err
    assert err.startswith(f"graphopt: error: {expected}"), err
    assert err.count("\n") == 1, err   # one line


# --- 1. a file that is not a database ----------------------------------------------------------


@pytest.mark.parametrize("command", ["tune", "kb list", "kb export", "report", "optimize"])
def test_a_file_that_is_no_database_is_named(built, tmp_path, capsys, command):
    junk = tmp_path / "notdb.db"
    junk.write_text("hello\n")
    argv = commands(built, tmp_path, "--tuning-db", str(junk))[command]
    rc, _, err = run_cli(capsys, *argv)
    assert_user_error(rc, err, f"--tuning-db {junk}: {NOT_A_DB}")
    assert junk.read_text() == "hello\n"                 # left as it was
    assert not (tmp_path / "x.om").exists() and not (tmp_path / "kb.json").exists()


def test_another_programs_database_is_not_given_tables(built, tmp_path, capsys):
    app = tmp_path / "app.db"
    with contextlib.closing(sqlite3.connect(app)) as db:
        db.execute("CREATE TABLE users (id INTEGER)")
        db.commit()
    before = app.read_bytes()
    rc, _, err = run_cli(capsys, "tune", built["model"], "--target", "ascend310", "--trials", "1",
                         "--tuning-db", app)
    assert rc == 1 and "another program's SQLite database (tables users)" in err, err
    assert app.read_bytes() == before


def test_a_read_only_knowledge_base_is_refused_before_the_compile(built, tmp_path, capsys,
                                                                   monkeypatch):
    import graphopt.compiler
    from graphopt.tuner import storage

    # As on a read-only mount (root may write a 0444 file, so access is what is asked).
    real = storage.os.access
    monkeypatch.setattr(storage.os, "access", lambda path, mode: False
                        if os.fspath(path) == built["db"] and mode == os.W_OK
                        else real(path, mode))
    compiled = []
    monkeypatch.setattr(graphopt.compiler, "optimize", lambda *a, **k: compiled.append(1))
    for argv in (["tune", built["model"], "--target", "ascend310", "--trials", "1"],
                 ["kb", "import", tmp_path / "kb.json"]):
        rc, _, err = run_cli(capsys, *argv, "--tuning-db", built["db"])
        assert_user_error(rc, err, f"--tuning-db {built['db']}: read-only; tuning writes its "
                                   "trials into it")
    assert compiled == []


def test_a_damaged_sqlite_file_is_named_too(tmp_path):
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(b"SQLite format 3\x00" + b"\x01" * 200)  # the header, then garbage
    with pytest.raises(OptionError, match=f"--storage {damaged}: not a graphopt knowledge base"):
        open_storage(str(damaged), option="--storage")
    empty = tmp_path / "empty.db"
    empty.touch()                                        # SQLite's empty database: accepted
    assert kb.list_kb(open_storage(str(empty))) == []


@pytest.mark.parametrize("command", ["tune", "kb list", "kb export", "optimize"])
def test_a_database_damaged_inside_is_a_one_line_error(built, tmp_path, capsys, command):
    # Its header and tables read fine; a page Optuna's queries reach is garbage. The storage
    # opens, and the failure comes later, from inside Optuna.
    damaged = tmp_path / "inside.db"
    damaged.write_bytes(open(built["db"], "rb").read())
    with open(damaged, "r+b") as f:
        f.seek(4096)
        f.write(b"\xff" * 4096)
    argv = commands(built, tmp_path, "--tuning-db", str(damaged))[command]
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 1 and "internal error" not in err, err
    assert "database disk image is malformed" in err and err.count("\n") == 1, err


def test_an_error_optuna_raises_while_cleaning_up_after_the_database_is_named(
        built, tmp_path, capsys, monkeypatch):
    # A server that went away mid-trial: Optuna's trial loop raises an UnboundLocalError of
    # its own from its `finally`, on top of the storage's error.
    import sqlalchemy.exc

    def cleanup_fails(*_, **__):
        try:
            try:
                raise sqlalchemy.exc.OperationalError("UPDATE trials", {}, Exception(
                    "server closed the connection unexpectedly"))
            except sqlalchemy.exc.OperationalError as exc:
                raise optuna.exceptions.StorageInternalError("An exception is raised during "
                                                             "the commit") from exc
        finally:
            raise UnboundLocalError("cannot access local variable 'updated_state'")

    monkeypatch.setattr(kb, "list_kb", cleanup_fails)
    rc, _, err = run_cli(capsys, "kb", "list", "--tuning-db", built["db"])
    assert_user_error(rc, err, f"the tuning storage failed (--tuning-db {built['db']}): server "
                               "closed the connection unexpectedly")


def test_a_storage_error_in_a_background_thread_is_one_line(built, capsys, monkeypatch):
    import threading

    import sqlalchemy.exc

    def beat():
        raise sqlalchemy.exc.OperationalError("INSERT INTO trial_heartbeats", {},
                                              Exception("database is locked"))

    def list_with_a_heartbeat(*args, **kwargs):
        thread = threading.Thread(target=beat)
        thread.start()
        thread.join()
        return []

    monkeypatch.setattr(kb, "list_kb", list_with_a_heartbeat)
    rc, _, err = run_cli(capsys, "kb", "list", "--tuning-db", built["db"])
    assert rc == 0
    assert err == ("graphopt: warning: the tuning storage failed in a background thread: "
                   "database is locked\n")


WITHOUT_STUDIES = "not a graphopt knowledge base (an SQLite file without tuning studies)"
EMPTY = "an empty knowledge base, with no tuning results yet"


@pytest.mark.parametrize("command", ["kb list", "kb export", "report", "optimize"])
def test_reading_an_sqlite_file_without_studies_is_refused_and_leaves_it_alone(
        built, tmp_path, capsys, command):
    # Opened for writing, Optuna would add its tables to another program's database (or turn
    # an empty file into one) and list nothing.
    other, empty = tmp_path / "other.db", tmp_path / "empty.db"
    with contextlib.closing(sqlite3.connect(other)) as db:
        db.execute("CREATE TABLE users (id INTEGER)")
        db.commit()
    empty.touch()
    # Tables made, but the schema's version not stamped yet: a tune killed mid-setup.
    unstamped = tmp_path / "unstamped.db"
    optuna.create_study(storage=f"sqlite:///{unstamped}")
    with contextlib.closing(sqlite3.connect(unstamped)) as db:
        db.execute("DELETE FROM alembic_version")
        db.commit()
    for path, problem in ((other, WITHOUT_STUDIES), (empty, EMPTY), (unstamped, EMPTY)):
        before = path.read_bytes()
        rc, _, err = run_cli(capsys, *commands(built, tmp_path, "--tuning-db", str(path))[command])
        assert_user_error(rc, err, f"--tuning-db {path}: {problem}")
        assert path.read_bytes() == before


def test_reading_commands_leave_the_knowledge_base_unchanged(built, tmp_path, capsys):
    db = tmp_path / "kb.db"
    # The backup API: the tuned trials may still sit in the source's write-ahead log.
    with contextlib.closing(sqlite3.connect(built["db"])) as source, \
            contextlib.closing(sqlite3.connect(db)) as copy:
        source.backup(copy)
    before = db.read_bytes()
    for name, argv in commands(built, tmp_path, "--tuning-db", str(db)).items():
        if name != "tune":
            rc, _, err = run_cli(capsys, *argv)
            assert rc == 0, (name, err)
    assert db.read_bytes() == before
    assert "ascend310/conv/" in (tmp_path / "kb.json").read_text()


# --- 2. URLs -----------------------------------------------------------------------------------


# optimize's --storage had errors name --tuning-db, the other flag of its one keyword.
@pytest.mark.parametrize("flag", ["--storage", "--tuning-db"])
@pytest.mark.parametrize("command", ["tune", "kb list", "report", "optimize"])
def test_an_unknown_url_scheme_names_the_url_and_the_schemes_that_work(built, tmp_path, capsys,
                                                                      command, flag):
    rc, _, err = run_cli(capsys, *commands(built, tmp_path, flag, "bogus://x")[command])
    assert_user_error(rc, err, f"{flag} bogus://x: unknown storage scheme 'bogus'")
    assert "sqlite:///" in err and "postgresql://" in err and "mysql://" in err


def test_a_storage_that_is_no_url_is_refused(built, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli(capsys, "kb", "list", "--storage", "plain.db")
    assert_user_error(rc, err, "--storage plain.db: not a storage URL")
    assert "--tuning-db FILE.db" in err and not (tmp_path / "plain.db").exists()
    with pytest.raises(OptionError, match="--storage ://x: not a storage URL"):
        storage_url("://x", option="--storage")


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite:///:memory:"])
@pytest.mark.parametrize("command", ["tune", "kb list", "kb import"])
def test_an_in_memory_sqlite_url_is_refused(built, tmp_path, capsys, command, url):
    # Each connection sees its own empty database: "no such table: studies", or nothing kept.
    argv = {"tune": ["tune", built["model"], "--target", "ascend310", "--trials", "1"],
            "kb list": ["kb", "list"], "kb import": ["kb", "import", tmp_path / "x.json"]}
    (tmp_path / "x.json").write_text('{"format": "graphopt-kb/1", "kernels": {}}')
    rc, _, err = run_cli(capsys, *argv[command], "--storage", url)
    assert_user_error(rc, err, f"--storage {url}: an in-memory SQLite database lasts as long "
                               "as its connection")


def test_an_empty_tuning_db_is_named(built, capsys):
    rc, _, err = run_cli(capsys, "kb", "list", "--tuning-db", "")
    assert_user_error(rc, err, "--tuning-db: empty; give a knowledge-base file or a storage URL")


def test_a_server_that_refuses_the_connection_is_an_option_error():
    # Port 1 on the loopback: refused at once (or, without the driver, a missing driver).
    url = "postgresql://graphopt@127.0.0.1:1/kb"
    with pytest.raises(OptionError, match=f"^--storage {url}: "):
        open_storage(url, option="--storage")


def test_tune_names_a_refusing_server_by_the_flag_given(built, capsys):
    url = "postgresql://graphopt@127.0.0.1:1/kb"
    rc, _, err = run_cli(capsys, "tune", built["model"], "--target", "ascend310", "--trials", "2",
                         "--storage", url, "-q")
    assert_user_error(rc, err, f"--storage {url}: ")


@pytest.mark.skipif(importlib.util.find_spec("MySQLdb") is not None,
                    reason="the mysqlclient driver is installed here")
def test_a_missing_database_driver_is_named():
    with pytest.raises(OptionError, match="driver 'mysqldb' this URL needs is not installed"):
        open_storage("mysql://graphopt@127.0.0.1:1/kb", option="--storage")


# --- 3. the JSON files of kb import and export -------------------------------------------------


def test_kb_import_of_a_missing_or_unreadable_file_names_it(tmp_path, capsys):
    db = tmp_path / "kb.db"
    rc, _, err = run_cli(capsys, "kb", "import", tmp_path / "nonexist.json", "--tuning-db", db)
    assert_user_error(rc, err, f"{tmp_path / 'nonexist.json'}: no such file")
    rc, _, err = run_cli(capsys, "kb", "import", tmp_path, "--tuning-db", db)
    assert_user_error(rc, err, f"{tmp_path}: cannot read it")
    rc, _, err = run_cli(capsys, "kb", "import", "", "--tuning-db", db)  # an unset variable
    assert rc == 2 and "argument FILE.json: an empty path" in err, err
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(InputError, match="broken.json: not a graphopt knowledge-base export"):
        kb.import_kb(broken, str(db))
    # A binary file (a model given for the export): said so, not Python's codec message.
    broken.write_bytes(b'{"format": "\xc3(')
    with pytest.raises(InputError, match=r"broken.json: not a graphopt knowledge-base export "
                                         r"\(not UTF-8 text: byte 12\)$"):
        kb.import_kb(broken, str(db))
    # A knowledge base given where its export goes (to merge two): a decode error had said so.
    other = tmp_path / "other.db"
    import sqlite3

    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    rc, _, err = run_cli(capsys, "kb", "import", other, "--tuning-db", db)
    assert_user_error(rc, err, f"{other}: an SQLite database (a knowledge base itself), not a "
                               f"`kb export` file; to merge it: graphopt kb export - --tuning-db "
                               f"{other} | graphopt kb import - --tuning-db …")
    broken.write_text('{"format": "graphopt-kb/9", "kernels": {}}')
    with pytest.raises(OptionError, match=r"\(format graphopt-kb/1, this file says "
                                          r"'graphopt-kb/9'\)"):
        kb.import_kb(broken, str(db))
    assert not db.exists()  # nothing was imported, so no database was made


def test_kb_import_of_a_kernel_listed_twice_is_refused(built, tmp_path):
    # json kept the last of the two entries silently: one tiling was dropped unsaid.
    export = tmp_path / "kb.json"
    kb.export_kb(built["db"], export)
    (name, entry), = json.loads(export.read_text())["kernels"].items()
    other = dict(entry, tiling=dict(entry["tiling"], base_k=16))
    export.write_text('{"format": "graphopt-kb/1", "kernels": {%s: %s, %s: %s}}' % (
        json.dumps(name), json.dumps(entry), json.dumps(name), json.dumps(other)))
    db = tmp_path / "new.db"
    with pytest.raises(InputError, match=f"kb.json: '{name}' is given twice"):
        kb.import_kb(export, f"sqlite:///{db}")
    assert not db.exists()


def test_kb_import_of_a_damaged_entry_names_it_and_imports_nothing(built, tmp_path):
    export = tmp_path / "kb.json"
    kb.export_kb(built["db"], export)
    doc = json.loads(export.read_text())
    (name, entry), = doc["kernels"].items()
    good_tiling = dict(entry["tiling"])
    del entry["tiling"]["base_k"]
    doc["kernels"]["ascend310/gemm/b1_m32_k32_n32/float16"] = dict(entry, tiling={})
    export.write_text(json.dumps(doc))
    db = tmp_path / "new.db"
    with pytest.raises(OptionError, match=f"kernel '{name}': its tiling lacks base_k$"):
        kb.import_kb(export, f"sqlite:///{db}")
    assert not db.exists()  # checked before anything was written
    # No tiling at all, and a value of the wrong kind: named without Python's exception names.
    doc["kernels"] = {name: {k: v for k, v in entry.items() if k != "tiling"}}
    export.write_text(json.dumps(doc))
    with pytest.raises(OptionError, match=f"kernel '{name}': no \"tiling\" object"):
        kb.import_kb(export, f"sqlite:///{db}")
    doc["kernels"] = {name: "x"}  # an internal error: 'str' object has no attribute 'get'
    export.write_text(json.dumps(doc))
    with pytest.raises(OptionError, match=f"kernel '{name}': expected an object with its "
                                          "\"tiling\", got str"):
        kb.import_kb(export, f"sqlite:///{db}")
    doc["kernels"] = {name: dict(entry, tiling=dict(good_tiling, cores_per_block=2))}
    export.write_text(json.dumps(doc))
    with pytest.raises(OptionError, match=f"kernel '{name}': its tiling has no field "
                                          "'cores_per_block'"):
        kb.import_kb(export, f"sqlite:///{db}")
    doc["kernels"] = {name: dict(entry, tiling=dict(good_tiling, base_m="big"))}
    export.write_text(json.dumps(doc))
    with pytest.raises(OptionError, match=f"kernel '{name}': not an exported tiling "
                                          r"\(base_m must be integers"):
        kb.import_kb(export, f"sqlite:///{db}")
    # A boolean where a count belongs (JSON's true is Python's 1), an unknown dtype.
    doc["kernels"] = {name: dict(entry, tiling=dict(good_tiling, cores=True))}
    export.write_text(json.dumps(doc))
    with pytest.raises(OptionError, match=f"kernel '{name}': .*cores must be integers"):
        kb.import_kb(export, f"sqlite:///{db}")
    doc["kernels"] = {name.replace("float16", "float99"): dict(entry, tiling=good_tiling)}
    export.write_text(json.dumps(doc))
    with pytest.raises(OptionError, match="unknown dtype 'float99'"):
        kb.import_kb(export, f"sqlite:///{db}")
    doc["kernels"] = {name.replace("float16", "float32"): dict(entry, tiling=good_tiling)}
    export.write_text(json.dumps(doc))
    with pytest.raises(OptionError, match="float32 kernels compute in float16, which a "
                                          "signature names"):
        kb.import_kb(export, f"sqlite:///{db}")
    # A dtype the cube lacks, a name no compile looks up, a dim no kernel has, no cube at all.
    for kernel, message in (
            (name.replace("float16", "bfloat16"), "the ascend310 cube computes float16, int8, "
                                                  "not bfloat16"),
            (name.replace("_m", "_m0"), "not the signature graphopt writes for that kernel "
                                        f"\\({re.escape(name)}\\)"),
            # 2**40 output pixels: a whole number of the conv's 32×32 outputs, past int32.
            (re.sub(r"_m\d+", f"_m{2 ** 40}", name), "a dim above 2147483647"),
            # A geometry its GEMM cannot have.
            (name.replace("_f3x3", "_f5x5"), ".*K 144 is not a whole number of 5x5 kernels"),
            (name.replace("ascend310", "cpu"), "target cpu has no NPU cube")):
        doc["kernels"] = {kernel: dict(entry, tiling=good_tiling)}
        export.write_text(json.dumps(doc))
        with pytest.raises(OptionError, match=f"kernel '{re.escape(kernel)}': {message}"):
            kb.import_kb(export, f"sqlite:///{db}")
    assert not db.exists()
    # The times are this cost model's: an edited 1e-12 s cannot outrank tuned tilings.
    doc["kernels"] = {name: dict(entry, tiling=good_tiling, seconds=1e-12,
                                 default_seconds="fast")}
    export.write_text(json.dumps(doc))
    assert kb.import_kb(export, f"sqlite:///{db}") == 1
    (row,) = kb.list_kb(f"sqlite:///{db}")
    assert row["best_seconds"] == pytest.approx(entry["seconds"])
    assert row["default_seconds"] == pytest.approx(entry["default_seconds"])
    db.unlink()
    export.write_text(json.dumps(dict(doc, kernels=[])))
    with pytest.raises(OptionError, match="no 'kernels' object"):
        kb.import_kb(export, f"sqlite:///{db}")


def test_kb_export_into_a_missing_directory_names_it(built, tmp_path, capsys):
    target = tmp_path / "nonexist" / "kb.json"
    rc, _, err = run_cli(capsys, "kb", "export", target, "--tuning-db", built["db"])
    assert_user_error(rc, err, f"kb export {target}: directory {tmp_path / 'nonexist'} does "
                               "not exist")
    rc, _, err = run_cli(capsys, "kb", "export", tmp_path, "--tuning-db", built["db"])
    assert_user_error(rc, err, f"kb export {tmp_path}: is a directory")
    rc, _, err = run_cli(capsys, "kb", "export", built["db"], "--tuning-db", built["db"])
    assert_user_error(rc, err, f"kb export {built['db']}: would overwrite the knowledge base")
    assert kb.list_kb(open_storage(built["db"], read_only=True))


def test_kb_export_replaces_no_other_database_or_model(built, tmp_path, capsys):
    # Only the --tuning-db file itself was refused: another knowledge base (21 studies) or an
    # .onnx became JSON, exit 0.
    other = tmp_path / "other.db"
    other.write_bytes(open(built["db"], "rb").read())
    model = tmp_path / "m.onnx"
    model.write_bytes(open(built["model"], "rb").read())
    for path, why in ((other, "is an SQLite database"), (model, "exists and is not a "
                                                         "knowledge-base export")):
        before = path.read_bytes()
        rc, _, err = run_cli(capsys, "kb", "export", path, "--tuning-db", built["db"])
        assert_user_error(rc, err, f"kb export {path}: {why}")
        assert path.read_bytes() == before
    export = tmp_path / "kb.json"
    for _ in range(2):  # an earlier export is replaced
        rc, _, err = run_cli(capsys, "kb", "export", export, "--tuning-db", built["db"])
        assert rc == 0, err


def test_kb_export_is_atomic(built, tmp_path, monkeypatch):
    out = tmp_path / "kb.json"
    previous = '{"format": "graphopt-kb/1", "kernels": {}}\n'  # the previous export
    out.write_text(previous)

    def unserializable(tiling):
        return object()  # json cannot write it: the export fails part way

    monkeypatch.setattr(kb, "tiling_params", unserializable)
    with pytest.raises(TypeError):
        kb.export_kb(built["db"], out)
    assert out.read_text() == previous
    assert os.listdir(tmp_path) == ["kb.json"]          # no temporary file left behind
    monkeypatch.undo()
    assert kb.export_kb(built["db"], out) == 1
    assert json.loads(out.read_text())["format"] == kb.FORMAT


# --- 4. paths that do not exist ----------------------------------------------------------------


def test_tune_refuses_a_tuning_db_in_a_missing_directory(built, tmp_path, capsys):
    db = tmp_path / "nonexist" / "t.db"
    rc, _, err = run_cli(capsys, "tune", built["model"], "--target", "ascend310",
                         "--tuning-db", db)
    assert_user_error(rc, err, f"--tuning-db {db}: directory {db.parent} does not exist")
    assert not db.parent.exists()
    rc, _, err = run_cli(capsys, "tune", built["model"], "--target", "ascend310",
                         "--storage", f"sqlite:///{db}")
    assert_user_error(rc, err, f"--storage sqlite:///{db}: directory {db.parent} does not exist")
    assert not db.parent.exists()


def test_only_the_default_storage_directory_is_created(tmp_path, monkeypatch):
    with pytest.raises(OptionError, match="does not exist"):
        storage_url(tmp_path / "nonexist" / "t.db")
    assert not (tmp_path / "nonexist").exists()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert storage_url(None) == f"sqlite:///{tmp_path / 'cache' / 'graphopt' / 'tuning.db'}"
    assert (tmp_path / "cache" / "graphopt").is_dir()


@pytest.mark.parametrize("flag", ["--storage", "--tuning-db"])
@pytest.mark.parametrize("command", ["kb list", "kb export", "report", "optimize"])
def test_reading_a_missing_knowledge_base_is_refused(built, tmp_path, capsys, command, flag):
    missing = tmp_path / "nonexist.db"
    given = f"sqlite:///{missing}" if flag == "--storage" else str(missing)
    rc, _, err = run_cli(capsys, *commands(built, tmp_path, flag, given)[command])
    assert_user_error(rc, err, f"{flag} {given}: no such knowledge base")
    assert "creates one" in err and not missing.exists()


def test_reading_the_default_knowledge_base_before_any_tune_says_so(tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    default = tmp_path / "cache" / "graphopt" / "tuning.db"
    for argv in (["kb", "list"], ["kb", "export", tmp_path / "kb.json"]):
        rc, _, err = run_cli(capsys, *argv)
        assert_user_error(rc, err, f"the default knowledge base {default} does not exist yet "
                                   "(`graphopt tune` creates it")
    assert not default.exists()


def test_a_directory_is_no_knowledge_base(built, tmp_path, capsys):
    rc, _, err = run_cli(capsys, "kb", "list", "--tuning-db", tmp_path)
    assert_user_error(rc, err, f"--tuning-db {tmp_path}: is a directory")
    # optimize called it "no such knowledge base", as if it did not exist
    rc, _, err = run_cli(capsys, "optimize", built["model"], "-o", tmp_path / "m.om",
                         "--target", "ascend310", "--tuning-db", tmp_path)
    assert_user_error(rc, err, f"--tuning-db {tmp_path}: is a directory")


def test_a_file_where_the_tuning_db_folder_should_be_is_named_as_such(built, tmp_path, capsys):
    (tmp_path / "afile").touch()
    db = tmp_path / "afile" / "t.db"
    rc, _, err = run_cli(capsys, "tune", built["model"], "--target", "ascend310",
                         "--tuning-db", db)
    assert_user_error(rc, err, f"--tuning-db {db}: directory {db.parent} is a file, not a folder")


def test_report_storage_takes_a_url_only(built, tmp_path, capsys):
    # A plain name was read as a file path and called missing, where tune says what --storage is.
    rc, _, err = run_cli(capsys, "report", built["om"], "-o", tmp_path / "r.html",
                         "--storage", "bad")
    assert_user_error(rc, err, "--storage bad: not a storage URL")


def test_a_plot_into_a_missing_directory_is_refused_before_tuning(built, tmp_path, capsys):
    plot = tmp_path / "nonexist" / "h.png"
    db = tmp_path / "t.db"
    rc, _, err = run_cli(capsys, "tune", built["model"], "--target", "ascend310",
                         "--tuning-db", db, "--plot", plot)
    assert_user_error(rc, err, f"--plot {plot}: directory {plot.parent} does not exist")
    assert not db.exists()  # refused before any trial


# --- 5. dynamic dims ---------------------------------------------------------------------------


def test_tune_of_a_dynamic_model_names_the_inputs_to_pin(tmp_path, capsys):
    model = conv_model(tmp_path / "dyn.onnx", batch="batch")
    db = tmp_path / "t.db"
    rc, _, err = run_cli(capsys, "tune", model, "--target", "ascend310", "--tuning-db", db)
    assert_user_error(rc, err, "--target ascend310: no node of")
    assert "fell back to the cpu for dynamic shapes" in err
    assert "'x' [batch,16,32,32]" in err
    assert 'e.g. --input-shape "x:1,16,32,32"' in err
    # The suggestion works as printed.
    rc, out, err = run_cli(capsys, "tune", model, "--target", "ascend310", "--tuning-db", db,
                           "--trials", "2", "-q", "--input-shape", "x:1,16,32,32")
    assert rc == 0, err
    assert "ascend310/conv/b1_m1024_k144_n16_i32x32_o32x32_f3x3_s1x1_d1x1/float16" in out


# --- 6. the --plot picture ---------------------------------------------------------------------


SERIES = [("ascend310/gemm/b1_m256_k256_n256/float16", [2.9e-5, 2.9e-5, 2.5e-5, 2.4e-5], 2.9e-5),
          ("ascend310/conv/b1_m1024_k144_n16/float16", [float("inf"), 4e-6, 3.5e-6], 4e-6)]


def read_png(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, RGB pixels) of an 8-bit RGB PNG whose rows use filter 0 (the kind
    passes.memory.plot writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        (length,), tag = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if tag == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif tag == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    row = width * 3 + 1
    assert all(raw[y * row] == 0 for y in range(height))
    return width, height, b"".join(raw[y * row + 1:(y + 1) * row] for y in range(height))


def dark(pixels: bytes, width: int, x0: int, y0: int, x1: int, y1: int) -> int:
    """Pixels darker than mid-grey in the box."""
    return sum(1 for y in range(y0, y1) for x in range(x0, x1)
               if sum(pixels[(y * width + x) * 3:(y * width + x) * 3 + 3]) < 300)


def test_png_plot_has_a_title_ticks_axis_labels_and_a_legend(tmp_path):
    from graphopt.tuner.history_plot import draw_histories

    path = tmp_path / "h.png"
    draw_histories(SERIES, str(path))
    width, height, pixels = read_png(path.read_bytes())
    assert (width, height) == (720, 360 + 12 * len(SERIES) + 4)  # legend rows under the plot
    assert dark(pixels, width, 0, 0, width, 30) > 100           # title and y-axis label
    assert dark(pixels, width, 0, 40, 30, 320) > 20             # y tick values left of the axis
    assert dark(pixels, width, 60, 328, width, 356) > 30        # x tick values and "trial"
    assert dark(pixels, width, 70, 360, width, height) > 200    # legend text


def test_plot_names_every_curve_in_its_own_style_and_ends_short_of_the_frame():
    import xml.etree.ElementTree as ET

    from graphopt.tuner.history_plot import histories_svg

    # A ResNet-50's 21 signatures: the 21st was drawn as the first, solid blue.
    series = [(f"k{i}", [2.0, 2.0, 1.0 + i / 100], 2.0) for i in range(21)]
    root = ET.fromstring(histories_svg(series))
    svg = "{http://www.w3.org/2000/svg}"
    texts = [t.text for t in root.iter(f"{svg}text")]
    assert all(any(t.startswith(f"k{i}: ") for t in texts) for i in range(21))
    lines = list(root.iter(f"{svg}polyline"))
    styles = {(p.get("stroke"), p.get("stroke-dasharray")) for p in lines}
    assert len(styles) == 21  # ten hues, again dashed, then dotted
    # A gain on the last trial is drawn inside the plot, not on its right edge.
    frame_right = max(int(line.get("x2")) for line in root.iter(f"{svg}line"))
    last_x = max(int(point.split(",")[0]) for p in lines for point in p.get("points").split())
    assert last_x < frame_right - 50


@pytest.mark.parametrize("trials, ticks", [(1, ["1"]), (6, ["1", "2", "3", "4", "5", "6"]),
                                           (10, ["2", "4", "6", "8", "10"]),
                                           (50, ["1", "10", "20", "30", "40", "50"])])
def test_the_trial_ticks_are_evenly_spaced(trials, ticks):
    import xml.etree.ElementTree as ET

    from graphopt.tuner.history_plot import histories_svg

    # Ten trials were ticked 1, 4, 6, 8, 10.
    root = ET.fromstring(histories_svg([("k", [2.0] * trials, 2.0)]))
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert [t for t in texts if t.isdigit()] == ticks


def test_the_legend_names_thirty_series_and_widens_the_picture_for_a_long_name():
    import xml.etree.ElementTree as ET

    from graphopt.passes.memory.plot import GLYPH_W
    from graphopt.tuner.history_plot import histories_svg

    # MobileNetV2 on ascend910b has 31 signatures: 24 were named, "… and 7 more"; a measured
    # subgraph study's name and ratio ran past the edge of the 720-pixel picture.
    name = "mobilenetv2.onnx on ascend910b -O2 (re-timed side by side: 1.003x)"
    series = [(name, [6.5e-3, 6.4e-3], 6.5e-3)] + [(f"k{i}", [2.0, 1.5], 2.0) for i in range(30)]
    root = ET.fromstring(histories_svg(series, kind="measured"))
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert sum(t.startswith("k") for t in texts) == 29 and "… and 1 more" in texts
    (first,) = [t for t in texts if t.startswith(name)]
    assert 52 + 22 + GLYPH_W * len(first) < int(root.get("width"))


def test_canvas_text_draws_the_glyphs():
    from graphopt.passes.memory.plot import _FONT, GLYPH_W, _Canvas

    canvas = _Canvas(2 * GLYPH_W, 9)
    canvas.text(0, 0, "1?", (0, 0, 0))
    for k, char in enumerate("1?"):
        for r, bits in enumerate(bytes.fromhex(_FONT[char])):
            drawn = [canvas.pixels[(r * canvas.width + k * GLYPH_W + c) * 3] == 0
                     for c in range(5)]
            assert drawn == [bool(bits & (0x10 >> c)) for c in range(5)]
    signature_chars = set("abcdefghijklmnopqrstuvwxyz0123456789/_.:-()µ×…, ")
    assert signature_chars <= set(_FONT)


def test_svg_plot_has_the_same_labels(tmp_path):
    import xml.etree.ElementTree as ET

    from graphopt.tuner.history_plot import histories_svg

    svg = histories_svg(SERIES, kind="measured")
    texts = [t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]
    assert texts[0].startswith("best measured cost so far / default cost")
    # Trials count from 1, as the progress line counts them.
    assert {"cost / default", "trial", "default", "1.00", "1"} <= set(texts)
    assert "0" not in texts
    legend = [t for t in texts if t.startswith("ascend310/")]
    assert legend == ["ascend310/gemm/b1_m256_k256_n256/float16: default 29.00 µs, best "
                      "24.00 µs (1.208x)",
                      "ascend310/conv/b1_m1024_k144_n16/float16: default 4.00 µs, best "
                      "3.50 µs (1.143x)"]


def test_optimize_says_what_the_knowledge_base_gave(built, tmp_path, capsys):
    # 4 trials found no tiling faster than the default for the two convs' one shape: they
    # keep it, and the note says why the knowledge base gave nothing.
    for target, expected in (("ascend310", "tuned tilings for 0 of 2 NPU cube kernel(s) on "
                                           "ascend310; 2 keep the default tiling, which this "
                                           "cost model prices no slower than the best it "
                                           "holds for their shapes\n"),
                             ("ascend910b", "tuned tilings for 0 of 2 NPU cube kernel(s) on "
                                            "ascend910b (graphopt tune")):
        rc, out, err = run_cli(capsys, "optimize", built["model"], "-o", tmp_path / "m.om",
                               "--target", target, "--tuning-db", built["db"])
        assert rc == 0, err
        assert f"note: --tuning-db: {expected}" in out


def test_a_conv_tuned_before_signatures_named_its_geometry_is_not_applied(built, tmp_path,
                                                                          capsys):
    # Until 2026-12-07 a conv's key was its GEMM alone, and its tilings were tuned when the
    # cost model charged its im2col matrix as GM traffic: one key stood for convs now priced
    # apart. A compile applies none of them and says so; kb import leaves them out.
    from graphopt.partition.target import load_target
    from graphopt.tuner.search import open_study
    from graphopt.tuner.signature import parse_signature
    from graphopt.tuner.storage import opened

    legacy = "ascend310/conv/b1_m1024_k144_n16/float16"
    old = tmp_path / "old.db"
    with opened(f"sqlite:///{old}") as store:
        open_study(store, legacy, parse_signature(legacy)[2], load_target("ascend310").device("npu"))
    rc, out, err = run_cli(capsys, "optimize", built["model"], "-o", tmp_path / "m.om",
                           "--target", "ascend310", "--tuning-db", old)
    assert rc == 0, err
    assert "note: --tuning-db: tuned tilings for 0 of 2 NPU cube kernel(s) on ascend310; 2 " \
           "conv(s) have tilings stored only under the GEMM-only signature graphopt wrote " \
           "before 2026-12-07" in out
    rc, out, err = run_cli(capsys, "kb", "export", tmp_path / "old.json", "--tuning-db", old)
    assert rc == 0 and legacy in (tmp_path / "old.json").read_text(), err
    rc, out, err = run_cli(capsys, "kb", "import", tmp_path / "old.json", "--tuning-db",
                           tmp_path / "new.db")
    assert rc == 0, err
    assert out.startswith("imported 0 kernel tiling(s)")
    assert f"left out 1 conv kernel(s) keyed without the conv's geometry ({legacy})" in out
    assert not (tmp_path / "new.db").exists()


def test_the_tuning_note_is_said_per_shape_profile_and_not_without_cube_kernels(built, tmp_path,
                                                                                 capsys):
    # Tuned at batch 1: profile0 gets the tilings, profile1 (batch 2, other shapes) does not,
    # and the second profile's note used to be lost. On the cpu target there is nothing to say.
    model = conv_model(tmp_path / "dyn.onnx", batch="N")
    rc, out, err = run_cli(capsys, "optimize", model, "-o", tmp_path / "d.om", "--target",
                           "ascend310", "--dynamic-dims", "N:1,2", "--tuning-db", built["db"])
    assert rc == 0, err
    assert "tuned tilings for 0 of 2 NPU cube kernel(s) on ascend310 in shape profile " \
           "profile0; 2 keep the default tiling" in out
    assert "tuned tilings for 0 of 2 NPU cube kernel(s) on ascend310 in shape profile profile1" \
        in out
    rc, out, err = run_cli(capsys, "optimize", built["model"], "-o", tmp_path / "c.om",
                           "--target", "cpu", "--tuning-db", built["db"])
    assert rc == 0 and "tuned tilings" not in out, err


def test_a_knowledge_base_that_gives_an_onnx_compile_nothing_says_so(built, tmp_path, capsys):
    rc, out, err = run_cli(capsys, "optimize", built["model"], "-o", tmp_path / "m.onnx",
                           "--target", "ascend310", "--tuning-db", built["db"])
    assert rc == 0, err
    assert "note: --tuning-db: nothing in it applies to" in out
    assert "no subgraph decisions for this model on ascend310 at -O2" in out


def test_kb_import_of_a_custom_targets_kernels_takes_its_profile(built, tmp_path, capsys):
    # A signature names the target, not its file: the import is given the profile.
    from graphopt.partition import load_target

    profile = json.loads(open(load_target("ascend310").path).read())
    profile["name"] = "myboard"
    board = tmp_path / "myboard.json"
    board.write_text(json.dumps(profile))
    source, export = tmp_path / "a.db", tmp_path / "kb.json"
    assert run_cli(capsys, "tune", built["model"], "--target", board, "--trials", "3",
                   "--tuning-db", source, "-q")[0] == 0
    assert run_cli(capsys, "kb", "export", export, "--tuning-db", source)[0] == 0
    (name,) = json.loads(export.read_text())["kernels"]
    assert name.startswith("myboard/")
    copy = tmp_path / "b.db"
    rc, _, err = run_cli(capsys, "kb", "import", export, "--tuning-db", copy)
    assert_user_error(rc, err, f"{export}: kernel '{name}': target 'myboard' is not built in: "
                               "pass its profile (--target myboard.json)")
    assert not copy.exists()
    rc, out, err = run_cli(capsys, "kb", "import", export, "--tuning-db", copy, "--target", board)
    assert rc == 0 and "imported 1 kernel tiling(s)" in out, err
    assert kb.best_tilings(str(copy), "myboard") == kb.best_tilings(str(source), "myboard")


def test_kb_list_of_an_empty_knowledge_base_says_so(tmp_path, capsys, monkeypatch):
    import io

    db = str(tmp_path / "empty.db")
    monkeypatch.setattr("sys.stdin", io.StringIO('{"format": "graphopt-kb/1", "kernels": {}}'))
    rc, out, _ = run_cli(capsys, "kb", "import", "-", "--tuning-db", db)
    assert rc == 0 and "(it holds none: no knowledge base was created)" in out
    assert not os.path.exists(db)
    optuna.storages.RDBStorage(f"sqlite:///{db}").engine.dispose()  # Optuna's tables, no study
    rc, out, _ = run_cli(capsys, "kb", "list", "--tuning-db", db)
    assert rc == 0 and out.startswith("no tuning results in it yet"), out  # not a bare header


def test_kb_export_to_standard_output(built, tmp_path, capsys):
    rc, out, err = run_cli(capsys, "kb", "export", "-", "--tuning-db", built["db"])
    assert rc == 0 and "exported 1 kernel(s)" in err, err
    assert json.loads(out)["format"] == "graphopt-kb/1"
    assert not os.path.exists("-")


def test_kb_import_from_standard_input(built, tmp_path, capsys, monkeypatch):
    import io

    rc, exported, _ = run_cli(capsys, "kb", "export", "-", "--tuning-db", built["db"])
    assert rc == 0
    target = str(tmp_path / "piped.db")
    monkeypatch.setattr("sys.stdin", io.StringIO(exported))
    rc, out, err = run_cli(capsys, "kb", "import", "-", "--tuning-db", target)
    assert rc == 0 and "imported 1 kernel tiling(s) from standard input" in out, err
    monkeypatch.setattr("sys.stdin", io.StringIO("{}"))
    rc, _, err = run_cli(capsys, "kb", "import", "-", "--tuning-db", target)
    assert rc != 0 and "standard input: not a graphopt knowledge-base export" in err


def test_a_file_name_with_url_syntax_is_the_file_it_names(tmp_path):
    # SQLAlchemy decodes %XX and reads ? as options: the path is quoted into the URL.
    for name in ("p%41.db", "q?x=1.db", "a b#c.db", "r%253F.db"):
        open_storage(str(tmp_path / name))
        assert (tmp_path / name).is_file(), name
        assert kb.list_kb(str(tmp_path / name)) == []  # read-only, as kb list opens it
    assert not (tmp_path / "pA.db").exists() and not (tmp_path / "q").exists()


def test_a_default_knowledge_base_that_cannot_be_made_is_a_clear_error(tmp_path, capsys,
                                                                       monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file" / "cache"))
    with pytest.raises(OptionError, match="the default knowledge base .*: cannot create its "
                                          "folder .*give --tuning-db FILE"):
        storage_url(None)  # as tune opens it
    rc, out, err = run_cli(capsys, "calibrate", "--target", "cpu", "--quick")
    assert rc == 1 and "the default calibration file" in err and "give -o FILE" in err


def test_reading_a_tuned_knowledge_base_leaves_no_journal_files_beside_it(tmp_path, capsys):
    # A tune leaves its file in rollback-journal mode: in WAL mode every read-only reader
    # (kb list, a compile with --tuning-db, report) left -wal and -shm files beside it.
    from graphopt.cli import main

    model = conv_model(tmp_path / "m.onnx")
    folder = tmp_path / "kb"
    folder.mkdir()
    db = str(folder / "kb.db")
    assert main(["tune", model, "--target", "ascend310", "--trials", "2", "--tuning-db", db,
                 "-q"]) == 0
    assert os.listdir(folder) == ["kb.db"]
    for argv in (["kb", "list", "--tuning-db", db],
                 ["optimize", model, "-o", str(tmp_path / "m.om"), "--target", "ascend310",
                  "--tuning-db", db, "-q"]):
        assert main(argv) == 0, argv
        assert os.listdir(folder) == ["kb.db"], argv
    with contextlib.closing(sqlite3.connect(db)) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("delete",)


# A reader (kb list, a compile with --tuning-db) that holds the knowledge base open until told.
READER = """
import sys

import optuna

from graphopt.tuner.storage import opened

with opened(sys.argv[1], read_only=True) as store:
    optuna.get_all_study_summaries(store)
    print("reading", flush=True)
    sys.stdin.readline()
"""


def test_a_reader_that_leaves_last_puts_the_knowledge_base_at_rest(tmp_path):
    # The writer that leaves while a reader has the file open cannot take it out of WAL mode;
    # the reader, last out, left -wal and -shm beside it and the file in WAL mode.
    import subprocess
    import sys

    import graphopt
    from graphopt.tuner.storage import close_storage

    folder = tmp_path / "kb"
    folder.mkdir()
    db = str(folder / "kb.db")
    writer = open_storage(db)
    optuna.create_study(storage=writer, study_name="s").add_trial(
        optuna.trial.create_trial(value=1.0))
    root = os.path.dirname(os.path.dirname(graphopt.__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [root, os.environ.get("PYTHONPATH")]))}
    reader = subprocess.Popen([sys.executable, "-c", READER, db], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert reader.stdout.readline() == "reading\n"
        close_storage(writer)
        assert os.path.exists(f"{db}-wal")  # the reader kept the writer from it
    finally:
        reader.communicate("\n", timeout=120)
    assert reader.returncode == 0
    assert os.listdir(folder) == ["kb.db"]
    with contextlib.closing(sqlite3.connect(db)) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("delete",)


def test_compiles_with_many_knowledge_bases_keep_none_of_them_open(built, tmp_path):
    # A compile service that rotates its knowledge base (a copy per release, or a new file
    # renamed over the old) kept a descriptor of each file, deleted ones too, for good.
    import shutil

    import graphopt

    def open_files() -> list[str]:
        return sorted(os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                      if os.path.exists(f"/proc/self/fd/{fd}")
                      and str(tmp_path) in os.readlink(f"/proc/self/fd/{fd}"))

    live = tmp_path / "live.db"
    for i in range(3):
        copy = tmp_path / f"kb{i}.db"
        shutil.copy(built["db"], copy)
        shutil.copy(built["db"], tmp_path / "next.db")
        os.replace(tmp_path / "next.db", live)
        for db in (copy, live):
            graphopt.optimize(built["model"], target="ascend310", tuning_db=str(db))
            assert open_files() == [], open_files()


def test_kernel_signatures_sort_by_their_numbers():
    from graphopt.table import natural_key

    names = ["ascend310/gemm/b1_m3136_k64_n256/float16", "ascend310/gemm/b1_m49_k2304_n512/float16",
             "ascend310/gemm/b1_m49_k256_n512/float16"]
    assert sorted(names, key=natural_key) == [names[2], names[1], names[0]]


def test_an_interrupted_import_says_how_far_it_got_and_a_rerun_adds_the_rest(
        built, tmp_path, capsys, monkeypatch):
    # A storage commits trial by trial: Ctrl-C midway leaves what was added, and the rerun,
    # which skips what a study holds already, completes it.
    export = tmp_path / "kb.json"
    kb.export_kb(built["db"], export)
    doc = json.loads(export.read_text())
    (name, entry), = doc["kernels"].items()
    second = name.replace("b1_", "b2_")
    doc["kernels"][second] = entry
    export.write_text(json.dumps(doc))
    db = tmp_path / "new.db"
    add = kb._add_entry

    def interrupted_at_the_second(path, store, existing, kernel, *rest):
        if kernel == second:
            raise KeyboardInterrupt
        return add(path, store, existing, kernel, *rest)

    monkeypatch.setattr(kb, "_add_entry", interrupted_at_the_second)
    rc, _, err = run_cli(capsys, "kb", "import", export, "--tuning-db", db)
    assert rc == 130 and err == (f"graphopt: interrupted after importing 1 of 2 kernel(s) from "
                                 f"{export}; run the import again to add the rest (kernels the "
                                 "knowledge base holds already are skipped)\n")
    assert [row["signature"] for row in kb.list_kb(str(db))] == [name]
    monkeypatch.setattr(kb, "_add_entry", add)
    rc, out, err = run_cli(capsys, "kb", "import", export, "--tuning-db", db)
    assert rc == 0 and out == f"imported 1 kernel tiling(s) from {export}\n", err
    rc, out, err = run_cli(capsys, "kb", "import", export, "--tuning-db", db)
    assert rc == 0 and out == (f"imported 0 kernel tiling(s) from {export} (the knowledge base "
                               "holds the tilings of all 2 already)\n"), err
    rc, _, err = run_cli(capsys, "kb", "import", export, "--tuning-db", db, "--target", "cpu")
    assert_user_error(rc, err, "--target cpu: kb import takes the profile files of custom "
                               "targets")


def test_kb_import_names_the_storage_option_it_was_given(tmp_path, capsys):
    # `kb import --storage URL` said "--tuning-db URL: cannot open the storage".
    export = tmp_path / "kb.json"
    db = tmp_path / "kb.db"
    from graphopt.tuner import GemmShape
    from graphopt.tuner.search import tune_kernel

    tune_kernel(GemmShape(1, 64, 64, 64, "float16"), "ascend310", target="ascend310",
                trials=2, storage=f"sqlite:///{db}")
    assert run_cli(capsys, "kb", "export", str(export), "--tuning-db", str(db))[0] == 0
    code, _, err = run_cli(capsys, "kb", "import", str(export), "--storage",
                           "postgresql://nobody@127.0.0.1:1/x")
    assert code == 1 and "--storage postgresql://" in err and "--tuning-db" not in err
