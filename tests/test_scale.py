"""Large models: external data read lazily and written past a threshold, weights streamed into
the .om without a second copy, and the compile-time fixes that keep big graphs linear."""

from __future__ import annotations

import gc
import os
import re
import tracemalloc

import numpy as np
import onnx
import pytest
from helpers import IR_VERSION, parse_model
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt.codegen.om_read import load_om
from graphopt.compile_save import save
from graphopt.compiler import optimize
from graphopt.errors import GraphoptError, InputError, OptionError
from graphopt import numerics
from graphopt.ir import load_onnx, to_onnx
from graphopt.ir.collector import collection_paused, heap_frozen
from graphopt.ir.external_data import THRESHOLD_ENV, save_onnx, threshold
from graphopt.ir.tensor import Tensor, tensor_references
from graphopt.passes.rules import call_with_bindings

WIDTH = 1024          # one [1024, 1024] float32 weight is 4 MiB
LAYERS = 10           # 40 MiB of weights in all
WEIGHT_BYTES = LAYERS * WIDTH * WIDTH * 4


def _external_model(folder: str, name: str = "big.onnx") -> tuple[str, list[np.ndarray]]:
    """A MatMul chain whose weights sit in `name`.data, written one tensor at a time."""
    rng = np.random.default_rng(0)
    path = os.path.join(folder, name)
    weights, nodes, inits = [], [], []
    with open(path + ".data", "wb") as blob:
        for i in range(LAYERS):
            w = (rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) / np.float32(32))
            weights.append(w)
            tensor = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[WIDTH, WIDTH])
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", name + ".data"), ("offset", str(blob.tell())),
                               ("length", str(w.nbytes))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            blob.write(w.tobytes())
            inits.append(tensor)
            nodes.append(helper.make_node("MatMul", ["x" if i == 0 else f"h{i - 1}", f"w{i}"],
                                          [f"h{i}"]))
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, WIDTH])], [helper.make_tensor_value_info(
            f"h{LAYERS - 1}", TensorProto.FLOAT, [2, WIDTH])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path, weights


def _reference(x: np.ndarray, weights: list[np.ndarray]) -> np.ndarray:
    for w in weights:
        x = x @ w
    return x


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    folder = tmp_path_factory.mktemp("big")
    return _external_model(str(folder))


# --- reading ---------------------------------------------------------------------------------


def test_import_keeps_external_weights_on_disk(big):
    path, weights = big
    tracemalloc.start()
    model = load_onnx(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < WEIGHT_BYTES / 8, f"import allocated {peak} bytes for {WEIGHT_BYTES} of weights"
    tensor = model.graph.initializers["w3"].const
    assert tensor.is_external
    np.testing.assert_array_equal(tensor.numpy(), weights[3])  # mapped on first read
    assert not tensor.is_external
    assert model.graph.initializers["w0"].const.is_external  # the others are still untouched


def test_fusing_matmuls_with_their_biases_leaves_external_weights_on_disk(big, tmp_path):
    # The rules' broadcast check read every constant a match held, weights included: each one
    # was mapped into the IR (an open descriptor each) and stayed there.
    path, weights = big
    proto = onnx.load(path, load_external_data=False)
    for node in list(proto.graph.node):
        node.output[0] += "_product"
        proto.graph.node.append(helper.make_node("Add", [node.output[0], "bias"],
                                                 [node.output[0][:-len("_product")]]))
    proto.graph.initializer.append(numpy_helper.from_array(np.full(WIDTH, 0.5, np.float32),
                                                           "bias"))
    biased = os.path.join(os.path.dirname(path), "biased.onnx")
    onnx.save(proto, biased)
    result = optimize(biased)
    assert [n.op_type for n in result.model.graph] == ["Gemm"] * LAYERS
    assert all(result.model.graph.initializers[f"w{i}"].const.is_external for i in range(LAYERS))


def test_mapped_weights_of_one_file_share_one_descriptor(big):
    path, weights = big
    data = os.path.realpath(path + ".data")

    def open_on_data() -> int:
        gc.collect()  # an earlier test's model may wait in a reference cycle
        return sum(os.path.realpath(f"/proc/self/fd/{fd}") == data
                   for fd in os.listdir("/proc/self/fd"))

    before = open_on_data()
    model = load_onnx(path)
    arrays = [model.graph.initializers[f"w{i}"].const.numpy() for i in range(LAYERS)]
    assert open_on_data() == before + 1
    np.testing.assert_array_equal(arrays[4], weights[4])
    arrays[4][0, 0] = 7.0  # copy on write: the file and another import keep their bytes
    assert load_onnx(path).graph.initializers["w4"].const.numpy()[0, 0] == weights[4][0, 0]
    del arrays, model
    assert open_on_data() == before


def test_external_tensor_digest_and_fingerprint_match_inline(big):
    path, weights = big
    external = load_onnx(path).graph.initializers["w1"].const
    inline = Tensor.from_proto(numpy_helper.from_array(weights[1], "w1"))
    assert external.fingerprint() == inline.fingerprint()
    assert external.digest() == inline.digest()
    assert external.is_external  # hashing streamed the file, it did not load the tensor


def test_missing_or_short_external_data_is_an_input_error(tmp_path):
    path, _ = _external_model(str(tmp_path), "cut.onnx")
    with open(path + ".data", "r+b") as f:
        f.truncate(WEIGHT_BYTES - 100)
    with pytest.raises(InputError, match=r"cut\.onnx: initializer 'w9'.*ends at byte"):
        load_onnx(path)
    os.remove(path + ".data")
    with pytest.raises(InputError, match=r"initializer 'w0'.*cut\.onnx\.data"):
        load_onnx(path)


def _one_weight_model(folder, location: str, entries: dict[str, str] | None = None,
                      name: str = "m.onnx", shape=(4, 4)) -> str:
    """A MatMul whose weight `w` names external data at `location` (plus `entries`)."""
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=list(shape))
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in {"location": location, **(entries or {})}.items():
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, shape[1]])], [tensor])
    path = os.path.join(folder, name)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=IR_VERSION), path)
    return path


