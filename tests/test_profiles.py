"""Shape profiles (`--dynamic-dims`): parsing, one compile per profile, the .om that holds them
all, and the runtime that picks the profile the inputs match."""

from __future__ import annotations

import json
import threading
import zipfile

import numpy as np
import onnx
import pytest

import graphopt
from graphopt import numerics
from graphopt.codegen import load_om
from graphopt.errors import (ArtifactError, GraphoptError, InputError, OptionError,
                             VerificationError)
from graphopt.ir import load_onnx
from graphopt.passes.instruments import Instrument
from graphopt.shape_profiles import expand_profiles, parse_dynamic_dims
from graphopt.table import format_bytes
from helpers import conv_topk_model, parse_model, run_cli

RTOL, ATOL = 1e-4, 1e-5


def mlp_model() -> onnx.ModelProto:
    """Batch and sequence dims by name; a 1 MiB weight, so each profile's partition would hold
    a weights blob of its own if the profiles did not share it."""
    rng = np.random.default_rng(3)
    return parse_model("""
        g (float[batch, seq, 512] x) => (float[batch, seq, 8] y) {
            h = MatMul (x, w1)
            hb = Add (h, b1)
            r = Relu (hb)
            s = Shape (x)
            lead = Slice (s, zero, two)
            shape = Concat <axis = 0> (lead, eight)
            o = MatMul (r, w2)
            flat = Reshape (o, shape)
            y = Softmax <axis = -1> (flat)
        }""", w1=(rng.standard_normal((512, 512)) * 0.05).astype(np.float32),
        b1=rng.standard_normal(512).astype(np.float32),
        w2=(rng.standard_normal((512, 8)) * 0.05).astype(np.float32),
        zero=np.array([0], np.int64), two=np.array([2], np.int64),
        eight=np.array([8], np.int64))


def feeds_for(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, seq, 512)).astype(np.float32)}


def assert_matches(model: onnx.ModelProto, session, feeds) -> None:
    expected = numerics.run(model, feeds)  # onnxruntime at ORT_DISABLE_ALL
    got = session.run(feeds)
    for name, want in expected.items():
        np.testing.assert_allclose(got[name], want, rtol=RTOL, atol=ATOL, err_msg=name)


@pytest.fixture(scope="module")
def mlp_om(tmp_path_factory):
    path = tmp_path_factory.mktemp("profiles") / "mlp.om"
    model = mlp_model()
    result = graphopt.optimize(model, target="cpu", dynamic_dims="batch:1,4;seq:16,32")
    graphopt.save(result, path)
    return model, result, path


# --- parsing and expansion -----------------------------------------------------------------


def test_parse_grid_and_listed_forms():
    assert parse_dynamic_dims("batch:1,4,8; seq:128,512") == {"batch": [1, 4, 8], "seq": [128, 512]}
    assert parse_dynamic_dims("batch=1,seq=512;batch=8,seq=128") == [
        {"batch": 1, "seq": 512}, {"batch": 8, "seq": 128}]
    assert parse_dynamic_dims("x[0]:2,3") == {"x[0]": [2, 3]}


@pytest.mark.parametrize("text, message", [
    ("", "no dims given"),
    ("batch", "is not DIM:V1,V2"),
    ("batch:1,x", "'x' is not an integer"),
    ("batch:-1,2", "sizes must be ≥ 0"),
    ("batch:1;batch:2", "dim 'batch' is given twice"),
    ("batch:1;seq=2", "is not DIM:V1,V2"),
])
def test_parse_refuses_bad_text(text, message):
    with pytest.raises(OptionError, match=message):
        parse_dynamic_dims(text)


def test_expand_makes_every_combination_in_order():
    profiles = expand_profiles(load_onnx(mlp_model()), "batch:1,4;seq:16,32")
    assert [p.name for p in profiles] == ["profile0", "profile1", "profile2", "profile3"]
    assert [p.dims for p in profiles] == [{"batch": 1, "seq": 16}, {"batch": 1, "seq": 32},
                                          {"batch": 4, "seq": 16}, {"batch": 4, "seq": 32}]
    assert profiles[3].input_shapes == {"x": [4, 32, -1]}
    assert profiles[3].label == "batch=4, seq=32"


def test_expand_by_axis_and_listed():
    model = load_onnx(mlp_model())
    (only,) = expand_profiles(model, "x[1]:7")
    assert only.input_shapes == {"x": [-1, 7, -1]}
    # numpy's integers are sizes too, alone or in an array
    assert [p.dims for p in expand_profiles(model, {"batch": np.int64(4), "seq": np.arange(
        1, 3)})] == [{"batch": 4, "seq": 1}, {"batch": 4, "seq": 2}]
    listed = expand_profiles(model, [{"batch": 2, "seq": 3}, {"batch": 5, "seq": 3}])
    assert [p.input_shapes["x"] for p in listed] == [[2, 3, -1], [5, 3, -1]]


def test_an_axis_key_on_a_named_dim_stands_for_that_dim_everywhere():
    # a[0] and b[0] are both N: one key pins N in both inputs; two keys are the same dim twice.
    model = load_onnx(parse_model("""
        g (float[N,4] a, float[N,4] b) => (float[N,4] y) { y = Add(a, b) }"""))
    profiles = expand_profiles(model, "a[0]:1,2")
    assert [p.input_shapes for p in profiles] == [{"a": [1, -1], "b": [1, -1]},
                                                  {"a": [2, -1], "b": [2, -1]}]
    with pytest.raises(OptionError, match=r"'b\[0\]' and 'a\[0\]' name the same dim, a\[0\]'s "
                                          r"\(inputs that share a dim name share its size\), "
                                          r"and a profile gives them 2 and 1: give it once"):
        expand_profiles(model, "a[0]:1,2;b[0]:1,2")


def test_keys_naming_one_dim_with_one_size_in_every_profile_are_one_key():
    # ATC's --dynamic_batch_size gives every -1 dim the batch size: inputs sharing their batch
    # name it twice per profile, with one size, which was refused as a dim given twice.
    model = load_onnx(parse_model("""
        g (float[N,4] a, float[N,4] b) => (float[N,4] y) { y = Add(a, b) }"""))
    profiles = expand_profiles(model, "a[0]=1,b[0]=1;a[0]=4,b[0]=4")
    assert [p.dims for p in profiles] == [{"a[0]": 1}, {"a[0]": 4}]
    assert [p.input_shapes for p in profiles] == [{"a": [1, -1], "b": [1, -1]},
                                                  {"a": [4, -1], "b": [4, -1]}]
    with pytest.raises(OptionError, match="a profile gives them 2 and 4: give it once"):
        expand_profiles(model, "a[0]=1,b[0]=1;a[0]=4,b[0]=2")


