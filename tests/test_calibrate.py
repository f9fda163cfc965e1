"""Calibration: per-tensor statistics by method on known data, streaming over samples of a tiny
model, and the errors for calibration data that does not fit the model's inputs."""

from __future__ import annotations

import sys

import numpy as np
import onnx.parser
import pytest

from graphopt.codegen.feeds import load_npz
from graphopt.errors import InputError, OptionError
from graphopt.ir import load_onnx
from graphopt.quant import calibrate, read_calibration
from graphopt.quant.calib_data import check_calibration, model_inputs
from graphopt.quant.stats import TensorStats, entropy_threshold, mse_range, percentile_range
from tests.helpers import parse_model


def _stats(arrays, histogram=True) -> TensorStats:
    s = TensorStats()
    for a in arrays:
        s.observe_range(a)
    if histogram:
        s.start_histogram()
        for a in arrays:
            s.observe_histogram(a)
    return s


def test_minmax_is_exact_over_streamed_samples():
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((4, 5)).astype(np.float32) * (i + 1) for i in range(6)]
    s = _stats(arrays, histogram=False)
    everything = np.concatenate([a.ravel() for a in arrays])
    assert s.range("minmax") == (float(everything.min()), float(everything.max()))
    assert s.samples == 6


def test_percentile_clips_the_tails():
    rng = np.random.default_rng(1)
    x = rng.uniform(-1.0, 1.0, 200_000).astype(np.float32)
    x[:10] = 50.0  # outliers the 99.9th percentile must ignore
    lo, hi = _stats([x]).range("percentile", percentile=99.9)
    assert lo == pytest.approx(-0.998, abs=0.03)
    assert hi == pytest.approx(0.998, abs=0.03)
    # A non-negative tensor keeps its own minimum as its low end.
    lo, hi = _stats([np.abs(x)]).range("percentile", percentile=99.0)
    assert lo == float(np.abs(x).min()) and hi == pytest.approx(0.99, abs=0.03)
    with pytest.raises(ValueError, match="calibration_percentile"):
        percentile_range(np.ones(8, np.int64), 0.0, 1.0, 30.0)


def test_entropy_threshold_ignores_rare_outliers_but_keeps_a_dense_range():
    rng = np.random.default_rng(2)
    gauss = rng.standard_normal(500_000).astype(np.float32)
    gauss[:5] = 40.0
    lo, hi = _stats([gauss]).range("entropy", levels=128)
    assert 2.0 < hi < 20.0 and -20.0 < lo < -2.0, (lo, hi)  # far inside ±40, beyond 2σ
    uniform = rng.uniform(0.0, 1.0, 200_000).astype(np.float32)
    hist, _ = np.histogram(uniform, 2048, (0.0, 1.0))
    assert entropy_threshold(hist, 1.0, 256) > 0.9  # nothing to clip in a flat histogram


def test_mse_clips_a_long_tail_but_not_a_flat_range():
    rng = np.random.default_rng(3)
    gauss = rng.standard_normal(500_000).astype(np.float32)
    gauss[:5] = 12.0  # rare outliers: rounding everything else at their step costs more
    lo, hi = _stats([gauss]).range("mse", levels=256)
    assert 3.0 < hi < 10.0 and -10.0 < lo < -3.0, (lo, hi)
    relu = np.maximum(gauss, 0)
    relu[:3] = 0.0  # two outliers left, among half a million values of which half are 0
    lo, hi = _stats([relu]).range("mse", levels=256)
    assert lo == 0.0 and 3.0 < hi < 11.0, (lo, hi)  # a Relu's range keeps its 0
    uniform = rng.uniform(0.0, 1.0, 200_000).astype(np.float32)
    hist, _ = np.histogram(uniform, 2048, (0.0, 1.0))
    assert mse_range(hist, 0.0, 1.0)[1] > 0.95  # nothing worth clipping
    assert mse_range(np.zeros(8, np.int64), -1.0, 1.0) == (-1.0, 1.0)