def test_external_data_reached_through_a_link_out_of_the_folder_is_refused(tmp_path):
    outside, model = tmp_path / "outside", tmp_path / "model"
    outside.mkdir()
    model.mkdir()
    (outside / "secret.bin").write_bytes(np.arange(16, dtype=np.float32).tobytes())
    (model / "w.bin").symlink_to(outside / "secret.bin")
    (model / "link").symlink_to(outside)
    for location in ("w.bin", "link/secret.bin"):
        path = _one_weight_model(str(model), location)
        with pytest.raises(InputError, match=f"location '{location}' leads out of the model's "
                                             "folder through a symbolic link"):
            optimize(path)


def test_a_linked_model_may_read_data_beside_the_file_it_links_to(tmp_path):
    # A Hugging Face cache: snapshots/ holds links to the model and its data, both in blobs/.
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    blobs.mkdir()
    snapshot.mkdir(parents=True)
    weight = np.arange(16, dtype=np.float32).reshape(4, 4)
    (blobs / "data").write_bytes(weight.tobytes())
    real = _one_weight_model(str(blobs), "m.onnx.data", name="model")
    (snapshot / "m.onnx").symlink_to(real)
    (snapshot / "m.onnx.data").symlink_to(blobs / "data")
    x = np.ones((2, 4), np.float32)
    result = optimize(str(snapshot / "m.onnx"))
    np.testing.assert_array_equal(numerics.run(to_onnx(result.model), {"x": x})["y"], x @ weight)