@pytest.mark.parametrize("spec, message", [
    ("batches:1,2", r"no dynamic input dim 'batches' \(its dynamic dims: batch \(x\[0\]\); "
                    r"seq \(x\[1\]\)\)"),
    ("x[2]:4", r"fixes x\[2\] at 512: a profile cannot give it another size"),
    ("batch:1;x[0]:2", "'x\\[0\\]' and 'batch' name the same dim"),
    ("batch=1;seq=2", "every profile must set the same dims"),
    # One dim named two ways in two listed profiles read as the line above.
    ("batch=1;x[0]=2", r"'x\[0\]' and 'batch' name the same dim, x\[0\]'s: name it one way "
                       "in every profile"),
    ("batch=1;batch=1", "a profile is listed twice"),
    ("batch:" + ",".join(map(str, range(1, 12))) + ";seq:" + ",".join(map(str, range(1, 11))),
     r"110 profiles, more than 100 \(.*\): list fewer values per dim, or name only the profiles "
     r"you serve one by one \(DIM=V,DIM=V;…\)$"),
    # Listed one by one already: that form is no way around the limit.
    (";".join(f"batch={n},seq=1" for n in range(1, 102)),
     r"101 profiles, more than 100 \(each is a compile of its own; the limit holds for the "
     r"combinations of DIM:V1,V2 and the listed DIM=V form alike\): list fewer profiles$"),
    # From Python: sizes are integers, never truncated floats.
    ({"batch": [1.5]}, "dim 'batch': 1.5 is not an integer"),
    ([{"batch": 2.7, "seq": 3}], "dim 'batch': 2.7 is not an integer"),
    ({"batch": None}, "dim 'batch': expected a size or a list of sizes, got None"),
])
def test_expand_refuses_what_cannot_be_compiled(spec, message):
    with pytest.raises(OptionError, match=message):
        expand_profiles(load_onnx(mlp_model()), spec)


def test_an_input_of_unknown_rank_is_not_called_static():
    # x has no shape at all: its dims are unknown, not static, and no key can name them.
    from onnx import TensorProto, helper

    def model_of(*inputs: onnx.ValueInfoProto):
        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", list(inputs),
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        return load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                           ir_version=8))

    unranked = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
    model = model_of(unranked, helper.make_tensor_value_info("m", TensorProto.FLOAT, ["N"]))
    with pytest.raises(OptionError, match=r"no dynamic input dim 'x\[0\]' \(its dynamic dims: "
                                          r"N \(m\[0\]\); input 'x' of unknown rank \(no shape "
                                          r"in the model\), whose dims no key can name; "
                                          r"input_shapes can pin a shape for one compile\)$"):
        expand_profiles(model, "x[0]:1,2")
    with pytest.raises(OptionError, match=r"\(input 'x' of unknown rank"):  # not all static
        expand_profiles(model_of(unranked), "x[0]:1,2")


# --- compile, artifact, runtime -------------------------------------------------------------


def test_every_profile_is_compiled_with_its_static_shapes(mlp_om):
    _, result, _ = mlp_om
    assert [c.profile.name for c in result.profiles] == [f"profile{i}" for i in range(4)]
    assert result is result.profiles[0].result
    for compiled in result.profiles:
        (x,) = [v for v in compiled.result.model.graph.inputs if v.name == "x"]
        assert list(x.shape) == [compiled.profile.dims["batch"], compiled.profile.dims["seq"], 512]
        # Static shapes: the Shape/Slice/Concat chain folded away, and every partition planned.
        assert "Shape" not in {n.op_type for n in compiled.result.model.graph}
        assert all(not isinstance(p, str) for p in compiled.result.memory_plans.values())
    arenas = [sum(p.arena_bytes for p in c.result.memory_plans.values()) for c in result.profiles]
    assert arenas[3] > arenas[0]  # 4×32 tokens need more work memory than 1×16


def test_artifact_runs_each_profile_and_refuses_a_misfit(mlp_om):
    model, _, path = mlp_om
    session = graphopt.load(path)
    assert session.inputs == [{"name": "x", "dtype": "float32", "shape": ["batch", "seq", 512]}]
    assert [p["name"] for p in session.profiles] == [f"profile{i}" for i in range(4)]
    for index, (batch, seq) in enumerate([(1, 16), (1, 32), (4, 16), (4, 32)]):
        feeds = feeds_for(batch, seq, seed=index)
        assert session.profile_for(feeds) == f"profile{index}"
        assert_matches(model, session, feeds)
    with pytest.raises(GraphoptError, match=r"input shapes x\[2, 16, 512\] fit none of the "
                                            r"model's 4 shape profiles: profile0 \(batch=1, "
                                            r"seq=16\); .*profile3 \(batch=4, seq=32\)"):
        session.run(feeds_for(2, 16))
    with pytest.raises(GraphoptError, match="dim 2 must be 512"):
        session.run({"x": np.zeros((1, 16, 3), np.float32)})


def test_manifest_holds_the_profiles_and_shares_the_weights(mlp_om):
    _, _, path = mlp_om
    artifact = load_om(path)
    manifest = artifact.manifest
    assert manifest["format_version"] == 2
    assert [p["dims"] for p in manifest["profiles"]][1] == {"batch": 1, "seq": 32}
    assert manifest["profiles"][2]["inputs"][0]["shape"] == [4, 16, 512]
    assert manifest["execution_order"] == manifest["profiles"][0]["execution_order"]
    assert len(manifest["partitions"]) == 4
    assert set(artifact.extra["profiles"]) == {f"profile{i}" for i in range(4)}
    # The 1 MiB weight is stored once, not once per profile.
    weights = [info["size"] for name, info in manifest["members"].items()
               if name.startswith("weights/")]
    assert len(weights) == 1 and 512 * 512 * 4 <= weights[0] < 2 * 512 * 512 * 4
    view = artifact.profile("profile3")
    assert [p.name for p in view.partitions] == manifest["profiles"][3]["execution_order"]
    with pytest.raises(KeyError, match="no shape profile 'nope'"):
        artifact.profile("nope")
    with pytest.raises(KeyError, match=r"no partition 'p0_cpu' \(partitions: profile0.p0_cpu, "):
        artifact.partition_model("p0_cpu")


def test_profiles_share_weights_that_add_up_to_less_than_a_blob(tmp_path):
    # 256×960 float32 (983 KB): alone it stays inline in its partition, but eight profiles
    # must not carry eight copies.
    rng = np.random.default_rng(0)
    model = parse_model("g (float[N,256] x) => (float[N,960] y) { y = MatMul (x, w) }",
                        w=rng.standard_normal((256, 960)).astype(np.float32))
    one, eight = tmp_path / "one.om", tmp_path / "eight.om"
    graphopt.save(graphopt.optimize(model, dynamic_dims="N:1"), one)
    graphopt.save(graphopt.optimize(model, dynamic_dims="N:" + ",".join(map(str, range(1, 9)))),
                  eight)
    assert not [n for n in load_om(one).manifest["members"] if n.startswith("weights/")]
    assert eight.stat().st_size < one.stat().st_size + 100_000
    session = graphopt.load(eight)
    for batch in (1, 5, 8):
        x = rng.standard_normal((batch, 256)).astype(np.float32)
        np.testing.assert_allclose(session.run({"x": x})["y"], numerics.run(model, {"x": x})["y"],
                                   rtol=1e-4, atol=1e-4)