def _relu_model():
    return parse_model("""
        agraph (float[1, 4] x) => (float[1, 4] y) {
            r = Relu(x)
            y = Mul(r, two)
        }""", two=np.float32(2.0))


def test_calibrate_streams_one_npz_and_a_directory_alike(tmp_path):
    rng = np.random.default_rng(3)
    samples = rng.standard_normal((5, 1, 4)).astype(np.float32)
    np.savez(tmp_path / "batch.npz", x=samples)
    folder = tmp_path / "dir"
    folder.mkdir()
    for i, sample in enumerate(samples):
        np.savez(folder / f"{i:02d}.npz", x=sample)
    model = load_onnx(_relu_model())
    results = []
    for path in (tmp_path / "batch.npz", folder):
        data = read_calibration(path, model.graph)
        assert len(data) == 5
        stats = calibrate(model, ["x", "r", "y"], data, "minmax")
        results.append({k: v.range("minmax") for k, v in stats.items()})
    assert results[0] == results[1]
    ranges = results[0]
    assert ranges["x"] == (float(samples.min()), float(samples.max()))
    assert ranges["r"] == (max(0.0, float(samples.min())), float(samples.max()))
    assert ranges["y"][1] == pytest.approx(2 * float(samples.max()))


def test_calibration_shows_its_progress_on_a_terminal_when_the_command_line_asks(
        tmp_path, capsys, monkeypatch):
    # An entropy calibration took 16 s of a compile without a word.
    from graphopt.progress import compile_progress

    np.savez(tmp_path / "c.npz", x=np.ones((3, 1, 4), np.float32))
    model = load_onnx(_relu_model())
    data = read_calibration(tmp_path / "c.npz", model.graph)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    calibrate(model, ["x", "y"], data, "entropy")  # from Python: silent
    assert capsys.readouterr().err == ""
    with compile_progress(True):
        calibrate(model, ["x", "y"], data, "entropy")
    err = capsys.readouterr().err
    assert "\rcalibrating (entropy): 1/6 sample runs" in err
    assert "calibrating (entropy): 6/6 sample runs" in err and err.endswith("\n")
    with compile_progress(False):  # -q
        calibrate(model, ["x", "y"], data, "entropy")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy", "mse"])
def test_nan_and_inf_among_finite_values_are_missing_data_left_out_of_the_ranges(tmp_path,
                                                                               method):
    """A missing value (NaN, what an Imputer fills) is data: each range covers the finite
    values of every sample, and the statistics count the samples that held others."""
    samples = np.array([[[1, -2, np.nan, 3]], [[0.5, 4, 1, -1]], [[np.inf, 2, -3, 1]]],
                       np.float32)
    np.savez(tmp_path / "c.npz", x=samples)
    model = load_onnx(_relu_model())
    stats = calibrate(model, ["x", "y"], read_calibration(tmp_path / "c.npz", model.graph),
                      method, channels={"x"})
    assert stats["x"].nonfinite_samples == 2 and stats["y"].nonfinite_samples == 2
    finite = np.where(np.isfinite(samples), samples, np.nan)  # each channel's mean, NaN aside
    np.testing.assert_allclose(stats["x"].channel_mean, np.nanmean(finite, axis=(0, 1)))
    assert (stats["x"].lo, stats["x"].hi) == (-3.0, 4.0)
    assert (stats["y"].lo, stats["y"].hi) == (0.0, 8.0)
    lo, hi = stats["x"].range(method)
    assert np.isfinite([lo, hi]).all() and -3.0 <= lo < 0 < hi <= 4.0


def test_single_file_of_the_inputs_own_rank_is_split_along_axis_0(tmp_path):
    np.savez(tmp_path / "c.npz", x=np.arange(12, dtype=np.float64).reshape(3, 4))
    data = read_calibration(tmp_path / "c.npz", load_onnx(_relu_model()).graph)
    feeds = list(data)
    assert len(feeds) == 3 and feeds[2]["x"].shape == (1, 4)
    assert feeds[2]["x"].dtype == np.float32  # float64 cast to the input's float32