def test_external_data_without_a_length_takes_what_the_tensor_needs(tmp_path):
    # Two weights in one file, offsets only: onnx.proto makes the length optional.
    weight = np.arange(16, dtype=np.float32).reshape(4, 4)
    (tmp_path / "w.bin").write_bytes(b"\0" * 64 + weight.tobytes() + b"\0" * 32)
    path = _one_weight_model(str(tmp_path), "w.bin", {"offset": "64"})
    x = np.ones((2, 4), np.float32)
    result = optimize(path)
    np.testing.assert_array_equal(numerics.run(to_onnx(result.model), {"x": x})["y"], x @ weight)


def test_external_data_that_is_a_folder_or_starts_past_the_end_is_named(tmp_path):
    (tmp_path / "weights").mkdir()
    with pytest.raises(InputError, match="initializer 'w': external data location 'weights' is "
                                         "not a file"):
        optimize(_one_weight_model(str(tmp_path), "weights", {"length": "64"}))
    (tmp_path / "w.bin").write_bytes(b"\0" * 64)
    with pytest.raises(InputError, match=r"external data offset 1000 lies past the end of "
                                         r"'w\.bin' \(64 bytes\)"):
        optimize(_one_weight_model(str(tmp_path), "w.bin", {"offset": "1000"}))


def test_an_initializer_past_protobufs_limit_is_hashed_field_by_field(tmp_path, monkeypatch):
    # onnx.load of a model whose one weight holds over 2 GiB: that initializer serializes no
    # more than the model does, and the source hash had failed with protobuf's EncodeError.
    from graphopt import compile_result

    from google.protobuf.message import EncodeError

    proto = onnx.load(_external_model(str(tmp_path))[0])
    big = proto.graph.initializer[0]
    model_serialize = type(proto).SerializeToString
    tensor_serialize = type(big).SerializeToString

    def refused(self, **kwargs):  # what protobuf does past 2 GiB, for these two only
        if self is proto or self is big:
            raise EncodeError("Failed to serialize proto")
        return (model_serialize if self.DESCRIPTOR.name == "ModelProto" else
                tensor_serialize)(self, **kwargs)

    monkeypatch.setattr(type(proto), "SerializeToString", refused)
    monkeypatch.setattr(type(big), "SerializeToString", refused)
    first = compile_result.memory_model_sha256(proto)
    assert first == compile_result.memory_model_sha256(proto)
    data = bytearray(big.raw_data)
    data[-1] ^= 1  # one bit of the big weight: another source
    big.raw_data = bytes(data)
    assert compile_result.memory_model_sha256(proto) != first


def test_a_model_past_protobufs_limit_is_hashed_and_run_from_a_file(tmp_path, monkeypatch):
    # onnx.load of a model with over 2 GiB of external data gives a ModelProto that no one
    # message serializes to: the source hash and --verify's sessions do without.
    from graphopt import compile_result

    from google.protobuf.message import EncodeError

    proto = onnx.load(_external_model(str(tmp_path))[0])
    small = compile_result.memory_model_sha256(proto)
    serialize = type(proto).SerializeToString

    def refused(self, **kwargs):  # what protobuf does past 2 GiB, for this model only
        if self is proto:
            raise EncodeError("Failed to serialize proto")
        return serialize(self, **kwargs)

    monkeypatch.setattr(type(proto), "SerializeToString", refused)
    large = compile_result.memory_model_sha256(proto)
    assert large != small and large == compile_result.memory_model_sha256(proto)
    x = np.ones((2, WIDTH), np.float32)
    out = numerics.run(proto, {"x": x})[f"h{LAYERS - 1}"]
    monkeypatch.undo()
    np.testing.assert_allclose(out, numerics.run(proto, {"x": x})[f"h{LAYERS - 1}"], rtol=0)