def test_the_profiles_of_a_model_file_share_one_parse_of_it(tmp_path, monkeypatch):
    # Each profile imports the model afresh; one parse lets them share the weights' bytes
    # (BERT-base with 6 profiles peaked at 3.54 GB with a parse each, 1.24 GB with one).
    import contextlib

    import graphopt.ir.onnx_io as onnx_io
    from graphopt import compile_profiles

    rng = np.random.default_rng(0)
    path = tmp_path / "m.onnx"
    onnx.save(parse_model("g (float[N,64] x) => (float[N,32] y) { y = MatMul (x, w) }",
                          w=rng.standard_normal((64, 32)).astype(np.float32)), path)
    reads = []
    real = onnx_io.read_model_proto

    def counted(*args, **kwargs):
        reads.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(onnx_io, "read_model_proto", counted)
    shared = graphopt.optimize(path, dynamic_dims="N:1,2,4")
    assert len(reads) == 1
    graphopt.optimize(path, dynamic_dims="N:1,2,4")
    assert len(reads) == 2  # a compile's parse is not kept past it
    monkeypatch.setattr(onnx_io, "read_model_proto", real)
    monkeypatch.setattr(compile_profiles, "shared_parses", contextlib.nullcontext)
    apart = graphopt.optimize(path, dynamic_dims="N:1,2,4")  # a parse per profile
    graphopt.save(shared, tmp_path / "shared.om")
    graphopt.save(apart, tmp_path / "apart.om")
    assert (tmp_path / "shared.om").read_bytes() == (tmp_path / "apart.om").read_bytes()


def test_one_session_serves_all_profiles_from_many_threads(mlp_om):
    model, _, path = mlp_om
    session = graphopt.load(path)
    shapes = [(1, 16), (1, 32), (4, 16), (4, 32)]
    cases = [feeds_for(*shapes[i % 4], seed=i) for i in range(8)]
    expected = [numerics.run(model, feeds)["y"] for feeds in cases]
    failures = []

    def worker(index: int) -> None:
        for _ in range(10):
            got = session.run(cases[index])["y"]
            if not np.allclose(got, expected[index], rtol=RTOL, atol=ATOL):
                failures.append(index)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_profiles_partition_for_an_npu_where_the_dynamic_model_cannot(tmp_path):
    model = conv_topk_model(k=3, batch="N")
    dynamic = graphopt.optimize(model, target="ascend310")
    reasons = {r for _, r in dynamic.partitioning.fallbacks()}
    assert dynamic.partitioning.partitions[0].device == "cpu" and any(
        "dynamic" in r for r in reasons)
    result = graphopt.optimize(model, target="ascend310", dynamic_dims="N:1,4")
    for compiled in result.profiles:
        devices = [p.device for p in compiled.result.partitioning.partitions]
        assert devices == ["npu", "cpu"], devices
        (topk,) = [(n.op_type, r) for n, r in compiled.result.partitioning.fallbacks()]
        assert topk[0] == "TopK"
    path = tmp_path / "conv.om"
    graphopt.save(result, path)
    with pytest.warns(RuntimeWarning, match="functional stand-in"):
        session = graphopt.load(path)
    for batch in (1, 4):
        feeds = {"x": np.random.default_rng(batch).standard_normal((batch, 8, 32, 32))
                 .astype(np.float32)}
        assert_matches(model, session, feeds)
    assert len(session.providers) == 4  # two partitions per profile


def test_input_shape_pins_combine_with_profiles(tmp_path):
    result = graphopt.optimize(mlp_model(), dynamic_dims="seq:8,16", input_shapes="x:2,-1,512")
    assert [c.profile.input_shapes for c in result.profiles] == [{"x": [-1, 8, -1]},
                                                                {"x": [-1, 16, -1]}]
    (x,) = [v for v in result.profiles[1].result.model.graph.inputs if v.name == "x"]
    assert list(x.shape) == [2, 16, 512]
    with pytest.raises(OptionError, match="pins input 'x' dim 1 to 4, and dynamic_dims's "
                                          "profile seq=8 makes it 8: size it with one"):
        graphopt.optimize(mlp_model(), dynamic_dims="seq:8", input_shapes="x:2,4,512")
    # A conflict in a later profile is refused before the first profile is compiled.
    calls = []
    with pytest.raises(OptionError, match="seq=8 makes it 8"):
        graphopt.optimize(mlp_model(), dynamic_dims="seq:4,8", input_shapes="x:2,4,512",
                          instruments=[_Recorder(calls)])
    assert calls == []