@pytest.mark.parametrize("arrays, message", [
    ({"y": np.zeros((2, 1, 4), np.float32)}, "no array for model input 'x'"),
    ({"x": np.zeros((2, 1, 4), np.float32), "z": np.zeros(2)}, "'z' is not an input"),
    ({"x": np.zeros((2, 1, 5), np.float32)}, r"input 'x' sample has shape \[1, 5\]"),
    ({"x": np.zeros((2, 2, 1, 4), np.float32)}, r"input 'x' has shape \[2, 2, 1, 4\]"),
    ({"x": np.zeros((2, 1, 4), np.int64)}, "input 'x' is int64; the model expects float32"),
    ({"x": np.zeros((0, 1, 4), np.float32)}, "no samples"),
])
def test_bad_calibration_data_names_the_file_and_input(tmp_path, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(OptionError, match=message) as info:
        read_calibration(path, load_onnx(_relu_model()).graph)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("as_directory", [False, True])
def test_an_input_whose_named_first_dim_is_empty_is_data(tmp_path, as_directory):
    # CastLike's `like` input of shape [L] is legitimately empty: calibration refused the data
    # as "no samples", though the other input had them.
    graph = load_onnx(onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4] x, int64[L] like) => (int64[N, 4] y) {
            r = Relu (x)
            y = CastLike (r, like) }""")).graph
    x = np.random.default_rng(0).standard_normal((2, 1, 4)).astype(np.float32)
    like = np.zeros((2, 0), np.int64)
    if as_directory:
        for i in range(2):
            np.savez(tmp_path / f"s{i}.npz", x=x[i], like=like[i])
        path = tmp_path
    else:
        np.savez(tmp_path / "c.npz", x=x, like=like)
        path = tmp_path / "c.npz"
    feeds = list(read_calibration(path, graph))
    assert len(feeds) == 2 and feeds[1]["like"].shape == (0,) and feeds[1]["x"].shape == (1, 4)
    # Every input empty is still no data.
    np.savez(tmp_path / "c.npz", x=np.zeros((0, 4), np.float32), like=like[0])
    with pytest.raises(OptionError, match=r"no samples"):
        read_calibration(tmp_path / "c.npz", graph)
    if as_directory:
        (tmp_path / "c.npz").unlink()
        np.savez(tmp_path / "s1.npz", x=np.zeros((0, 4), np.float32), like=like[0])
        with pytest.raises(OptionError, match=r"s1.npz: no samples \(every input has an "
                                              r"empty first axis: 'x' \[0, 4\], 'like' \[0\]\)"):
            check_calibration(tmp_path, graph)


def test_missing_or_empty_calibration_paths(tmp_path):
    graph = load_onnx(_relu_model()).graph
    with pytest.raises(OptionError, match="no such file"):
        read_calibration(tmp_path / "nope.npz", graph)
    with pytest.raises(OptionError, match="holds no .npz files"):
        read_calibration(tmp_path, graph)
    np.save(tmp_path / "one.npy", np.zeros((1, 4), np.float32))
    with pytest.raises(OptionError, match="one unnamed array"):
        read_calibration(tmp_path / "one.npy", graph)
    # Not a zip, numpy read it as a pickle and its message said to "load it unsafely".
    for junk in (b"not a zip", bytes(range(7, 107)), b""):
        (tmp_path / "junk.npz").write_bytes(junk)
        with pytest.raises(OptionError, match=r"junk.npz: not an .npz archive of named arrays "
                                              r"\(write one with np.savez"):
            read_calibration(tmp_path / "junk.npz", graph)
    # A truncated archive, and an object array (pickled): errors naming the file, not
    # numpy's exceptions from the lazy member read.
    np.savez(tmp_path / "whole.npz", x=np.zeros((64, 1, 4), np.float32))
    whole = (tmp_path / "whole.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(OptionError, match=r"cut.npz: cannot read"):
        read_calibration(tmp_path / "cut.npz", graph)
    np.savez(tmp_path / "obj.npz", x=np.array([None, 1], dtype=object))
    with pytest.raises(OptionError, match=r"obj.npz: cannot read array 'x' \(it holds object "
                                          r"arrays, which would need unpickling; strings go in "
                                          r"as numpy's strings"):
        read_calibration(tmp_path / "obj.npz", graph)
    # A member that is no .npy (numpy hands its bytes over), and a header declaring 2**40
    # elements over a few bytes: internal errors (AttributeError, MemoryError) before.
    import zipfile

    with zipfile.ZipFile(tmp_path / "raw.npz", "w") as archive:
        archive.writestr("x.npy", b"pickled bytes, not an array")
    with pytest.raises(OptionError, match=r"raw.npz: 'x' in it is not an .npy array"):
        read_calibration(tmp_path / "raw.npz", graph)
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }"
    header += " " * (117 - len(header)) + "\n"
    with zipfile.ZipFile(tmp_path / "huge.npz", "w") as archive:
        archive.writestr("x.npy", b"\x93NUMPY\x01\x00" + bytes([len(header), 0])
                         + header.encode() + bytes(64))
    # (MemoryError where the machine refuses 4 TB, a short read where it overcommits.)
    with pytest.raises(OptionError, match=r"huge.npz: cannot read array 'x' \("):
        read_calibration(tmp_path / "huge.npz", graph)
    with pytest.raises(InputError, match="huge.npz: cannot read as .npz"):
        load_npz(tmp_path / "huge.npz")
    # A header cut mid-dict: numpy's tokenizer raised its TokenError, an internal error.
    with zipfile.ZipFile(tmp_path / "cut.npz", "w") as archive:
        archive.writestr("x.npy", b"\x93NUMPY\x01\x00" + bytes([20, 0]) + b"{'descr': __import__")
    with pytest.raises(InputError, match="cut.npz: cannot read as .npz"):
        load_npz(tmp_path / "cut.npz")
    with pytest.raises(OptionError, match=r"cut.npz: cannot read array 'x' \("):
        read_calibration(tmp_path / "cut.npz", graph)
    bad = tmp_path / "dir"
    bad.mkdir()
    np.savez(bad / "a.npz", x=np.zeros((1, 4), np.float32))
    np.savez(bad / "b.npz", x=np.zeros((1, 3), np.float32))
    data = read_calibration(bad, graph)  # the first file is fine; b.npz fails when read
    with pytest.raises(OptionError, match="b.npz: input 'x' sample has shape"):
        list(data)


def test_inputs_holding_different_sample_counts(tmp_path):
    proto = parse_model("""
        agraph (float[1, 4] a, float[1, 4] b) => (float[1, 4] y) { y = Add(a, b) }""")
    np.savez(tmp_path / "c.npz", a=np.zeros((3, 1, 4), np.float32),
             b=np.zeros((2, 1, 4), np.float32))
    with pytest.raises(OptionError, match="different sample counts.*a directory of .npz files"):
        read_calibration(tmp_path / "c.npz", load_onnx(proto).graph)


def test_arrays_of_their_inputs_own_shapes_with_unequal_first_axes_are_one_sample(tmp_path):
    # A graph net: node features [nodes, 16] and edges [2, edges]. Neither first axis is a
    # sample axis; the file is one feed, as --inputs reads it.
    proto = parse_model("""
        agraph (float[N, 16] x, int64[2, E] edge_index) => (float[N, 16] y) {
            y = Identity(x)
        }""")
    x = np.arange(30 * 16, dtype=np.float32).reshape(30, 16)
    edges = np.array([[0, 1, 2], [1, 2, 0]], np.int64)
    np.savez(tmp_path / "g.npz", x=x, edge_index=edges)
    data = read_calibration(tmp_path / "g.npz", load_onnx(proto).graph)
    (feed,) = list(data)
    np.testing.assert_array_equal(feed["x"], x)
    np.testing.assert_array_equal(feed["edge_index"], edges)
    # Batch dims, shared or named apart (torch's *_dynamic_axes_1), with no fixed first dim
    # beside them: samples are stacked, and unequal counts stay an error.
    for dims in ("N, N", "N, M"):
        first, second = dims.split(", ")
        batched = parse_model(f"""
            agraph (float[{first}, 4] a, float[{second}, 4] b) => (float[{first}, 4] y) {{
                y = Identity(a)
            }}""")
        np.savez(tmp_path / "c.npz", a=np.zeros((3, 4), np.float32),
                 b=np.zeros((2, 4), np.float32))
        with pytest.raises(OptionError, match="different sample counts"):
            read_calibration(tmp_path / "c.npz", load_onnx(batched).graph)


def test_a_batch_of_frames_beside_a_state_of_fixed_first_dim_1_is_one_sample(tmp_path):
    # silero-vad's --inputs file (input [4, 576], h and c [1, 1, 128]) was refused as
    # calibration: "inputs hold different sample counts (input: 4, h: 1, c: 1)".
    proto = parse_model("""
        agraph (float[N, 8] x, float[1, 1, 4] h) => (float[N, 8] y, float[1, 1, 4] h2) {
            y = Identity(x)
            h2 = Identity(h)
        }""")
    x, h = np.ones((4, 8), np.float32), np.zeros((1, 1, 4), np.float32)
    np.savez(tmp_path / "s.npz", x=x, h=h)
    (feed,) = list(read_calibration(tmp_path / "s.npz", load_onnx(proto).graph))
    np.testing.assert_array_equal(feed["x"], x)
    np.testing.assert_array_equal(feed["h"], h)


@pytest.mark.parametrize("array, message", [
    (np.full((3, 1, 4), np.nan, np.float32), "input 'x' holds only NaN or Inf"),
    (np.r_[np.zeros((1, 1, 4)), [[[0, 1e39, 0, 0]]]],  # float64 beyond float32's range
     "input 'x' sample 1 holds values beyond float32"),
    (np.full((1, 4), np.inf, np.float32), "input 'x' holds only NaN or Inf"),
])
def test_data_without_a_measurable_range_is_refused_naming_the_file_and_input(tmp_path, array,
                                                                             message):
    path = tmp_path / "c.npz"
    np.savez(path, x=array)
    with pytest.raises(OptionError, match=message) as info:
        read_calibration(path, load_onnx(_relu_model()).graph)
    assert str(info.value).startswith(f"calibration {path}: ")


def test_check_calibration_reads_every_file_of_a_directory(tmp_path):
    graph = load_onnx(_relu_model()).graph
    for i in range(3):
        np.savez(tmp_path / f"{i}.npz", x=np.zeros((1, 4), np.float32))
    assert len(check_calibration(tmp_path, graph)) == 3
    np.savez(tmp_path / "2.npz", x=np.full((1, 4), np.nan, np.float32))
    read_calibration(tmp_path, graph)  # only the first file is read up front
    with pytest.raises(OptionError, match=r"2.npz: input 'x' holds only NaN or Inf"):
        check_calibration(tmp_path, graph)
    np.savez(tmp_path / "2.npz", banana=np.zeros((1, 4), np.float32))
    with pytest.raises(OptionError, match=r"2.npz: no array for model input 'x'"):
        check_calibration(tmp_path, graph)


@pytest.mark.parametrize("layout", ["samples", "samples of the input's shape", "directory"])
def test_first_sample_of_every_layout_cast_as_calibration_casts(tmp_path, layout):
    samples = np.random.default_rng(0).standard_normal((4, 1, 4))  # float64
    path = tmp_path / "c.npz"
    if layout == "directory":
        path = tmp_path
        for i, sample in enumerate(samples):
            np.savez(tmp_path / f"{i}.npz", x=sample)
    else:
        np.savez(path, x=samples if layout == "samples" else samples[:, 0])
    specs = model_inputs(load_onnx(_relu_model()).graph)
    data = read_calibration(path, specs)
    sample, count = next(iter(data)), len(data)
    assert count == 4 and sample["x"].dtype == np.float32
    np.testing.assert_array_equal(sample["x"], samples[0].astype(np.float32))


def _batch2_graph():
    """An input whose batch a shape profile pinned to 2: [2, 4]."""
    return load_onnx(parse_model("""
        g (float[2, 4] x) => (float[2, 4] y) { y = Relu(x) }""")).graph


@pytest.mark.parametrize("shape", [(5, 4), (5, 1, 4)])
def test_batch1_samples_are_stacked_to_a_pinned_batch(tmp_path, shape):
    # One calibration set for every profile of --dynamic-dims "batch:1,2": five samples of
    # batch 1 make three of batch 2, the last wrapping round to the first sample.
    samples = np.arange(20, dtype=np.float32).reshape(shape)
    path = tmp_path / "calib.npz"
    np.savez(path, x=samples)
    data = check_calibration(path, _batch2_graph())
    feeds = [feed["x"] for feed in data]
    flat = samples.reshape(5, 4)
    assert len(data) == 3 and [f.shape for f in feeds] == [(2, 4)] * 3
    np.testing.assert_array_equal(np.concatenate(feeds), flat[[0, 1, 2, 3, 4, 0]])


def test_a_directory_of_batch1_files_is_stacked_too(tmp_path):
    for i in range(3):
        np.savez(tmp_path / f"s{i}.npz", x=np.full((1, 4), i, np.float32))
    data = check_calibration(tmp_path, _batch2_graph())
    feeds = [feed["x"][:, 0].tolist() for feed in data]
    assert len(data) == 2 and feeds == [[0, 1], [2, 0]]
    np.savez(tmp_path / "s3.npz", x=np.zeros((1, 5), np.float32))  # checked at 1 of the 2
    with pytest.raises(OptionError, match=r"s3.npz: input 'x' sample has shape \[1, 5\]; "
                                          r"the model expects \[1,4\]"):
        check_calibration(tmp_path, _batch2_graph())


def _scalar_graph(batch: int):
    """silero-vad's inputs: audio [B, 4] and a scalar sample rate."""
    return load_onnx(parse_model(f"""
        g (float[{batch}, 4] x, int64 sr) => (float[{batch}, 4] y) {{
            f = Cast <to = 1> (sr)
            y = Mul(x, f) }}""")).graph