def test_an_in_memory_model_with_external_data_is_refused(big, tmp_path, monkeypatch):
    # Bytes or a caller's ModelProto name no folder: its references could only resolve against
    # the working directory, where a same-named file may hold anything.
    path, _ = big
    proto = onnx.load(path, load_external_data=False)
    monkeypatch.chdir(tmp_path)
    location = {e.key: e.value for e in proto.graph.initializer[0].external_data}["location"]
    with open(location, "wb") as f:
        f.write(b"\0" * (2 * WEIGHT_BYTES))
    for source in (proto, proto.SerializeToString()):
        with pytest.raises(InputError, match=r"<model>: initializer 'w0' keeps its data in an "
                                             r"external file .*pass the \.onnx path"):
            optimize(source)
    with pytest.raises(InputError, match="external file"):
        optimize(proto, dynamic_dims={"batch": [1, 2]})


# --- writing ONNX ----------------------------------------------------------------------------


def test_save_writes_external_data_above_the_threshold(big, tmp_path, monkeypatch):
    path, weights = big
    result = optimize(path)
    out = str(tmp_path / "big.opt.onnx")
    monkeypatch.setenv(THRESHOLD_ENV, str(WEIGHT_BYTES // 2))
    save(result, out)
    assert os.path.getsize(out + ".data") >= WEIGHT_BYTES
    assert os.path.getsize(out) < 100_000  # the model holds references, not weights
    proto = onnx.load(out, load_external_data=False)
    for tensor in proto.graph.initializer:
        entries = {e.key: e.value for e in tensor.external_data}
        assert entries["location"] == "big.opt.onnx.data"
        assert int(entries["offset"]) % 4096 == 0  # mappable by onnxruntime
    x = np.random.default_rng(1).standard_normal((2, WIDTH)).astype(np.float32)
    import onnxruntime as ort
    (got,) = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got, _reference(x, weights), rtol=1e-4, atol=1e-5)
    # and it reads back into the IR with the same weights, mapped
    again = load_onnx(out).graph.initializers
    np.testing.assert_array_equal(again["w7"].const.numpy(), weights[7])


def test_save_stays_inline_below_the_threshold(tmp_path, monkeypatch):
    model = load_onnx(parse_model("""
        g (float[2, 300] x) => (float[2, 300] y) {
            y = Add(x, x)
        }"""))
    model.graph.make_initializer("w", np.ones((300, 300), np.float32))
    monkeypatch.setenv(THRESHOLD_ENV, str(10 << 20))
    out = str(tmp_path / "small.onnx")
    save(model, out)
    assert not os.path.exists(out + ".data")
    save(model, out, external_data=True)  # forced: the 360 KB weight goes out
    assert os.path.getsize(out + ".data") == 300 * 300 * 4
    assert onnx.load(out).graph.initializer[0].raw_data == np.ones((300, 300), np.float32).tobytes()


def test_inline_save_streams_weights_without_copying_them_all(big, tmp_path, monkeypatch):
    # The whole ModelProto, serialized, held every weight twice more: 3x the weights at peak.
    path, _ = big
    model = load_onnx(path)
    for value in model.graph.initializers.values():
        value.const.numpy()  # in memory, as a model loaded inline has them
    model.graph.make_initializer("small", np.arange(3, dtype=np.float32))  # stays a field
    reference = to_onnx(model)
    monkeypatch.setenv(THRESHOLD_ENV, str(WEIGHT_BYTES * 2))
    out = str(tmp_path / "inline.onnx")
    tracemalloc.start()
    save(model, out)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < WEIGHT_BYTES / 4, f"the save allocated {peak} bytes for {WEIGHT_BYTES}"
    assert not os.path.exists(out + ".data")
    written = onnx.load(out)
    for tensor in (*written.graph.initializer, *reference.graph.initializer):
        tensor.ClearField("data_location")  # DEFAULT, spelled out or not
    assert written == reference
    onnx.checker.check_model(written, full_check=True)
    feeds = {"x": np.ones((2, WIDTH), np.float32)}
    assert numerics.compare(numerics.run(onnx.load(path), feeds), numerics.run(written, feeds),
                            0, 0) == []


def test_threshold_env_must_be_a_byte_count(monkeypatch):
    monkeypatch.setenv(THRESHOLD_ENV, "2GB")
    with pytest.raises(OptionError, match=THRESHOLD_ENV):
        threshold()


def test_failed_data_write_leaves_no_partial_files(big, tmp_path, monkeypatch):
    model = load_onnx(big[0])
    out = str(tmp_path / "half.onnx")
    calls = []

    def failing(self, size=0):
        calls.append(1)
        if len(calls) > 3:
            raise OSError(28, "No space left on device")
        yield b"\0" * self.nbytes

    monkeypatch.setattr(Tensor, "iter_bytes", failing)
    with pytest.raises(GraphoptError, match="No space left"):
        save_onnx(model, out, external=True)
    assert os.listdir(tmp_path) == []


# --- writing the .om -------------------------------------------------------------------------


def test_om_streams_weights_without_a_second_copy(big, tmp_path):
    """The .om write holds at most a chunk of weights at a time: tracemalloc sees every
    Python-side allocation (protobuf copies, bytearrays, numpy arrays), not mapped pages."""
    path, weights = big
    result = optimize(path, target="cpu")
    out = str(tmp_path / "big.om")
    gc.collect()
    tracemalloc.start()
    save(result, out)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < WEIGHT_BYTES / 4, f"the .om write allocated {peak} bytes"
    assert os.path.getsize(out) > WEIGHT_BYTES
    x = np.random.default_rng(2).standard_normal((2, WIDTH)).astype(np.float32)
    outputs = graphopt.load(out).run({"x": x})
    np.testing.assert_allclose(next(iter(outputs.values())), _reference(x, weights),
                               rtol=1e-4, atol=1e-5)


def test_om_bytes_do_not_depend_on_where_weights_live(big, tmp_path):
    """Streaming weights from a mapped external file or from protobuf raw_data writes the
    same weights blob."""
    path, _ = big
    mapped = str(tmp_path / "mapped.om")
    save(optimize(path, target="cpu"), mapped)
    inline = onnx.load(path)  # external data loaded into raw_data
    from_proto = str(tmp_path / "proto.om")
    result = optimize(inline, target="cpu")
    save(result, from_proto)
    # The manifests name the source differently (a path vs "<model>"); the weights agree.
    left, right = load_om(mapped).manifest, load_om(from_proto).manifest
    blob = next(name for name in left["members"] if name.startswith("weights/"))
    assert left["members"][blob]["size"] >= WEIGHT_BYTES
    assert left["members"][blob] == right["members"][blob]
    assert left["members"][blob]["chunk_sha256"]  # chunk sums computed while streaming


def test_tensor_references_do_not_leak_out_of_the_block():
    tensor = Tensor(np.zeros((64, 64), np.float32))
    with tensor_references() as refs:
        proto = tensor.to_proto("w")
        assert proto.data_location == TensorProto.EXTERNAL and refs
    assert tensor.to_proto("w").raw_data == np.zeros((64, 64), np.float32).tobytes()


# --- compile-time fixes ----------------------------------------------------------------------


def test_heap_frozen_nests_and_restores():
    assert gc.get_freeze_count() == 0
    with heap_frozen():
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with heap_frozen():
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
    assert gc.get_freeze_count() == 0
    with collection_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_call_with_bindings_caches_per_function_not_per_instance():
    class Rule:
        def check(self, x, **_):
            return ("check", x)

        def rewrite(self, op, y):
            return (op, y)

    a, b = Rule(), Rule()
    assert call_with_bindings(a.check, {"x": 1, "z": 2}) == ("check", 1)
    assert call_with_bindings(b.rewrite, {"y": 3, "x": 4}, "op") == ("op", 3)
    assert call_with_bindings(b.check, {"x": 5}) == ("check", 5)

    def free(x):
        return x
    assert call_with_bindings(free, {"x": 6, "y": 7}) == 6


def test_a_read_external_tensor_still_exports_its_data(big):
    path, weights = big
    tensor = load_onnx(path).graph.initializers["w2"].const
    tensor.numpy()
    proto = tensor.to_proto("renamed")
    assert proto.name == "renamed" and proto.data_location == TensorProto.DEFAULT
    np.testing.assert_array_equal(numpy_helper.to_array(proto), weights[2])


def test_saving_over_the_input_works_and_stale_tensors_read_what_they_were_loaded_with(
        tmp_path):
    path, weights = _external_model(str(tmp_path), "same.onnx")
    model = load_onnx(path)
    save_onnx(model, path, external=True)  # reads every weight before the data file is replaced
    np.testing.assert_array_equal(load_onnx(path).graph.initializers["w4"].const.numpy(),
                                  weights[4])
    stale = load_onnx(path)
    save_onnx(load_onnx(path), path, external=True)
    # graphopt's own save kept the replaced file open for tensors that still read it.
    np.testing.assert_array_equal(stale.graph.initializers["w0"].const.numpy(), weights[0])
    # Another program's replacement is not: its offsets would point at other bytes.
    elsewhere = load_onnx(path)
    replacement = str(tmp_path / "new.data")
    with open(path + ".data", "rb") as old, open(replacement, "wb") as new:
        new.write(old.read())
    os.replace(replacement, path + ".data")
    with pytest.raises(ValueError, match="was replaced or changed after the model was loaded"):
        elsewhere.graph.initializers["w0"].const.numpy()


def test_an_external_location_holding_a_nul_is_refused_by_name(tmp_path):
    # os.path.realpath raised a bare ValueError (embedded null byte): an internal error.
    from graphopt.errors import InputError

    path, _ = _external_model(str(tmp_path), "nul.onnx")
    proto = onnx.load(path, load_external_data=False)
    proto.graph.initializer[0].external_data[0].value = "w.bin\x00evil"
    onnx.save(proto, path)
    with pytest.raises(InputError, match=re.escape("location 'w.bin\\x00evil' holds a NUL")):
        load_onnx(path)


def test_a_data_file_deleted_after_loading_is_an_input_error(tmp_path):
    # A bare FileNotFoundError escaped save() and to_onnx().
    from graphopt.errors import InputError

    path, _ = _external_model(str(tmp_path), "gone.onnx")
    model = load_onnx(path)
    os.remove(path + ".data")
    with pytest.raises(InputError, match=f"external data file {path}.data of tensor 'w0' cannot "
                                         "be read since the model was loaded"):
        model.graph.initializers["w0"].const.numpy()


@pytest.mark.parametrize("name, options", [
    ("bert_base", {"layers": 2, "hidden": 64, "heads": 4, "intermediate": 128,
                   "vocab": 100}),
    ("gpt2_small", {}), ("tiny", {}), ("mobilenetv2", {})])
def test_match_prefilter_never_rejects_a_match(name, options, monkeypatch):
    """RulePass skips candidates `could_match` rules out; with every rule traced it skips
    none, so each match found must have passed the prefilter."""
    from graphopt import zoo
    from graphopt.ir.pattern import Matcher
    from graphopt.passes.rules import RULES

    found = []
    original = Matcher.matches

    def checked(self, node, limit=8):
        for match in original(self, node, limit):
            assert self.could_match(node), f"prefilter rejects a match at {node}"
            found.append(node)
            yield match

    monkeypatch.setattr(Matcher, "matches", checked)
    optimize(zoo.build(name, **options), level=3, trace_rules=list(RULES))
    assert found


def test_paused_collection_leaves_what_it_built_in_the_oldest_generation():
    """Objects built under collection_paused are not walked by young collections afterwards."""
    with collection_paused():
        built = [[] for _ in range(20_000)]
    assert gc.get_count()[0] < 20_000
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert id(built[0]) in oldest and id(built[-1]) in oldest
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with collection_paused():
            [[] for _ in range(100)]
        assert gc.get_freeze_count() >= frozen  # a caller's freeze is kept
    finally:
        gc.unfreeze()


def _bytes_in(model: onnx.ModelProto, marker: bytes) -> bytes:
    data = model.SerializeToString()
    assert marker in data
    return data.replace(marker, b"\xff" * len(marker))  # same length: the wire format holds


@pytest.mark.parametrize("marker, field", [(b"NODENAME", "name"), (b"OUTNAME", "output"),
                                           (b"ATTRDOC", "doc_string")])
def test_text_fields_that_are_not_utf8_are_named_at_import(marker, field):
    node = helper.make_node("Transpose", ["x"], ["OUTNAME"], name="NODENAME", perm=[1, 0])
    node.attribute[0].doc_string = "ATTRDOC"
    model = helper.make_model(helper.make_graph(
        [node, helper.make_node("Relu", ["OUTNAME"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])]), ir_version=IR_VERSION)
    with pytest.raises(InputError, match=f"field '{field}' is not valid UTF-8"):
        load_onnx(_bytes_in(model, marker))


def test_check_ops_judges_each_node_not_only_the_first_of_its_kind():
    """check_ops remembers the verdict for nodes alike; a node that differs in what the schema
    check reads (an omitted input, an attribute) is still checked, and named."""
    from graphopt.opcheck import check_ops

    def model(*nodes):
        return load_onnx(helper.make_model(helper.make_graph(
            list(nodes), "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
            [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 3])]),
            opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION))

    fine = [helper.make_node("Add", ["x", "x"], ["a"], name="first"),
            helper.make_node("Add", ["a", "x"], ["b"], name="second"),
            helper.make_node("Relu", ["b"], ["c"], name="third")]
    check_ops(model(*fine), "m.onnx")
    missing = helper.make_node("Add", ["a", ""], ["b"], name="second")
    with pytest.raises(InputError, match="node 'second' \\(Add\\)"):
        check_ops(model(fine[0], missing, fine[2]), "m.onnx")
    extra = helper.make_node("Relu", ["b"], ["c"], name="third", alpha=0.5)
    with pytest.raises(InputError, match="node 'third' \\(Relu\\)"):
        check_ops(model(*fine[:2], extra), "m.onnx")


