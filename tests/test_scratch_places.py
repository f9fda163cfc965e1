"""Where graphopt keeps caches and scratch files: its cache in an absolute XDG_CACHE_HOME, else
the home's .cache, else a folder of the user's in the temporary directory; scratch folders in
the temporary directory, with one line naming TMPDIR where none is usable."""

from __future__ import annotations

import os
import tempfile

from graphopt.cache_dir import cache_dir


def test_an_absolute_xdg_cache_home_is_used(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == os.path.join(str(tmp_path), "graphopt")


def test_a_relative_xdg_cache_home_is_ignored_as_the_spec_says(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", "relcache")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == os.path.join(str(tmp_path), ".cache", "graphopt")


def test_a_user_without_a_home_gets_a_folder_in_the_temporary_directory(monkeypatch):
    # "~" expanded to itself (no HOME, no passwd entry): the cache had been ./~/.cache.
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(os.path, "expanduser", lambda path: path)
    path = cache_dir()
    assert os.path.isabs(path) and path.startswith(tempfile.gettempdir())
    assert "~" not in path


def test_no_usable_temporary_directory_is_one_line_naming_tmpdir(monkeypatch, tmp_path, capsys):
    # A read-only container: profile, report and a model read from a pipe had ended in an
    # internal error (FileNotFoundError: No usable temporary directory found).
    import pytest
    from helpers import run_cli

    from graphopt import zoo
    from graphopt.atomic import scratch_folder
    from graphopt.errors import OutputError

    def no_temporary(*args, **kwargs):
        raise FileNotFoundError(2, "No usable temporary directory found in ['/tmp']")

    monkeypatch.setattr(tempfile, "TemporaryDirectory", no_temporary)
    with pytest.raises(OutputError, match="set TMPDIR to a writable folder"):
        with scratch_folder("x-"):
            pass
    import onnx

    onnx.save(zoo.build("tiny"), tmp_path / "tiny.onnx")
    rc, _, err = run_cli(capsys, "profile", tmp_path / "tiny.onnx")
    assert rc == 1 and "no writable temporary directory" in err and "internal error" not in err


def test_a_file_named_like_an_option_is_named_in_the_error(monkeypatch, tmp_path, capsys):
    # `graphopt optimize -model.onnx` said only that the model argument was missing.
    from helpers import run_cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "-model.onnx").write_bytes(b"")
    rc, _, err = run_cli(capsys, "optimize", "-model.onnx", "-o", "x.om")
    assert rc == 2 and "(-model.onnx is a file, read as an option: write ./-model.onnx)" in err


def test_tables_line_up_where_the_output_escapes_what_it_cannot_encode(monkeypatch):
    # PYTHONIOENCODING=ascii: "µs" is written as "\xb5s", four characters wider than measured.
    import io
    import sys

    from graphopt.table import format_table

    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding="ascii",
                                                        errors="backslashreplace"))
    lines = format_table(["name", "default µs"], [["a", 1.5], ["bb", 20.25]]).splitlines()
    assert len({len(line) for line in lines}) == 1 and "\\xb5s" in lines[0], lines


def test_a_name_the_locale_does_not_give_as_utf8_is_told_apart():
    # Under a Latin-1 or plain C locale a non-ASCII file name decodes to surrogates, which
    # onnxruntime and SQLAlchemy, encoding paths as UTF-8, cannot reach: compare then reads
    # the model itself, and an SQLite knowledge base so named is refused in one line.
    import pytest

    from graphopt.errors import OptionError
    from graphopt.input_files import utf8_named
    from graphopt.tuner.storage import storage_url

    assert utf8_named("modèle.onnx") and utf8_named("plain.onnx")
    assert not utf8_named("kb_\udcc3\udca9.db")
    with pytest.raises(OptionError, match="an SQLite storage's name must be UTF-8"):
        storage_url("/tmp/kb_\udcc3\udca9.db")