@pytest.mark.parametrize("batch", [1, 2])
def test_a_directory_of_samples_with_a_scalar_input(tmp_path, batch):
    # The scalar has no batch axis to stack: the sizes read it as one (IndexError), and the
    # files were joined along it (ValueError) — an internal error of every silero-vad export.
    for i in range(3):
        np.savez(tmp_path / f"s{i}.npz", x=np.full((1, 4), i, np.float32),
                 sr=np.array(16000, np.int64))
    feeds = list(check_calibration(tmp_path, _scalar_graph(batch)))
    assert [f["x"].shape for f in feeds] == [(batch, 4)] * (3 if batch == 1 else 2)
    assert all(f["sr"].shape == () and int(f["sr"]) == 16000 for f in feeds)
    np.savez(tmp_path / "s1.npz", x=np.ones((1, 4), np.float32), sr=np.array(8000, np.int64))
    if batch == 2:  # batched with s0, it would have to share its one sample rate
        with pytest.raises(OptionError, match=r"input 'sr' is a scalar, one value for a batch, "
                                              r"and .*s0.npz and the files batched with it"):
            list(check_calibration(tmp_path, _scalar_graph(batch)))


def test_samples_of_the_pinned_batch_are_taken_as_they_are(tmp_path):
    path = tmp_path / "calib.npz"
    np.savez(path, x=np.ones((3, 2, 4), np.float32))
    data = read_calibration(path, _batch2_graph())
    assert len(data) == 3 and {feed["x"].shape for feed in data} == {(2, 4)}


