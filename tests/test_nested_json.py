"""Every JSON a command reads refuses nesting deeper than Python's parser goes, by name: an .om's
details, a knowledge-base export, a switch file, a CPU calibration (a RecursionError escaped as
an internal error)."""

from __future__ import annotations

import onnx
from helpers import run_cli
from test_fuzz import om_bytes, read_zip, resum, write_zip

from graphopt import zoo

DEEP = "[" * 100_000 + "]" * 100_000


def test_nested_json_is_refused_naming_the_file(tmp_path, capsys):
    model = tmp_path / "tiny.onnx"
    onnx.save(zoo.build("tiny"), model)
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    switch = tmp_path / "switch.json"
    switch.write_text('{"a":' * 3000 + "1" + "}" * 3000)
    manifest, members = read_zip(om_bytes(zoo.build("tiny"), tmp_path / "t.om"))
    members["details.json"] = DEEP.encode()
    resum(manifest, members)
    nested_om = tmp_path / "nested.om"
    nested_om.write_bytes(write_zip(manifest, members))
    for argv, message in (
            (("kb", "import", deep, "--tuning-db", tmp_path / "kb.db"),
             f"{deep}: not a graphopt knowledge-base export"),
            (("optimize", model, "-o", tmp_path / "a.om", "--switch-file", switch),
             f"--switch-file {switch}: invalid JSON"),
            (("profile", model, "--repeat", "1", "--calibration", deep),
             f"calibration {deep}: not a graphopt CPU calibration (nested too deeply)"),
            (("inspect", nested_om), f"{nested_om}: details.json is not valid JSON")):
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 1 and message in err and "internal error" not in err, (argv, err)