def test_passes_and_memory_plans_run_without_collections(monkeypatch):
    """The passes and the memory plan build many objects and free few: no collection walks
    them meanwhile, and afterwards the collector is on and nothing stays frozen."""
    from graphopt import compiler, zoo
    from graphopt.passes.instruments import Instrument
    from graphopt.passes.memory import plan_memory

    during = []

    class Probe(Instrument):
        def after_pass(self, model, record, log):
            during.append(gc.isenabled())

    def planned(model, **kwargs):
        during.append(gc.isenabled())
        return plan_memory(model, **kwargs)

    monkeypatch.setattr("graphopt.passes.memory.plan_memory", planned)
    result = compiler.optimize(zoo.build("tiny"), target="cpu", instruments=[Probe()])
    assert result.memory_plans and during and not any(during)
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_dropped_result_is_collected_before_the_next_import(monkeypatch):
    """freeze + unfreeze moves the IR into the oldest generation without CPython counting it,
    so its own rule would never start the full collection a dropped (cyclic) result needs:
    graphopt counts what it moved and collects before the next import once that passes a
    quarter of the oldest generation."""
    import weakref

    from graphopt import compiler, zoo
    from graphopt.ir import collector

    model = zoo.build("tiny")
    dropped = weakref.ref(compiler.optimize(model))
    assert collector._moved > 0
    monkeypatch.setattr(collector, "_long_lived", 0)  # due: the next import collects
    kept = compiler.optimize(model)
    assert dropped() is None and kept.model is not None


def test_no_collection_when_the_caller_turned_the_collector_off(monkeypatch):
    from graphopt import compiler, zoo
    from graphopt.ir import collector

    collections = []
    monkeypatch.setattr(collector.gc, "collect", lambda *a: collections.append(a))
    monkeypatch.setattr(collector, "_long_lived", 0)
    gc.disable()
    try:
        compiler.optimize(zoo.build("tiny"))
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert collections == []