def test_a_tensor_without_a_finite_range_names_the_inputs_that_held_nan(tmp_path):
    # One NaN pixel of a single image spreads to every value after a global mean: the error
    # blamed the model's tensor and sent the user to skip layers, not to the data.
    model = load_onnx(parse_model(
        "g (float[1, 4] x) => (float[1, 1] y) { y = ReduceMean <keepdims = 1> (x) }"))
    samples = np.array([[[1, np.nan, 3, 4]]], np.float32)
    np.savez(tmp_path / "c.npz", x=samples)
    data = read_calibration(tmp_path / "c.npz", model.graph)
    with pytest.raises(OptionError, match=r"tensor 'y' has no finite range over the samples "
                       r"\(NaN or Inf\); the data's input\(s\) 'x' hold NaN or Inf, which the "
                       r"model carries there: give samples without them, or quant_skip the "
                       r"layers that read it"):
        calibrate(model, ["y"], data)


@pytest.mark.parametrize("method", ["percentile", "entropy", "mse"])
@pytest.mark.parametrize("values", [[1.0, 1.0], [1000.0, 1000.01], [0.99999, 1.0], [-7.0, -7.0]],
                         ids=["constant-one", "narrow-far-from-0", "saturated-sigmoid",
                              "constant-negative"])
def test_a_range_of_a_few_float32_steps_histograms(method, values):
    # numpy made float32 bin edges for float32 data and refused 2048 of them over a range of
    # a few float32 steps: a conv over a constant image failed QuantizeInt8 with a ValueError.
    x = np.linspace(*values, 64).astype(np.float32)
    s = _stats([x])
    assert s.hist.sum() == x.size
    lo, hi = s.range(method)
    assert np.isfinite([lo, hi]).all() and lo <= float(x.max()) and hi >= float(x.min())


