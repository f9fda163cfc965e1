"""Test setup: helper modules (corpus.py) importable by name; structural verification after
every pass of every compile; a cache folder of the suite's own, so that a developer's CPU
calibration or knowledge base in ~/.cache cannot change what the tests see; tables laid out
as piped (`pytest -s` on a terminal must not wrap the text tests read)."""

import atexit
import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))

os.environ.setdefault("GRAPHOPT_VERIFY_PASSES", "1")
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="graphopt-test-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)


@pytest.fixture(autouse=True)
def _piped_tables(monkeypatch):
    from graphopt import table

    monkeypatch.setattr(table, "terminal_width", lambda: None)


@pytest.fixture(params=["onnx", "wire"])
def reference_reader(request, monkeypatch):
    """How the runtime reads partitions' external references at load: from the protobuf wire
    (graphopt's own form, in any process), or parsed with onnx (what takes any other form)."""
    from graphopt.codegen import partition_sessions

    monkeypatch.setattr(partition_sessions, "WIRE_REFERENCES", request.param == "wire")
    return request.param