class _Recorder(Instrument):
    """Notes every compile that starts."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def start(self, model) -> None:
        self.calls.append(model.graph.name)


def test_a_profile_that_leaves_a_dim_dynamic_matches_any_size_there(tmp_path):
    path = tmp_path / "batch.om"
    model = mlp_model()
    graphopt.save(graphopt.optimize(model, dynamic_dims="batch:1,3"), path)
    session = graphopt.load(path)
    assert session.profiles[1]["inputs"][0]["shape"] == [3, "seq", 512]
    for batch, seq in [(1, 5), (3, 9)]:
        assert_matches(model, session, feeds_for(batch, seq))
    with pytest.raises(GraphoptError, match="fit none"):
        session.run(feeds_for(2, 5))


def test_a_profile_of_an_empty_kv_cache_runs_the_first_decoder_step(tmp_path):
    # A decoder's past keys are [B, P, D], and P is 0 at its first step: a size --input-shape
    # takes, which --dynamic-dims refused.
    model = parse_model("""
        g (float[1, P, 8] past, float[1, 1, 8] x) => (float[1, T, 8] present, float[1, 1, 8] y) {
            present = Concat <axis = 1> (past, x)
            scores = MatMul (x, w)
            y = Add (scores, x)
        }""", w=np.eye(8, dtype=np.float32))
    path = tmp_path / "step.om"
    graphopt.save(graphopt.optimize(model, dynamic_dims="P:0,8", verify=True), path)
    rng = np.random.default_rng(0)
    with graphopt.load(path) as session:
        for past in (0, 8):
            feeds = {"past": rng.standard_normal((1, past, 8)).astype(np.float32),
                     "x": rng.standard_normal((1, 1, 8)).astype(np.float32)}
            got = session.run(feeds)
            assert got["present"].shape == (1, past + 1, 8)
            np.testing.assert_allclose(got["present"], numerics.run(model, feeds)["present"])


def test_one_profile_is_counted_as_one(tmp_path):
    # Both reprs had said "1 shape profiles".
    path = tmp_path / "one.om"
    result = graphopt.optimize(mlp_model(), dynamic_dims="seq:16")
    assert repr(result).endswith(", 1 shape profile>")
    graphopt.save(result, path)
    session = graphopt.load(path)
    assert_matches(mlp_model(), session, feeds_for(2, 16))
    assert repr(session).endswith(", 1 shape profile>")


def test_verify_checks_every_profile_and_options_are_checked_once():
    model = mlp_model()
    result = graphopt.optimize(model, dynamic_dims="batch:1,2", input_shapes="x:-1,4,512",
                               verify=True)
    assert all(c.result.max_abs_error is not None for c in result.profiles)
    with pytest.raises(OptionError, match=r"^fold_size_limit must be ≥ 0 bytes, got -1$"):
        graphopt.optimize(model, dynamic_dims="seq:8", fold_size_limit=-1)


def test_profiles_need_an_om(tmp_path):
    result = graphopt.optimize(mlp_model(), dynamic_dims="batch:1,2")
    with pytest.raises(OptionError, match="kept together in an .om"):
        graphopt.save(result, tmp_path / "x.onnx")
    assert not (tmp_path / "x.onnx").exists()


# --- refused artifacts ----------------------------------------------------------------------


def _rewrite(src, dst, mutate):
    with zipfile.ZipFile(src) as zf:
        members = {name: zf.read(name) for name in zf.namelist()}
    manifest = json.loads(members.pop("manifest.json"))
    mutate(manifest)
    with zipfile.ZipFile(dst, "w") as zf:
        zf.writestr("manifest.json", json.dumps(manifest))
        for name, data in members.items():
            zf.writestr(name, data)
    return dst


def _drop_profiles(manifest):
    del manifest["profiles"]


def _version_1(manifest):
    manifest["format_version"] = 1


def _partition_in_two_profiles(manifest):
    manifest["profiles"][1]["execution_order"] = manifest["profiles"][0]["execution_order"]


def _wrong_profile_inputs(manifest):
    manifest["profiles"][1]["inputs"][0]["name"] = "z"


def _forged_profile_routing(manifest):
    manifest["profiles"][2]["routing"][0]["from"] = "profile0.p0"


def _dims_order_of_other_dims(manifest):
    manifest["profiles"][0]["dims_order"] = ["batch", "sequence"]


@pytest.mark.parametrize("mutate, message", [
    (_drop_profiles, "manifest has no 'profiles'"),
    (_dims_order_of_other_dims, "profile 'profile0' dims_order must list its dims' keys once"),
    (_version_1, "manifest has profiles, which need format_version 2"),
    (_partition_in_two_profiles, "every partition exactly once across the profiles"),
    (_wrong_profile_inputs, "manifest profile 'profile1' inputs are not the artifact's"),
    (_forged_profile_routing, "profile 'profile2': manifest routing does not match"),
])
def test_malformed_profiles_are_refused(mlp_om, tmp_path, mutate, message):
    _, _, path = mlp_om
    bad = _rewrite(path, tmp_path / "bad.om", mutate)
    with pytest.raises(ArtifactError, match=message):
        graphopt.load(bad)


# --- command line ---------------------------------------------------------------------------


def test_cli_compiles_inspects_and_runs_profiles(tmp_path, capsys):
    source = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), source)
    out = tmp_path / "mlp.om"
    rc, text, err = run_cli(capsys, "optimize", source, "-o", out, "--dynamic-dims",
                            "batch=1,seq=8;batch=2,seq=4")
    assert rc == 0, err
    assert "shape profiles (2): one plan each in the .om" in text
    assert "batch=2, seq=4" in text
    rc, text, err = run_cli(capsys, "inspect", out)
    assert rc == 0, err
    assert "shape profiles (2;" in text and "x[2,4,512]" in text
    assert "signature" in text and "[batch,seq,512]" in text
    rc, text, err = run_cli(capsys, "run", out, "--profile", "profile1")
    assert rc == 0, err
    assert "shape profile profile1 (batch=2, seq=4) of 2" in text
    rc, _, err = run_cli(capsys, "run", out, "--profile", "profile9")
    assert rc == 1 and "has no shape profile 'profile9' (profiles: profile0, profile1)" in err
    rc, text, err = run_cli(capsys, "optimize", source, "-o", out, "--dynamic-dims",
                            "batch:1,2", "--input-shape", "x:-1,4,512", "--verify")
    assert rc == 0, err
    assert "verified in each of 2 shape profiles: 1 output(s) match the original" in text
    rc, _, err = run_cli(capsys, "optimize", source, "-o", tmp_path / "x.onnx",
                         "--dynamic-dims", "batch:1")
    assert rc == 1 and "kept together in an .om" in err
    rc, _, err = run_cli(capsys, "optimize", source, "-o", out, "--dynamic-dims", "b:1")
    assert rc == 1 and "no dynamic input dim 'b'" in err
    # A value of the wrong form is a usage error, found before the model is read.
    rc, _, err = run_cli(capsys, "optimize", tmp_path / "missing.onnx", "-o", out,
                         "--dynamic-dims", "batch:a")
    assert rc == 2 and "argument --dynamic-dims: dim 'batch': 'a' is not an integer" in err


def test_compare_and_profile_use_the_profile_the_inputs_run_on(tmp_path, capsys):
    source = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), source)
    out = tmp_path / "mlp.om"
    graphopt.save(graphopt.optimize(source, dynamic_dims="batch:1,2;seq:4"), out)
    inputs = tmp_path / "x.npz"
    np.savez(inputs, **feeds_for(2, 4))
    rc, text, err = run_cli(capsys, "compare", source, out, "--inputs", inputs, "--per-tensor")
    assert rc == 0, err
    assert "result: PASS" in text and "f32[2,4,8]" in text
    assert "mlp.om ran its shape profile profile1 (batch=2, seq=4), one of 2\n" in text
    rc, text, err = run_cli(capsys, "profile", out, "--inputs", inputs, "--repeat", "2")
    assert rc == 0, err
    assert "1 partition(s)" in text and "MatMul" in text
    # Without --inputs, the random data takes the first profile's shapes.
    graphopt.save(graphopt.optimize(source, dynamic_dims="batch:2,1;seq:4,8"), out)
    rc, text, err = run_cli(capsys, "compare", source, out)
    assert rc == 0, err
    assert "result: PASS" in text and "f32[2,4,8]" in text


def test_report_names_the_profiles(mlp_om, tmp_path, capsys):
    _, _, path = mlp_om
    page = tmp_path / "mlp.html"
    rc, _, err = run_cli(capsys, "report", path, "-o", page)
    assert rc == 0, err
    html = page.read_text()
    assert "shape profiles</th><td>4, a run takes the one its input shapes match" in html
    assert "<td>profile3</td><td>batch=4, seq=32</td>" in html
    # Every profile's memory plan is there, and the largest is named: buffers are sized by it.
    artifact = load_om(path)
    sizes = {name: sum(p["arena_bytes"] for p in section["memory_plan"].values())
             for name, section in artifact.extra["profiles"].items()}
    largest = max(sizes, key=sizes.get)
    assert largest != "profile0" and f"{largest} needs the most work memory" in html
    assert all(f"<td>{name}</td><td>{name}.p0_cpu</td>" in html for name in sizes)
    assert f"{format_bytes(sizes[largest])} (largest)</td>" in html
    # Profiles that tie for the most memory have no one largest.
    from graphopt.codegen.inspect_om import largest_profile

    rows = [{"name": f"p{i}", "work_bytes": size} for i, size in enumerate((0, 0, 0))]
    assert largest_profile(rows) is None
    assert largest_profile(rows[:2] + [{"name": "p2", "work_bytes": 5}]) == "p2"


def test_write_om_refuses_profiles_that_cannot_share_an_artifact(tmp_path):
    from graphopt.codegen import OmPartition, OmProfile, write_om

    def part(name: str, output: str = "y") -> OmPartition:
        proto = parse_model(f"g (float[2] x) => (float[2] {output}) {{ {output} = Relu (x) }}")
        return OmPartition(name, "cpu", proto)

    path = tmp_path / "x.om"
    with pytest.raises(ValueError, match="two profiles have a partition named 'p0'"):
        write_om(path, [], profiles=[OmProfile("a", {"n": 1}, [part("p0")]),
                                     OmProfile("b", {"n": 2}, [part("p0")])])
    with pytest.raises(ValueError, match=r"profile 'b' has inputs \['x'\] and outputs \['z'\]"):
        write_om(path, [], profiles=[OmProfile("a", {"n": 1}, [part("a.p0")]),
                                     OmProfile("b", {"n": 2}, [part("b.p0", "z")])])
    with pytest.raises(ValueError, match="give the partitions or the profiles"):
        write_om(path, [part("p0")], profiles=[OmProfile("a", {"n": 1}, [part("a.p0")])])
    assert not path.exists()


def test_profiles_whose_partitions_take_the_inputs_in_another_order_share_an_artifact(tmp_path):
    # One profile runs on one device, another is split in two: their partitions meet the
    # inputs in different orders, and the artifact lists them in the model's.
    from graphopt.codegen import OmPartition, OmProfile, write_om

    whole = OmPartition("a.p0", "cpu", parse_model(
        "g (float[2] x, float[2] m) => (float[2] y) { h = Mul (x, m)\n y = Relu (h) }"))
    first = OmPartition("b.p0", "cpu", parse_model(
        "g (float[2] m, float[2] x) => (float[2] h) { h = Mul (x, m) }"))
    second = OmPartition("b.p1", "npu", parse_model(
        "g (float[2] h) => (float[2] y) { y = Relu (h) }"))
    path = tmp_path / "x.om"
    write_om(path, [], profiles=[OmProfile("a", {"n": 1}, [whole]),
                                 OmProfile("b", {"n": 2}, [first, second])], inputs=["x", "m"])
    assert [entry["name"] for entry in load_om(path).manifest["inputs"]] == ["x", "m"]


def test_an_om_compiled_without_a_target_says_so(tmp_path):
    graphopt.save(graphopt.optimize(mlp_model()), tmp_path / "portable.om")
    assert load_om(tmp_path / "portable.om").manifest["target"] == "none"


def test_a_session_may_open_only_some_profiles(mlp_om):
    model, _, path = mlp_om
    session = graphopt.load(path, profiles=["profile1", "profile3"])
    assert [p["name"] for p in session.profiles] == ["profile1", "profile3"]
    assert len(session.providers) == 2
    for batch, seq, name in [(1, 32, "profile1"), (4, 32, "profile3")]:
        feeds = feeds_for(batch, seq)
        assert session.profile_for(feeds) == name
        assert_matches(model, session, feeds)
    with pytest.raises(GraphoptError, match=r"x\[1, 16, 512\] fit shape profile profile0 \(.*\), "
                                            "which this session did not open"):
        session.run(feeds_for(1, 16))
    with pytest.raises(GraphoptError, match="fit none of the model's 4 shape profiles"):
        session.run(feeds_for(3, 16))
    with pytest.raises(OptionError, match=r"has no shape profile 'profile9' \(profiles: "
                                          r"profile0, profile1, profile2, profile3\)"):
        graphopt.load(path, profiles=["profile9"])
    with pytest.raises(OptionError, match="non-empty list of profile names"):
        graphopt.load(path, profiles="profile1")


def test_int8_borrowing_from_a_profile_that_corrected_no_bias(tmp_path):
    # 4 samples at H=16 are 1 batch for N=4, fewer than the 8 a correction takes: that profile
    # keeps its float head's bias, and the H=8 profile, which borrows its ranges, found no head
    # means to take (it refused).
    rng = np.random.default_rng(4)
    proto = parse_model("""
        g (float[N,3,H,H] x) => (float[N,10] logits) {
            c1 = Conv <pads = [1,1,1,1]> (x, w1)
            r1 = Relu(c1)
            c2 = Conv <pads = [1,1,1,1]> (r1, w2)
            r2 = Relu(c2)
            c3 = Conv <pads = [1,1,1,1]> (r2, w2)
            s = Add(c3, r1)
            p = GlobalAveragePool(s)
            f = Flatten(p)
            logits = Gemm <transB = 1> (f, wg)
        }""", w1=(rng.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32),
        w2=(rng.standard_normal((16, 16, 3, 3)) * 0.1).astype(np.float32),
        wg=(rng.standard_normal((10, 16)) * 0.3).astype(np.float32))
    calibration = tmp_path / "x.npz"
    np.savez(calibration, x=rng.standard_normal((4, 3, 16, 16)).astype(np.float32))
    result = graphopt.optimize(proto, quantize="int8", calibration=calibration,
                               dynamic_dims="N=1,H=8;N=4,H=16")
    assert [c.profile.name for c in result.profiles] == ["profile0", "profile1"]
    assert any("measured no input means" in note for note in result.notes)


def test_a_calibration_directory_of_several_image_sizes_serves_their_profiles(tmp_path):
    # "the calibration data fits none of the 2 shape profiles", of a directory holding four
    # 16×16 and four 32×24 images, which compiled without profiles: each profile now
    # calibrates on the files that fit it.
    rng = np.random.default_rng(5)
    proto = parse_model("""
        g (float[1,3,H,W] x) => (y) {
            c = Conv <pads = [1,1,1,1]> (x, w)
            y = Relu(c)
        }""", w=(rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32))
    folder = tmp_path / "cal"
    folder.mkdir()
    for i in range(4):
        np.savez(folder / f"a{i}.npz", x=rng.standard_normal((1, 3, 16, 16)).astype(np.float32))
        np.savez(folder / f"b{i}.npz", x=rng.standard_normal((1, 3, 32, 24)).astype(np.float32))
    result = graphopt.optimize(proto, quantize="int8", calibration=folder,
                               dynamic_dims="H=16,W=16;H=32,W=24",
                               pass_options={"quant_keep_ends": False})
    for compiled in result.profiles:
        ops = [n.op_type for n in compiled.result.model.graph]
        assert "QuantizeLinear" in ops and "DequantizeLinear" in ops
    # The accuracy report reads the files of the first profile they fit, as the compile does:
    # it read the directory whole, refused the first file of the other shape, and the
    # command line wrote the .om with no report.
    from graphopt.tools.accuracy import accuracy_report

    graphopt.save(result, tmp_path / "q.om")
    report = accuracy_report(proto, str(tmp_path / "q.om"), calibration=folder)
    assert "(samples 1-4 of 4: " in report.format()
    # A file that fits no profile is still refused by name, also where one profile has no
    # file of its own and borrows the other's ranges (it took them all, the misfit with them).
    np.savez(folder / "c.npz", x=np.zeros((1, 3, 8, 8), np.float32))
    for _ in range(2):
        with pytest.raises(OptionError, match="c.npz: fits none of the 2 shape profiles"):
            graphopt.optimize(proto, quantize="int8", calibration=folder,
                              dynamic_dims="H=16,W=16;H=32,W=24")
        for i in range(4):
            (folder / f"b{i}.npz").unlink(missing_ok=True)


def test_a_note_only_some_profiles_compile_names_them():
    # A conv net whose TopK head runs on the host: at batch 1 the cost rule returns the convs
    # to the host too, at 256 it keeps them on the NPU. The first profile's note went unnamed,
    # read as the whole model's ("the npu runs none of the model").
    rng = np.random.default_rng(6)
    proto = parse_model("""
        g (float[N,3,16,16] x) => (float[N,10] lg, float[N,3] tv, int64[N,3] ti) {
            c1 = Conv <pads = [1,1,1,1]> (x, w1)
            r1 = Relu(c1)
            c2 = Conv <pads = [1,1,1,1]> (r1, w2)
            r2 = Relu(c2)
            f = Flatten(r2)
            lg = MatMul(f, wf)
            tv, ti = TopK <axis = 1> (lg, k)
        }""", w1=(rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32),
        w2=(rng.standard_normal((8, 8, 3, 3)) * 0.1).astype(np.float32),
        wf=(rng.standard_normal((8 * 16 * 16, 10)) * 0.01).astype(np.float32),
        k=np.array([3], np.int64))
    result = graphopt.optimize(proto, target="ascend310", dynamic_dims="N:1,256")
    devices = [{p.device for p in c.result.partitioning.partitions} for c in result.profiles]
    assert devices == [{"cpu"}, {"npu", "cpu"}]
    (note,) = [n for n in result.notes if "returned to the cpu" in n]
    assert note.startswith("profile0: target='ascend310': ") and "runs none of the" in note


def test_verify_runs_the_written_artifact_in_every_profile(tmp_path, capsys, monkeypatch):
    # The compiled models were verified per profile, but the .om as written was run in the
    # profile its inputs fit alone: another profile's section went unchecked.
    import graphopt.tools.compare as compare
    from helpers import run_cli

    model = tmp_path / "m.onnx"
    onnx.save(parse_model("g (float[N, 4] x) => (float[N, 4] y) { y = Relu(x) }"), model)
    ran = []
    original = compare.compare_models

    def recording(reference, candidate, feeds=None, **kwargs):
        ran.append(kwargs.get("input_shapes"))
        return original(reference, candidate, feeds, **kwargs)

    monkeypatch.setattr(compare, "compare_models", recording)
    rc, out, err = run_cli(capsys, "optimize", model, "-o", tmp_path / "m.om", "--dynamic-dims",
                           "N:1,3", "--verify")
    assert rc == 0, err
    assert ran[1:] == [{"x": [1, 4]}, {"x": [3, 4]}]
    assert "on the same inputs, and seeded ones at each shape profile's shapes" in out


def test_an_npu_profile_leaving_a_dim_open_is_told_to_give_it_values_in_dynamic_dims():
    # Each profile's note said to pin the input with --input-shape, each with another example
    # (1,16 and 1,128), where the profiles were the pins.
    result = graphopt.optimize(mlp_model(), target="ascend310", dynamic_dims="seq:8,16")
    notes = [n for n in result.notes if "for dynamic shapes" in n]
    assert notes and all("give 'batch' values in dynamic_dims too" in n for n in notes), notes
    assert not any("input_shapes" in n for n in notes)
    # So does the memory plan's reason.
    reasons = [plan for c in result.profiles for plan in c.result.memory_plans.values()
               if isinstance(plan, str)]
    assert reasons and all("give every dim of the inputs values (--dynamic-dims, or "
                           "dynamic_dims in Python)" in r for r in reasons), reasons


def test_a_dim_the_export_fixes_is_named_as_fixed():
    # "has no dynamic input dim 'x[0]' (its inputs are all static)": the dim exists, at 1.
    proto = parse_model("g (float[1, 4] x) => (float[1, 4] y) { y = Relu(x) }")
    with pytest.raises(OptionError, match=r"fixes x\[0\] at 1: a profile cannot give it "
                                          r"another size; export the model with that axis "
                                          r"dynamic"):
        graphopt.optimize(proto, dynamic_dims="x[0]:1,2")


def test_a_dim_the_aipp_file_fixes_is_named_as_fixed_by_it(tmp_path):
    # "has no dynamic input dim 'H' (its dynamic dims: N (x[0]))", of a model that has H: the
    # AIPP file's src_image_size had fixed it.
    proto = parse_model("""
        g (float[N,3,H,W] x) => (y) { y = GlobalAveragePool(x) }""")
    config = tmp_path / "aipp.cfg"
    config.write_text("aipp_op {\n  aipp_mode: static\n  input_format: RGB888_U8\n"
                      "  src_image_size_w: 16\n  src_image_size_h: 16\n}\n")
    with pytest.raises(OptionError, match="dynamic dim 'H' is fixed by insert_op_conf, whose "
                                          "src_image_size"):
        graphopt.optimize(proto, insert_op_conf=config, dynamic_dims="H=16,W=16;H=32,W=32")


def test_verify_inputs_that_fit_no_profile_are_refused(tmp_path):
    proto = parse_model("g (float[N, 4] x) => (float[N, 4] y) { y = Relu(x) }")
    with pytest.raises(GraphoptError, match=r"verify: inputs \(x \[5, 4\]\) fit none of the "
                                            r"shape profiles \(profile0 \(N=1\), profile1"):
        graphopt.optimize(proto, dynamic_dims="N:1,2", verify=True,
                          inputs={"x": np.ones((5, 4), np.float32)})


def test_a_profile_the_inputs_do_not_fit_fails_without_asking_for_inputs(monkeypatch):
    # It is verified on seeded inputs; its failure asked for "inputs like the deployment's with
    # inputs", which the user had given (they fit the other profile).
    import graphopt.compile_verify as compile_verify
    import graphopt.compiler as compiler
    from graphopt.errors import VerificationError

    def failing(original, optimized, inputs, options, *args, **kwargs):
        if inputs is None:
            raise VerificationError("outputs differ" + compile_verify._seeded_inputs_hint(
                inputs, options))
        return {}

    monkeypatch.setattr(compiler, "verify_outputs", failing)
    proto = parse_model("g (float[N, 4] x) => (float[N, 4] y) { y = Relu(x) }")
    with pytest.raises(VerificationError) as caught:
        graphopt.optimize(proto, dynamic_dims="N:1,2", verify=True,
                          inputs={"x": np.ones((1, 4), np.float32)})
    message = str(caught.value)
    assert message.startswith("shape profile profile1 (N=2): outputs differ (on seeded random")
    assert "inputs fit another shape profile: a file of this profile's shapes checks it" in message
    with pytest.raises(VerificationError, match="give inputs like the deployment's"):
        graphopt.optimize(proto, dynamic_dims="N:1,2", verify=True)


@pytest.mark.parametrize("feeds, message", [
    ({"z": np.ones((1, 4), np.float32)}, "unknown input 'z'; the model's inputs are: x"),
    ({}, "missing input 'x'"),
    ({"x": np.ones((1, 4), np.int64)}, "input 'x' has dtype int64"),
])
def test_verify_inputs_that_misname_an_input_are_refused_naming_it(tmp_path, capsys, feeds,
                                                                     message):
    # They read as shapes that fit no profile: "(x [])" for a file keyed by another name.
    path = tmp_path / "m.onnx"
    onnx.save(parse_model("g (float[N, 4] x) => (float[N, 4] y) { y = Relu(x) }"), path)
    npz = tmp_path / "feeds.npz"
    np.savez(npz, **feeds)
    with pytest.raises(InputError, match=rf"^verify: inputs='\S*feeds.npz': {message}"):
        graphopt.optimize(path, dynamic_dims="N:1,2", verify=True, inputs=npz)
    rc, out, err = run_cli(capsys, "optimize", path, "-o", tmp_path / "m.om", "--dynamic-dims",
                           "N:1,2", "--verify", "--inputs", npz)
    assert rc == 1 and err.startswith(f"graphopt: error: --verify: --inputs {npz}: {message}")
    assert not (tmp_path / "m.om").exists()


def test_a_one_token_profile_is_static_to_the_last_layer():
    # Each fold made the next GPT-2 layer's dims static: one inference left layer 2 symbolic.
    from graphopt import zoo

    result = graphopt.optimize(zoo.build("gpt2_small"), input_shapes={"input_ids": [1, 1]})
    symbolic = [v.name for v in result.model.graph.all_values()
                if v.shape is not None and not all(isinstance(d, int) for d in v.shape)]
    assert symbolic == []


def conv_topk_hw() -> onnx.ModelProto:
    """Two convs and a TopK over an open H×W: small sizes stay on the host on ascend310 (the
    copies cost more than the NPU saves), large ones put the convs on the NPU."""
    rng = np.random.default_rng(0)
    return parse_model("""
        g (float[1,8,H,W] x) => (float[1,3] vals, int64[1,3] idx) {
            c1 = Conv <pads = [1,1,1,1]> (x, w1, b1)
            r1 = Relu (c1)
            c2 = Conv <pads = [1,1,1,1]> (r1, w2, b2)
            a = Add (c2, r1)
            r2 = Relu (a)
            g = GlobalAveragePool (r2)
            f = Flatten (g)
            vals, idx = TopK (f, k)
        }""", w1=0.1 * rng.standard_normal((64, 8, 3, 3)).astype(np.float32),
        b1=np.zeros(64, np.float32), w2=0.1 * rng.standard_normal((64, 64, 3, 3)).astype(
            np.float32), b2=np.zeros(64, np.float32), k=np.array([3], np.int64))


def test_inspect_and_report_show_each_profiles_placement_and_kernels(tmp_path, capsys):
    out = tmp_path / "ct.om"
    graphopt.save(graphopt.optimize(conv_topk_hw(), target="ascend310",
                                    dynamic_dims="H:2,128;W:2,128"), out)
    rc, text, err = run_cli(capsys, "inspect", out)
    assert rc == 0, err
    # 7: MergeParallelConvs takes the residual r1 into c2 as an identity tap.
    assert "placement of profile0: 7 node(s) fell back to the host" in text
    assert "placement of profile3: 1 node(s) fell back to the host" in text
    assert "kernel configs of profile3 (estimates;" in text
    assert "kernel configs: none in profile0, which run(s) every node on the host" in text
    assert "2 (npu, cpu)" in text  # devices in execution order
    page = tmp_path / "ct.html"
    rc, said, err = run_cli(capsys, "report", out, "-o", page)
    assert rc == 0, err
    # The graph's counts and the placement section are the default profile's: said so.
    assert "node(s) in profile0, the default of 4 shape profiles" in said
    html = page.read_text()
    assert "7 node(s) fell back to the host in profile0, the default shape profile (the " \
           "summary counts each profile's)." in html
    assert "No kernel configs" not in html
    assert "<h3>shape profile profile3</h3>" in html and "profile3.p0_npu" in html
    assert "No NPU kernel in profile0: every node of those profiles runs on the host" in html
    assert "profile0 1 (1 on cpu; 7 fell back); " in html
    assert "profile3 2 (1 on npu, 1 on cpu; 1 fell back)" in html


def test_text_inspect_shows_every_profiles_kernel_configs(tmp_path, capsys):
    out = tmp_path / "mlp.om"
    graphopt.save(graphopt.optimize(mlp_model(), target="ascend310",
                                    dynamic_dims="batch=1,seq=8;batch=2,seq=16"), out)
    rc, text, err = run_cli(capsys, "inspect", out)
    assert rc == 0, err
    for profile in ("profile0", "profile1"):
        assert f"kernel configs of {profile} (estimates;" in text, text
        assert f"{profile}.p0_npu        5             2  default" in text, text



def nonzero_unless_one_model() -> onnx.ModelProto:
    """x[N, 4] through Relu when N is 1, else through NonZero, whose output size depends on
    x's values: profile N=1 has a memory plan, N=2 cannot have one."""
    from onnx import TensorProto, helper, numpy_helper

    def branch(name: str, nodes: list) -> onnx.GraphProto:
        out = helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)
        return helper.make_graph(nodes, name, [], [out])

    then_branch = branch("then", [helper.make_node("Relu", ["x"], ["t"])])
    else_branch = branch("else", [helper.make_node("NonZero", ["x"], ["nz"]),
                                  helper.make_node("Cast", ["nz"], ["e"], to=TensorProto.FLOAT)])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"]),
             helper.make_node("Equal", ["n", "one"], ["one_row"]),
             helper.make_node("If", ["one_row"], ["picked"], then_branch=then_branch,
                              else_branch=else_branch),
             helper.make_node("Sigmoid", ["picked"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(0, np.int64), "zero"),
         numpy_helper.from_array(np.array(1, np.int64), "one")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_profile_without_a_memory_plan_says_why(tmp_path, capsys):
    from graphopt.summary import format_summary

    result = graphopt.optimize(nonzero_unless_one_model(), target="cpu", dynamic_dims="N:1,2")
    text = format_summary(result)
    # The table's "-" alone gave no reason; a single-shape compile gives it.
    assert "\nmemory plan profile1.p0_cpu: none (cannot plan memory: %nz (output 0 of " \
           "NonZero)" in text, text
    assert "memory plan profile0" not in text
    out = tmp_path / "nz.om"
    graphopt.save(result, out)
    rc, text, err = run_cli(capsys, "inspect", out)
    assert rc == 0, err
    # inspect's memory plan showed the default profile's alone.
    assert "\nprofile0.p0_cpu         64 B" in text, text
    assert "\nprofile1.p0_cpu: cannot plan memory: %nz (output 0 of NonZero)" in text, text


def test_the_summary_marks_no_largest_profile_on_a_tie():
    from graphopt.summary import format_profiles

    # batch 2 × seq 8 and batch 1 × seq 16 need the same memory: neither is the one to size
    # buffers by, as inspect has it (the summary marked the first).
    result = graphopt.optimize(mlp_model(), target="cpu",
                               dynamic_dims="batch=1,seq=8;batch=2,seq=8;batch=1,seq=16")
    text = format_profiles(result)
    assert "(largest)" not in text and text.count("32.5 KiB") == 2, text
    result = graphopt.optimize(mlp_model(), target="cpu",
                               dynamic_dims="batch=1,seq=8;batch=2,seq=8")
    assert "32.5 KiB (largest)" in format_profiles(result)


def test_a_profiles_dims_keep_the_order_they_were_given_in(tmp_path, capsys):
    # The manifest's JSON sorts its keys: inspect, run and the runtime's errors showed
    # batch before seq where the command line, and the compile summary, gave seq first.
    out = tmp_path / "mlp.om"
    graphopt.save(graphopt.optimize(mlp_model(), dynamic_dims="seq:4;batch:1,2"), out)
    assert [list(p["dims"]) for p in load_om(out).profiles] == [["seq", "batch"]] * 2
    rc, text, err = run_cli(capsys, "inspect", out)
    assert rc == 0, err
    assert "profile1  seq=4, batch=2" in text, text
    session = graphopt.load(out)
    with pytest.raises(GraphoptError, match=r"profile0 \(seq=4, batch=1\); profile1 \(seq=4, "):
        session.run(feeds_for(3, 4))
    # An artifact without dims_order (written before it) keeps its dims as stored.
    old = _rewrite(out, tmp_path / "old.om",
                   lambda m: [p.pop("dims_order") for p in m["profiles"]])
    assert list(load_om(old).profiles[0]["dims"]) == ["batch", "seq"]



def test_seeded_inputs_take_a_profiles_size_for_a_pin_left_at_minus_one(tmp_path):
    # The accuracy report after `graphopt atc … --input_shape=x:-1,-1,512 --dynamic_dims=…`
    # passed the -1 pins on, which kept every open dim at 1: inputs no profile fits.
    from graphopt.tools.accuracy import accuracy_report

    path = tmp_path / "p.om"
    graphopt.save(graphopt.optimize(mlp_model(), dynamic_dims="batch=2,seq=8;batch=4,seq=16",
                                    input_shapes="x:-1,-1,512"), path)
    report = accuracy_report(mlp_model(), path, input_shapes="x:-1,-1,512")
    assert [o.shape for o in report.outputs] == [(2, 8, 8)]  # profile0
    assert report.outputs[0].cosine > 0.99999


def test_a_profile_whose_seeded_inputs_leave_another_batch_at_1_names_it(tmp_path):
    # A dynamo export gives each input its own batch symbol: profile1 sized one, the other ran
    # at 1, the original failed, and --verify said only "give real inputs with --inputs".
    model = parse_model("g (float[Na,4] a, float[Nb,4] b) => (y) { y = Concat <axis = 1> (a, b) }")
    with pytest.raises(VerificationError, match=r"shape profile profile1 \(Na=2\).*\(on seeded "
                                                r"random inputs, open dims left at 1: b \[1,4\] "
                                                r"\(Nb=1\): give real inputs with inputs, or "
                                                r"sizes for those dims with dynamic_dims\)"):
        graphopt.optimize(model, dynamic_dims="Na:1,2", verify=True)
    graphopt.optimize(model, dynamic_dims="Na=1,Nb=1;Na=2,Nb=2", verify=True)  # both sized


def test_crossed_dims_the_model_needs_equal_suggest_the_listed_form():
    # A scikit-learn pipeline's columns each have an unnamed batch dim: every combination of
    # two sizes makes profiles (1, 2) and (2, 1), which the model refuses.
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Concat", ["a", "b"], ["y"], axis=1)], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [None, 1]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [None, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(GraphoptError, match=r"every combination of the dims' values is a "
                                            r"profile: where those dims must agree, list the "
                                            r"profiles whole, pairing the sizes every dim lists, "
                                            r"as dynamic_dims "
                                            r"\"a\[0\]=1,b\[0\]=1;a\[0\]=2,b\[0\]=2\"\)$"):
        graphopt.optimize(model, dynamic_dims="a[0]:1,2;b[0]:1,2")
    with pytest.raises(GraphoptError) as refused:  # one size each: nothing to pair
        graphopt.optimize(model, dynamic_dims="a[0]:2;b[0]:3")
    assert "every combination" not in str(refused.value)
    listed = graphopt.optimize(model, dynamic_dims="a[0]=1,b[0]=1;a[0]=2,b[0]=2")
    assert len(listed.profiles) == 2