@pytest.mark.parametrize("layout", ["stacked", "directory"])
def test_integers_beyond_the_inputs_integer_type_are_refused(tmp_path, layout):
    # int64 token ids past 2**31 for an int32 input wrapped round to other ids in the cast,
    # silently; --inputs refuses int64 for an int32 input outright.
    graph = load_onnx(parse_model(
        "g (int32[1, 4] ids) => (float[1, 4, 2] y) { y = Gather(table, ids) }",
        table=np.ones((8, 2), np.float32))).graph
    ids = np.zeros((3, 1, 4), np.int64)
    ids[2, 0, 1] = 2**32 + 5
    if layout == "stacked":
        np.savez(tmp_path / "c.npz", ids=ids)
        path = tmp_path / "c.npz"
    else:
        path = tmp_path / "d"
        path.mkdir()
        for i, sample in enumerate(ids):
            np.savez(path / f"{i}.npz", ids=sample)
    with pytest.raises(OptionError, match=r"input 'ids' holds 4294967301, beyond int32 "
                                          r"\(-2147483648 to 2147483647\)"):
        list(read_calibration(path, graph))
    ids[2, 0, 1] = 7  # int64 values int32 holds are cast, as before
    np.savez(tmp_path / "ok.npz", ids=ids)
    assert [s["ids"].dtype for s in read_calibration(tmp_path / "ok.npz", graph)] == \
        [np.int32] * 3


def test_calibration_of_a_model_whose_only_input_is_a_scalar(tmp_path):
    # A scalar input has no first axis to be empty: each of its values is a sample.
    from graphopt.quant.calib_data import read_calibration
    graph = load_onnx(onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float x) => (float y) { y = Relu (x) }""")).graph
    np.savez(tmp_path / "c.npz", x=np.arange(3, dtype=np.float32))
    feeds = list(read_calibration(tmp_path / "c.npz", graph))
    assert len(feeds) == 3


def test_an_input_of_fixed_size_0_is_data(tmp_path):
    # Declared [0] (a CastLike's like): empty by the model's own shape, not a missing sample.
    from graphopt.quant.calib_data import read_calibration
    graph = load_onnx(onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4] x, int64[0] like) => (int64[N, 4] y) {
            r = Relu (x)
            y = CastLike (r, like) }""")).graph
    np.savez(tmp_path / "c.npz", x=np.ones((2, 1, 4), np.float32), like=np.zeros((2, 0), np.int64))
    assert len(list(read_calibration(tmp_path / "c.npz", graph))) == 2
