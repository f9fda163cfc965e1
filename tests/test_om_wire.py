"""Reading an .om without onnx: the manifest's element types, the NCHWc probe model and the
external references that the runtime reads and repoints on the protobuf wire, each against
what onnx makes of the same bytes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_om import _escaping_tensor, _model, _tensor, big_matmul

from graphopt import protowire
from graphopt.codegen import OmPartition, OmSession, load_om, om_refs, write_om
from graphopt.codegen.feeds import numpy_dtype
from graphopt.codegen.om_manifest import dtype_from_name, dtype_name, known_dtype
from graphopt.codegen.om_weights import external_tensors, point_into
from graphopt.nchwc_block import PROBE_MODEL


def test_element_types_are_onnx_s():
    for name, value in TensorProto.DataType.items():
        expected = None if value == 0 else {"FLOAT": "float32", "DOUBLE": "float64"}.get(
            name, name.lower())
        assert dtype_name(value) == expected
        if expected:
            assert dtype_from_name(expected) == value and known_dtype(expected)
    assert not known_dtype("float128")
    with pytest.raises(ValueError):
        dtype_name(999)


def test_numpy_dtypes_without_onnx_are_onnx_s():
    # numpy's own types (and strings) are mapped without importing onnx; the rest through it.
    for name, value in TensorProto.DataType.items():
        if value == 0:
            continue
        try:
            expected = np.dtype(helper.tensor_dtype_to_np_dtype(value))
        except (KeyError, TypeError, ValueError):
            expected = None
        assert numpy_dtype(dtype_name(value)) == expected, name


def test_probe_model_is_the_one_onnx_builds():
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "k"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])],
        [numpy_helper.from_array(np.ones((1, 3, 1, 1), np.float32), "k")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert model.SerializeToString() == PROBE_MODEL
    assert protowire.node_domains(PROBE_MODEL) == {""}
    assert protowire.initializer_dims(PROBE_MODEL) == [[1, 3, 1, 1]]


def _blob_artifact(tmp_path):
    """Two MatMuls of 512×512 weights and a bias: a weights blob that all three reference."""
    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal((512, 512)).astype(np.float32) for _ in range(2))
    bias = np.ones(512, np.float32) / 4
    model = _model([helper.make_node("MatMul", ["X", "W1"], ["H"]),
                    helper.make_node("Add", ["H", "B"], ["G"]),
                    helper.make_node("MatMul", ["G", "W2"], ["Y"])],
                   [_tensor("X", ["N", 512])], [_tensor("Y", ["N", 512])],
                   [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(bias, "B"),
                    numpy_helper.from_array(w2, "W2")])
    path = tmp_path / "blob.om"
    write_om(path, [OmPartition("p0", "cpu", model)])
    return path, (w1, bias, w2)


def test_wire_references_are_onnx_s(tmp_path):
    path, _ = _blob_artifact(tmp_path)
    artifact = load_om(path)
    data = artifact.members["partitions/p0.onnx"]
    references = om_refs.plain_references(data)
    parsed = artifact.models["p0"]
    assert [r.tensor for r in references] == [t.name for t in external_tensors(parsed)] \
        == ["W1", "B", "W2"]
    offsets = {name: offset for name, (offset, _) in artifact.spans.items()}
    located = onnx.load_from_string(om_refs.repointed(data, references, "blob.om", offsets))
    assert located == point_into(parsed, str(path), offsets)


def test_session_on_wire_references_runs(tmp_path, reference_reader):
    path, (w1, bias, w2) = _blob_artifact(tmp_path)
    x = np.random.default_rng(1).standard_normal((2, 512)).astype(np.float32)
    y = OmSession(path).run({"X": x})["Y"]
    np.testing.assert_allclose(y, (x @ w1 + bias) @ w2, rtol=1e-4, atol=1e-3)


def _with_reference(model, entries, location=TensorProto.EXTERNAL):
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = location
    for key, value in entries:
        tensor.external_data.add(key=key, value=value)
    return model.SerializeToString()


PLAIN = (("location", "weights/p0.bin"), ("offset", "0"), ("length", "16"))


@pytest.mark.parametrize("entries, location", [
    ((*PLAIN, ("checksum", "x")), TensorProto.EXTERNAL),     # a key graphopt does not write
    ((*PLAIN, ("offset", "4")), TensorProto.EXTERNAL),       # a key twice
    ((("location", "weights/location.bin"), *PLAIN[1:]), TensorProto.EXTERNAL),
    ((("location", "weights/p0.bin"), ("offset", "x"), ("length", "16")), TensorProto.EXTERNAL),
    (PLAIN, TensorProto.DEFAULT),                            # entries onnxruntime would ignore
])
def test_references_of_another_form_are_left_to_onnx(entries, location):
    assert om_refs.plain_references(_with_reference(big_matmul(), entries, location)) is None


def test_references_outside_the_main_graph_are_left_to_onnx():
    model = big_matmul()
    plain = _with_reference(model, PLAIN)
    assert [r.tensor for r in om_refs.plain_references(plain)] == ["W"]
    model.graph.node.insert(0, helper.make_node("Constant", [], ["C"], value=_escaping_tensor()))
    assert om_refs.plain_references(model.SerializeToString()) is None


def test_models_without_references_and_broken_bytes():
    assert om_refs.plain_references(big_matmul().SerializeToString()) == []
    plain = _with_reference(big_matmul(), PLAIN)
    assert om_refs.plain_references(plain[:-3]) is None  # truncated: onnx says what is wrong
    with pytest.raises(protowire.WireError):
        list(protowire.fields(b"\x0a\xff"))


def _inline_matmul(raw_prefix: bytes = b"") -> onnx.ModelProto:
    """Y = X @ W + B with a 64 KiB W (kept inside the partition) and a small B; W's raw data
    starts with `raw_prefix`."""
    w = np.random.default_rng(2).standard_normal((128, 128)).astype(np.float32)
    tensor = numpy_helper.from_array(w, "W")
    tensor.raw_data = raw_prefix + tensor.raw_data[len(raw_prefix):]
    return _model([helper.make_node("MatMul", ["X", "W"], ["H"]),
                   helper.make_node("Add", ["H", "B"], ["Y"])],
                  [_tensor("X", ["N", 128])], [_tensor("Y", ["N", 128])],
                  [numpy_helper.from_array(np.ones(128, np.float32), "B"), tensor])


def test_large_initializers_go_to_the_head_of_the_graph():
    model = _inline_matmul()
    data = model.SerializeToString()
    assert protowire.raw_data_spans(data) == []  # nodes first: the walk stops at once
    moved = protowire.initializers_first(data)
    assert len(moved) == len(data) and moved != data
    parsed = onnx.load_from_string(moved)
    assert [t.name for t in parsed.graph.initializer] == ["W", "B"]
    parsed.graph.initializer.sort(key=lambda t: t.name)
    model.graph.initializer.sort(key=lambda t: t.name)
    assert parsed == model  # every other field as it was, in its order
    (span,) = protowire.raw_data_spans(moved)
    assert moved[span[0]:span[1]] == model.graph.initializer[1].raw_data
    assert protowire.initializers_first(moved) == moved  # nothing left to move


def test_partitions_are_written_initializers_first(tmp_path):
    write_om(tmp_path / "m.om", [OmPartition("p0", "cpu", _inline_matmul())])
    data = load_om(tmp_path / "m.om").members["partitions/p0.onnx"]
    assert len(protowire.raw_data_spans(data)) == 1


def test_search_for_references_skips_raw_data_at_the_head_only():
    # A "location" inside tensor contents is no reference: skipped where the writer puts large
    # tensors; elsewhere counted, which leaves the model to onnx's parse (slower, as safe).
    data = _inline_matmul(raw_prefix=b"location").SerializeToString()
    assert om_refs.plain_references(data) is None
    assert om_refs.plain_references(protowire.initializers_first(data)) == []
    # A reference after the head is still seen.
    model = onnx.load_from_string(protowire.initializers_first(data))
    model.graph.node.insert(0, helper.make_node("Constant", [], ["C"], value=_escaping_tensor()))
    assert om_refs.plain_references(
        protowire.initializers_first(model.SerializeToString())) is None


def _initializer_payloads(data: bytes):
    graph = protowire.graph_span(data)
    return [(start, end, first, last) for start, end, first, last
            in protowire.submessages(data, protowire.GRAPH_INITIALIZER, graph[0], graph[1])
            if data.find(b"location", start, end) >= 0]


def test_written_references_are_read_without_a_walk(tmp_path):
    path, _ = _blob_artifact(tmp_path)
    data = load_om(path).members["partitions/p0.onnx"]
    payloads = _initializer_payloads(data)
    assert len(payloads) == 3
    for start, end, first, last in payloads:
        quick = om_refs._written_form(data, (first, last), (start, end))
        assert quick is not None and quick == om_refs._any_form(data, (first, last), (start, end))


@pytest.mark.parametrize("name, doc, quick_form", [
    ("W", "", True), ("W", "what W holds", True), ("Wé", "é", True),
    ("w" * 200, "", False), ("W", "d" * 300, False),  # lengths of two bytes: the walk reads them
])
def test_quick_and_walked_reads_agree(name, doc, quick_form, monkeypatch):
    model = big_matmul()
    model.graph.initializer[0].name = model.graph.node[0].input[1] = name
    model.graph.initializer[0].doc_string = doc
    data = protowire.initializers_first(_with_reference(model, PLAIN))
    (start, end, first, last), = _initializer_payloads(data)
    walked = om_refs._any_form(data, (first, last), (start, end))
    assert walked.tensor == name and walked.location == "weights/p0.bin"
    assert om_refs._written_form(data, (first, last), (start, end)) == (walked if quick_form
                                                                        else None)
    quick = om_refs.plain_references(data)
    monkeypatch.setattr(om_refs, "_written_form", lambda *args: None)
    assert quick == om_refs.plain_references(data) == [walked]


@pytest.mark.parametrize("entries", [
    (("location", "weights/p0.bin"), ("offset", "+0"), ("length", "16")),  # int() reads "+0"
    (("location", "weights/p0.bin"), ("offset", "0"), ("length", "16"), ("length", "16")),
    (("offset", "0"), ("location", "weights/p0.bin"), ("length", "16")),
])
def test_quick_read_leaves_other_forms_to_the_walk(entries):
    data = protowire.initializers_first(_with_reference(big_matmul(), entries))
    (start, end, first, last), = _initializer_payloads(data)
    assert om_refs._written_form(data, (first, last), (start, end)) is None


def test_wire_reader_agrees_with_onnx_on_every_changed_byte(tmp_path):
    """Each byte of a partition with three references, changed four ways: wherever the wire
    reader returns references, onnx parses the same bytes into exactly those external tensors
    that name a file (names, locations, offsets, lengths) and no other; elsewhere the reader
    leaves the model to onnx's parse. (A changed key can leave an external tensor with no
    location, which names no file: onnxruntime refuses that model.)"""
    path, _ = _blob_artifact(tmp_path)
    data = load_om(path).members["partitions/p0.onnx"]
    read = left = 0
    for at in range(len(data)):
        for value in {data[at] ^ 0x01, data[at] ^ 0x80, 0x00, 0xFF} - {data[at]}:
            mutant = data[:at] + bytes((value,)) + data[at + 1:]
            found = om_refs.plain_references(mutant)
            if found is None:
                left += 1
                continue
            try:
                model = onnx.load_from_string(mutant)
            except Exception:  # noqa: BLE001 - no model: onnxruntime refuses the bytes too
                continue
            read += 1
            entries = [(t.name, {e.key: e.value for e in t.external_data})
                       for t in external_tensors(model)]
            entries = [(name, e) for name, e in entries if "location" in e]
            assert sorted((r.tensor, r.location, r.offset, r.length) for r in found) == sorted(
                (name, e.get("location"), int(e.get("offset", "0")), int(e.get("length", "-1")))
                for name, e in entries), at
    assert read and left
