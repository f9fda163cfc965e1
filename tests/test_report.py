"""`graphopt report`: a self-contained HTML page whose sections, SVGs and tables match the
.om (cpu and ascend310), the tuning storage and the accuracy run; and the page in Chromium."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
import zlib
from html.parser import HTMLParser

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
import pytest
from helpers import IR_VERSION, conv_classifier, conv_topk_model, parse_model, run_cli

import graphopt
from graphopt import zoo
from graphopt.cli import main
from graphopt.tuner.history_plot import draw_histories, histories_svg
from graphopt.ir import load_onnx
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.passes.memory import plan_memory
from graphopt.codegen.om_read import load_om
from graphopt.tools.accuracy_rule import accuracy_rule
from graphopt.tools.report_data import GraphData, OpNode, build_graph
from graphopt.tools.report_graph import (CHAIN_MIN, IO_FILL, MAX_BOXES, NODE_SEP, NODE_W, PALETTE,
                                         graph_svg, layout, partition_colours)
from graphopt.tools.report_html import SECTIONS
from graphopt.tools.report_plan import StoredPlan

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'
RNG = np.random.default_rng(7)
VOID = {"meta", "br", "hr", "img", "input", "link", "wbr", "col", "area", "base", "source"}


def weight(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.2).astype(np.float32)


def topk_model(seed: int = 7) -> onnx.ModelProto:
    """Convs and a classifier the NPU runs, then a TopK it has no kernel for: two partitions."""
    return conv_topk_model(k=5, seed=seed)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The source models, their .om files for cpu and ascend310, input feeds, a tuning db."""
    root = tmp_path_factory.mktemp("report")
    paths = {"root": root}
    tiny = root / "tiny.onnx"
    onnx.save(zoo.build("tiny"), tiny)
    paths["tiny"], paths["tiny_om"] = tiny, root / "tiny.om"
    graphopt.save(graphopt.optimize(str(tiny), target="cpu"), paths["tiny_om"])
    topk = root / "topk.onnx"
    onnx.save(topk_model(), topk)
    paths["topk"], paths["topk_om"] = topk, root / "topk.om"
    graphopt.save(graphopt.optimize(str(topk), target="ascend310"), paths["topk_om"])
    paths["feeds"] = root / "x.npz"
    np.savez(paths["feeds"], x=RNG.standard_normal((1, 8, 32, 32)).astype(np.float32))
    db = root / "tune.db"
    for job in (["--trials", "3"], ["--job", "subgraph", "--trials", "2"]):
        assert main(["tune", str(topk), "--target", "ascend310", "--tuning-db", str(db),
                     "-q", *job]) == 0
    paths["db"] = db
    return paths


# --- reading the page ----------------------------------------------------------------------


class Page(HTMLParser):
    """Ids, tags and resource references of a page; fails on unbalanced elements."""

    def __init__(self, text: str):
        super().__init__()
        self.ids, self.tags, self.refs, self.stack, self.text = set(), [], [], [], []
        self.feed(text)
        self.close()
        assert self.stack == [], f"unclosed elements: {self.stack}"

    def handle_starttag(self, tag, attrs):
        self._element(tag, attrs)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self._element(tag, attrs)

    def _element(self, tag, attrs):
        self.tags.append(tag)
        for name, value in attrs:
            if name == "id":
                self.ids.add(value)
            if name in ("src", "href", "xlink:href", "srcset", "action") or (
                    name == "style" and "url(" in (value or "")):
                self.refs.append(value or "")

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)

    @property
    def plain(self) -> str:
        return " ".join(" ".join(self.text).split())


def svgs(text: str) -> list[ET.Element]:
    """Every inline SVG, parsed as XML: it must be well formed on its own."""
    found = re.findall(r"<svg\b.*?</svg>", text, flags=re.DOTALL)
    return [ET.fromstring(chunk) for chunk in found]


def section(text: str, key: str) -> str:
    match = re.search(rf'<section id="{key}">(.*?)</section>', text, flags=re.DOTALL)
    assert match, f"no section {key}"
    return match.group(1)


def assert_self_contained(text: str, page: Page) -> None:
    assert not {"script", "link", "iframe", "object", "embed", "img"} & set(page.tags)
    assert all(not re.match(r"\s*(https?:)?//", ref) for ref in page.refs), page.refs
    assert all(ref.startswith("#") for ref in page.refs), page.refs
    assert "@import" not in text and "url(" not in text


def report(capsys, tmp_path, om, *extra) -> tuple[str, Page, str]:
    out = tmp_path / "report.html"
    rc, stdout, stderr = run_cli(capsys, "report", om, "-o", out, *extra)
    assert rc == 0, stderr
    text = out.read_text(encoding="utf-8")
    return text, Page(text), stdout


# --- the pages -----------------------------------------------------------------------------


def test_cpu_page_has_every_section_and_says_what_is_missing(built, capsys, tmp_path):
    text, page, stdout = report(capsys, tmp_path, built["tiny_om"])
    assert f"wrote {tmp_path / 'report.html'}" in stdout
    assert {key for key, _ in SECTIONS} <= page.ids
    assert_self_contained(text, page)
    plain = page.plain
    assert "target cpu" in plain and graphopt.__version__ in plain
    assert "No accuracy check: add --reference MODEL.onnx" in plain
    assert "No tuning storage given: add --tuning-db FILE.db" in plain
    assert "No kernel configs for target cpu" in plain
    pictures = svgs(text)
    assert len(pictures) == 2  # the graph and the one partition's memory plan
    graph, plan = pictures
    ns = "{http://www.w3.org/2000/svg}"
    tips = [t.text for t in graph.iter(f"{ns}title")]
    assert any(tip.startswith("model input input") for tip in tips), tips
    assert any("in partition p0_cpu (cpu)" in tip for tip in tips)
    assert any("f32[" in tip for tip in tips)
    # The memory picture gives each buffer a tooltip: its tensors, bytes, offset and steps.
    assert all(re.search(r": [\d,]+ B at [\d,]+, steps \d+-\d+$", t.text)
               for t in plan.iter(f"{ns}title") if t.text.count(" B at "))
    assert len([t for t in plan.iter(f"{ns}title") if " B at " in t.text]) >= 2
    passes = section(text, "passes")
    assert "InferShapes" in passes and "Δ nodes" in passes


def test_ascend_page_shows_partitions_crossing_edges_fallbacks_and_kernels(built, capsys,
                                                                         tmp_path):
    text, page, _ = report(capsys, tmp_path, built["topk_om"])
    assert_self_contained(text, page)
    parts = Page(section(text, "partitions")).plain
    assert "p0_npu" in parts and "p1_cpu" in parts
    graph = svgs(section(text, "graph"))[0]
    ns = "{http://www.w3.org/2000/svg}"
    fills = {r.get("fill") for r in graph.iter(f"{ns}rect")}
    assert len(fills - {"#ffffff"}) == 2  # one colour per partition
    # Each legend entry stays on one line (a long legend wrapped between swatch and label).
    legend = re.findall(r'<span class="entry"><span class="swatch" [^>]*></span>([^<]*)</span>',
                        section(text, "graph"))
    assert legend == ["p0_npu (npu)", "p1_cpu (cpu)"], legend
    assert ".entry{white-space:nowrap" in text
    edges = {e.find(f"{ns}title").text: e for e in graph.iter(f"{ns}polyline")}
    assert edges["scores (p0_npu → p1_cpu)"].get("stroke") == "#c0392b"
    tips = [t.text for t in graph.iter(f"{ns}title")]
    assert any(tip.startswith("TopK") and "partition p1_cpu (cpu)" in tip
               and "%scores f32[1,64]" in tip for tip in tips), tips
    placement = Page(section(text, "placement")).plain
    assert "1 node(s) fell back to the host" in placement
    assert "npu profile leaves TopK to the host" in placement
    kernels = Page(section(text, "kernels")).plain
    assert "cube tilings" in kernels
    assert len(re.findall(r"\d+x\d+x\d+ l1=\d db=o[nf]f? cores=\d", kernels)) == 3
    assert "default=3" in kernels  # three cube kernels, none tuned (compiled without a db)
    memory = section(text, "memory")
    assert len(svgs(memory)) == 1  # p1_cpu's TopK needs no work memory
    assert "p1_cpu: no work memory" in Page(memory).plain


def test_reference_adds_a_passing_accuracy_table(built, capsys, tmp_path):
    text, _, stdout = report(capsys, tmp_path, built["topk_om"], "--reference",
                             built["topk"], "--inputs", built["feeds"])
    assert "accuracy: PASS (2/2 outputs" in stdout
    accuracy = section(text, "accuracy")
    plain = Page(accuracy).plain
    assert f"inputs {built['feeds']}" in plain
    assert re.search(r"values f32\[1,5\] 1\.000000", plain), plain
    assert "indices i64[1,5]" in plain
    assert '<span class="pass">PASS</span>' in accuracy and "FAIL" not in accuracy
    assert "<h3>intermediates</h3>" not in accuracy
    text, _, _ = report(capsys, tmp_path, built["topk_om"], "--reference", built["topk"],
                        "--per-tensor")
    intermediates = section(text, "accuracy").split("<h3>intermediates</h3>")[1]
    assert "<td>scores</td>" in intermediates  # the tensor crossing the two partitions


def test_a_different_reference_fails_in_the_table(built, capsys, tmp_path):
    other = topk_model(seed=8)  # same graph, other weights: the .om no longer matches it
    wrong = tmp_path / "other.onnx"
    onnx.save(other, wrong)
    text, _, stdout = report(capsys, tmp_path, built["topk_om"], "--reference", wrong)
    assert "accuracy: FAIL" in stdout
    assert '<span class="fail">FAIL</span>' in section(text, "accuracy")


def test_an_om_this_machine_cannot_run_gets_its_page_with_the_check_not_run(capsys, tmp_path):
    if "CANNExecutionProvider" in ort.get_available_providers():
        pytest.skip("the CANN provider runs the partition")
    proto = parse_model("""
    g (float[2,64] x) => (float[2,16] y) { y = MatMul(x, w) }""",
                        w=np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32))
    source, om = tmp_path / "m.onnx", tmp_path / "bf16.om"
    onnx.save(proto, source)
    graphopt.save(graphopt.optimize(proto, target="ascend910b", precision="bf16"), om)
    text, page, stdout = report(capsys, tmp_path, om, "--reference", source)
    assert "accuracy: not checked: " in stdout and "CANNExecutionProvider, which is not " \
        "installed" in stdout, stdout
    accuracy = Page(section(text, "accuracy")).plain
    assert "Not checked on this machine:" in accuracy and "graphopt compare" in accuracy
    assert "partitions" in page.plain  # the rest of the page is there


def test_tuning_db_gives_each_signature_its_study_and_curve(built, capsys, tmp_path):
    text, page, stdout = report(capsys, tmp_path, built["topk_om"], "--tuning-db", built["db"],
                                "--reference", built["topk"])
    assert_self_contained(text, page)
    tuning = section(text, "tuning")
    signatures = set(re.findall(r"<td>(ascend310/(?:conv|gemm)/[^<]+)</td>", tuning))
    assert signatures == {
        "ascend310/conv/b1_m1024_k72_n32_i32x32_o32x32_f3x3_s1x1_d1x1/float16",
        "ascend310/conv/b1_m1024_k288_n32_i32x32_o32x32_f3x3_s1x1_d1x1/float16",
        "ascend310/gemm/b1_m1_k32_n64/float16"}
    curves = svgs(tuning)
    assert len(curves) == 2  # op studies, then the subgraph study
    ns = "{http://www.w3.org/2000/svg}"
    assert len([p for p in curves[0].iter(f"{ns}polyline") if p.find(f"{ns}title") is not None]) == 3
    assert "subgraph/ascend310/" in Page(tuning).plain
    assert "tuning: 3/3 kernel signature(s) with studies; subgraph study: subgraph/ascend310/" \
        in stdout
    # Compiled without the db, the .om names no study: the one shown is its model's.
    assert "This .om names no subgraph study whose decisions it holds" in Page(tuning).plain
    # How many decisions differ from the default compile's, not how many were recorded.
    changed = re.search(r"<td class=\"n\">(\d+) of (\d+)</td></tr>", tuning)
    assert changed
    assert (int(changed[1]) == 0) == ("No decision differs from the default" in tuning)


def test_subgraph_study_needs_the_source_model(built, capsys, tmp_path):
    alone = tmp_path / "alone.om"
    shutil.copy(built["topk_om"], alone)  # no topk.onnx beside it, no --reference
    text, _, _ = report(capsys, tmp_path, alone, "--tuning-db", built["db"])
    tuning = Page(section(text, "tuning")).plain
    assert "keyed by the source model's bytes: give --reference MODEL.onnx" in tuning
    assert "ascend310/gemm/b1_m1_k32_n64/float16" in tuning


def _matmul_model(path, m: int, k: int, n: int):
    """An [m, k] × [k, n] MatMul against a weight, saved at `path` (returned)."""
    onnx.save(helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(weight(k, n), "w")]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION), path)
    return path


def test_a_named_study_gives_the_curve_and_the_storage_shows_as_given(capsys, tmp_path):
    # `tune --study NAME` keeps a kernel's trials under NAME, not its signature.
    model = _matmul_model(tmp_path / "mm.onnx", 64, 128, 64)
    om, db = tmp_path / "mm.om", tmp_path / "kb.db"
    assert main(["optimize", str(model), "-o", str(om), "--target", "ascend310", "-q"]) == 0
    assert main(["tune", str(model), "--target", "ascend310", "--trials", "3", "--tuning-db",
                 str(db), "--study", "mine", "-q"]) == 0
    capsys.readouterr()
    text, _, stdout = report(capsys, tmp_path, om, "--tuning-db", db)
    tuning = section(text, "tuning")
    assert len(svgs(tuning)) == 1
    assert f"storage <code>{db}</code>" in tuning  # not the read-only URL it was opened by
    assert "tuning: 1/1 kernel signature(s) with studies" in stdout


def test_a_profile_file_named_like_a_built_in_keeps_its_stored_prices(capsys, tmp_path):
    # Tuned on a 4-core copy of ascend310 that keeps its name, the history was repriced on the
    # built-in's 2 cores: a best tiling the .om does not use, no gain where it has a tuned one.
    import json

    model = _matmul_model(tmp_path / "mm.onnx", 1024, 256, 512)
    assert main(["targets", "ascend310", "--json"]) == 0
    profile = json.loads(capsys.readouterr().out)
    for device in profile["devices"]:
        if device.get("ai_cores"):
            device["ai_cores"] = 4
    custom = tmp_path / "my310.json"
    custom.write_text(json.dumps(profile))
    om, db = tmp_path / "mm.om", tmp_path / "kb.db"
    assert main(["tune", str(model), "--target", str(custom), "--trials", "12", "--tuning-db",
                 str(db), "-q"]) == 0
    assert main(["optimize", str(model), "-o", str(om), "--target", str(custom),
                 "--tuning-db", str(db), "-q"]) == 0
    capsys.readouterr()
    from graphopt.tools.report_data import gather_tuning
    from graphopt.tuner.kb import list_kb

    (row,) = gather_tuning(str(db), load_om(str(om)), None).kernels
    (stored,) = list_kb(str(db), reprice=False)
    (builtin,) = list_kb(str(db))  # priced on the built-in ascend310, as the report had
    assert (builtin["best_seconds"], builtin["tiling"]) != (stored["best_seconds"],
                                                            stored["tiling"])
    assert (row["best_seconds"], row["tiling"]) == (stored["best_seconds"], stored["tiling"])
    assert "cores=4" in row["tiling"]  # what the 4-core profile's tuning chose


def test_an_om_compiled_without_the_storage_says_it_runs_none_of_its_tilings(capsys, tmp_path):
    # The page showed the stored speedups beside an .om that runs the default tilings.
    from graphopt.tools.report_data import gather_tuning

    model = _matmul_model(tmp_path / "mm.onnx", 256, 256, 256)  # the README's tuned 1.22×
    db = tmp_path / "kb.db"
    assert main(["tune", str(model), "--target", "ascend310", "--trials", "20", "--tuning-db",
                 str(db), "-q"]) == 0
    notes = {}
    for name, flags in (("plain", []), ("tuned", ["--tuning-db", str(db)])):
        om = tmp_path / f"{name}.om"
        assert main(["optimize", str(model), "-o", str(om), "--target", "ascend310", "-q",
                     *flags]) == 0
        tuning = gather_tuning(str(db), load_om(str(om)), None)
        assert tuning.kernels[0]["speedup"] > 1
        notes[name] = tuning.kernel_note
    capsys.readouterr()
    assert notes == {"plain": "this .om applies none of these tilings: compiled without this "
                              "storage, its 1 kernel signature(s) with a faster stored tiling "
                              "run the default; `graphopt optimize … --tuning-db FILE` applies "
                              "them", "tuned": ""}


def test_a_database_url_is_shown_without_its_password():
    from graphopt.tools.report_data import _shown_storage

    shown = _shown_storage("postgresql://tuner:s3cret@db.example:5432/kb")
    assert "s3cret" not in shown and shown.startswith("postgresql://tuner:")


def test_cpu_target_has_nothing_to_op_tune(built, capsys, tmp_path):
    text, _, stdout = report(capsys, tmp_path, built["tiny_om"], "--tuning-db", built["db"])
    tuning = Page(section(text, "tuning")).plain
    assert "no NPU cube kernel with static shapes (target cpu)" in tuning
    assert "no subgraph study for target cpu" in tuning
    assert "tuning: no NPU cube kernel to tune; subgraph study: none" in stdout  # not "0/0"


# --- tuning: group heads, the study applied and its pricing --------------------------------


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """Two MatMuls of two signatures, the first heading the Sigmoid and Mul of an elementwise
    group once epilogues are on; a db with both kernels' op studies and two subgraph studies of
    the model, the default one and `--study mine`, created after it; the -O3 .om it applies."""
    root = tmp_path_factory.mktemp("gated")
    source, db, om = root / "gated.onnx", root / "kb.db", root / "gated.om"
    onnx.save(helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
         helper.make_node("Sigmoid", ["h"], ["s"], name="sigmoid"),
         helper.make_node("Mul", ["s", "x"], ["g"], name="gate"),
         helper.make_node("MatMul", ["g", "w2"], ["y"], name="mm2")], "gated",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 128])],
        [numpy_helper.from_array(weight(256, 256), "w1"),
         numpy_helper.from_array(weight(256, 128), "w2")]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION), source)
    for job in (["--trials", "3"], ["--job", "subgraph", "--trials", "3"],
                ["--job", "subgraph", "--trials", "3", "--study", "mine"]):
        assert main(["tune", str(source), "--target", "ascend310", "-O3", "--tuning-db",
                     str(db), "-q", *job]) == 0
    assert main(["optimize", str(source), "-o", str(om), "--target", "ascend310", "-O3",
                 "--tuning-db", str(db), "-q"]) == 0
    return {"onnx": source, "db": db, "om": om}


def test_kernels_heading_elementwise_groups_have_their_studies_listed(gated, capsys, tmp_path):
    # The subgraph decisions turn epilogues on: mm1 runs inside a graphopt:: call, a kernel
    # the .om records with a cube tiling ("kind": "group"), tuned under mm1's signature; the
    # table left that signature out.
    records = load_om(gated["om"]).extra["kernels"]["partitions"]
    (group,) = [r for rows in records.values() for r in rows if r["kind"] == "group"]
    assert "tiling" in group
    text, _, stdout = report(capsys, tmp_path, gated["om"], "--tuning-db", gated["db"])
    rows = re.findall(r"<tr><td>(ascend310/gemm/[^<]+)</td><td class=\"n\">(\d+)</td>"
                      r"<td class=\"n\">(\d+)</td>", section(text, "tuning"))
    assert sorted(rows) == [("ascend310/gemm/b1_m64_k256_n128/float16", "1", "3"),
                            ("ascend310/gemm/b1_m64_k256_n256/float16", "1", "3")]
    assert "tuning: 2/2 kernel signature(s) with studies" in stdout


def test_the_subgraph_study_is_the_one_whose_decisions_the_om_holds(gated, capsys, tmp_path):
    # optimize applies the newest study of the job, `mine`; the page described the default one.
    assert load_om(gated["om"]).extra["subgraph_study"] == "mine"
    alone = tmp_path / "alone.om"
    shutil.copy(gated["om"], alone)  # the study is named: no source model needed to find it
    text, _, stdout = report(capsys, tmp_path, alone, "--tuning-db", gated["db"])
    tuning = Page(section(text, "tuning")).plain
    assert "This .om holds the decisions of this study. study " in tuning
    assert re.search(r"decisions changed mine estimate 3 ", tuning)
    assert "subgraph/ascend310/" not in tuning
    assert stdout.splitlines()[-1].endswith("subgraph study: mine")
    other = tmp_path / "other.db"
    assert main(["tune", str(gated["onnx"]), "--target", "ascend310", "-O3", "--tuning-db",
                 str(other), "-q", "--job", "subgraph", "--trials", "2"]) == 0
    capsys.readouterr()
    text, _, stdout = report(capsys, tmp_path, alone, "--tuning-db", other)
    assert ("this .om holds the subgraph decisions of study mine, which the storage does not "
            "hold") in Page(section(text, "tuning")).plain
    assert stdout.splitlines()[-1].endswith("subgraph study: none")


def test_a_subgraph_study_is_priced_as_kb_list_prices_it(gated, capsys, tmp_path):
    # Its best is what the chosen decisions cost after simplification, which can end below
    # every trial, not the fastest trial's.
    from graphopt.tuner.kb import list_subgraph_studies
    from graphopt.tuner.optuna_import import optuna

    db = tmp_path / "kb.db"
    shutil.copy(gated["db"], db)
    study = optuna.load_study(study_name="mine", storage=f"sqlite:///{db}")
    fastest = min(t.value for t in study.trials if t.value is not None)
    study.set_user_attr("chosen_seconds", fastest * 0.9)
    (row,) = [r for r in list_subgraph_studies(str(db)) if r["study"] == "mine"]
    assert row["best_seconds"] == pytest.approx(fastest * 0.9)
    text, _, _ = report(capsys, tmp_path, gated["om"], "--tuning-db", db)
    tuning = Page(section(text, "tuning")).plain
    assert f" {row['default_seconds'] * 1e6:.2f} {row['best_seconds'] * 1e6:.2f} " in tuning
    # The curve follows the trials, as tune --plot draws it, and the page says why they differ.
    assert f"The curve follows the trials (best {fastest * 1e6:.2f} µs)" in tuning


# --- INT8: weights in another dtype, and the accuracy rule of a lossy compile ---------------


@pytest.fixture(scope="module")
def int8(tmp_path_factory):
    """A conv classifier with named nodes and its INT8 .om for the cpu: the middle conv is QDQ,
    its weight and bias DequantizeLinear nodes read initializers."""
    root = tmp_path_factory.mktemp("int8")
    proto = conv_classifier("", "float[1,64] scores")
    for i, node in enumerate(proto.graph.node):
        node.name = f"/{node.op_type.lower()}{i}/{node.op_type}"
    source, calibration, om = root / "cc.onnx", root / "calib.npz", root / "cc_int8.om"
    onnx.save(proto, source)
    np.savez(calibration, x=RNG.standard_normal((4, 1, 8, 32, 32)).astype(np.float32))
    graphopt.save(graphopt.optimize(str(source), target="cpu", pass_options={
        "quantize": "int8", "calibration": str(calibration)}), om)
    return {"onnx": source, "om": om}


def test_weight_dequantizations_are_drawn_as_weights(int8, capsys, tmp_path):
    artifact = load_om(int8["om"])
    (part,) = artifact.partitions
    model = load_onnx(artifact.models[part.name])
    weight_dqs = [n for n in model.graph if n.op_type == "DequantizeLinear"
                  and n.inputs[0].is_constant]
    assert len(weight_dqs) >= 2  # the QDQ conv's weight and bias
    graph = build_graph(artifact)
    assert graph.weight_casts == len(weight_dqs)
    assert not {n.name for n in weight_dqs} & {n.name for n in graph.nodes}
    # The conv still lists its dequantized weight among its inputs, but no edge brings it.
    conv = next(n for n in graph.nodes if n.name == "/conv2/Conv")
    dequantized = {v.name for n in weight_dqs for v in n.outputs}
    assert dequantized <= {tensor for tensor, _ in conv.inputs}
    assert not dequantized & {tensor for _, _, tensor in graph.edges}
    placed = layout(graph, collapse=False)
    assert {b.head.op for b in placed.boxes.values() if b.layer == 0} == {"input"}
    text, _, stdout = report(capsys, tmp_path, int8["om"])
    assert f"{len(model.graph)} node(s)" in stdout  # the hidden ones still count
    assert (f"nor the {len(weight_dqs)} DequantizeLinear/QuantizeLinear node(s) that only "
            "convert a weight") in Page(section(text, "graph")).plain


def test_an_int8_om_is_judged_by_cosine_unless_a_rule_is_given(int8, capsys, tmp_path):
    text, _, stdout = report(capsys, tmp_path, int8["om"], "--reference", int8["onnx"])
    assert "accuracy: PASS (1/1 outputs within cosine >= 0.999, norm within ±4.5%)" in stdout
    note = ("compiled with QuantizeInt8, lossy by design: outputs are judged by cosine >= "
            "0.999, norm within ±4.5% (the default after QuantizeInt8) instead of "
            "allclose(rtol=0.0001, "
            "atol=1e-05)")
    assert f"note: {note}" in stdout
    accuracy = Page(section(text, "accuracy")).plain
    assert note in accuracy and "rule cosine >= 0.999, norm within ±4.5%" in accuracy
    # Rounding to int8 is beyond allclose's default tolerances, element by element.
    _, _, stdout = report(capsys, tmp_path, int8["om"], "--reference", int8["onnx"],
                          "--rtol", "1e-4")
    assert "accuracy: FAIL (0/1 outputs within allclose(rtol=0.0001, atol=1e-05))" in stdout
    assert "note:" not in stdout
    _, _, stdout = report(capsys, tmp_path, int8["om"], "--reference", int8["onnx"],
                          "--min-cosine", "0.9")
    assert "accuracy: PASS (1/1 outputs within cosine >= 0.9, norm within ±48.4%)" in stdout
    assert "note:" not in stdout


def test_a_pass_on_open_dims_set_to_1_says_so_beside_the_verdict(capsys, tmp_path):
    # A GPT-2 checked on a sequence of one token printed a bare "accuracy: PASS".
    source = tmp_path / "dyn.onnx"
    onnx.save(parse_model("g (float[N, S] a) => (float[N, S] y) { y = Relu (a) }"), source)
    assert main(["optimize", str(source), "-o", str(tmp_path / "dyn.om"), "-q"]) == 0
    _, _, stdout = report(capsys, tmp_path, tmp_path / "dyn.om", "--reference", source)
    assert "accuracy: PASS (1/1 outputs within allclose(rtol=0.0001, atol=1e-05)) on seeded " \
        "random (seed 0; open dims set to 1: a [1,1])" in stdout, stdout


def test_compare_judges_a_lossy_om_by_the_same_rule(int8, capsys):
    rc, out, err = run_cli(capsys, "compare", int8["onnx"], int8["om"])
    assert rc == 0, err
    assert "result: PASS" in out and "note: compiled with QuantizeInt8, lossy by design" in out
    rc, out, _ = run_cli(capsys, "compare", int8["onnx"], int8["om"], "--atol", "1e-5")
    assert rc == 1 and "note: compiled with" not in out


def test_compare_judges_a_lossy_onnx_by_the_passes_its_metadata_names(int8, capsys, tmp_path):
    # An optimized .onnx has no pass log: the compile names its lossy passes in the model's
    # metadata, and compare reads them there.
    lossy = tmp_path / "cc_int8.onnx"
    graphopt.save(graphopt.optimize(str(int8["onnx"]), pass_options={
        "quantize": "int8", "calibration": str(int8["om"].parent / "calib.npz")}), lossy)
    props = {p.key: p.value for p in onnx.load(lossy).metadata_props}
    assert props["graphopt.lossy_passes"] == "QuantizeInt8"
    rc, out, err = run_cli(capsys, "compare", int8["onnx"], lossy)
    assert rc == 0, err
    assert "note: compiled with QuantizeInt8, lossy by design" in out
    # An .om compiled from that .onnx is judged by the same rule in compare and in report.
    om = tmp_path / "cc_int8.om"
    graphopt.save(graphopt.optimize(str(lossy)), om)
    rc, out, err = run_cli(capsys, "compare", int8["onnx"], om)
    assert rc == 0 and "note: compiled with QuantizeInt8, lossy by design" in out, err
    rc, out, err = run_cli(capsys, "report", om, "-o", tmp_path / "r.html",
                           "--reference", int8["onnx"])
    assert rc == 0 and "accuracy: PASS (1/1 outputs within cosine >= 0.999, norm within ±4.5%)" in out, out + err
    plain = tmp_path / "cc.onnx"
    graphopt.save(graphopt.optimize(str(int8["onnx"])), plain)
    assert "graphopt.lossy_passes" not in {p.key for p in onnx.load(plain).metadata_props}
    rc, out, _ = run_cli(capsys, "compare", int8["onnx"], plain)
    assert rc == 0 and "note: compiled with" not in out


def test_compare_parses_an_optimized_onnx_once(int8, capsys, tmp_path, monkeypatch):
    # The lossy passes its metadata names come from the proto compare runs, not a second parse.
    from graphopt.tools import compare_run

    lossy = tmp_path / "cc_int8.onnx"
    graphopt.save(graphopt.optimize(str(int8["onnx"]), pass_options={
        "quantize": "int8", "calibration": str(int8["om"].parent / "calib.npz")}), lossy)
    reads = []

    def counted(read):
        def reader(path, *args, **kwargs):
            reads.append(os.fspath(path) if isinstance(path, (str, os.PathLike)) else path)
            return read(path, *args, **kwargs)
        return reader

    monkeypatch.setattr(onnx, "load", counted(onnx.load))
    monkeypatch.setattr(onnx, "load_model", counted(onnx.load_model))
    monkeypatch.setattr(compare_run, "read_onnx", counted(compare_run.read_onnx))
    rc, out, err = run_cli(capsys, "compare", int8["onnx"], lossy)
    assert rc == 0, err
    assert "note: compiled with QuantizeInt8, lossy by design" in out
    assert reads.count(os.fspath(lossy)) == 1


@pytest.mark.parametrize("passes, expected", [
    ([], None),
    (["QuantizeInt8"], 0.999),
    (["ConvertPrecision"], 0.999),
    (["QuantizeInt4Weights"], 0.98),
    (["ConvertPrecision", "QuantizeInt4Weights"], 0.98),
])
def test_lossy_precision_passes_choose_the_default_cosine(passes, expected):
    log = [{"pass": "FoldConstants", "changed": True, "rewrites": {"Add": 1}}]
    log += [{"pass": name, "changed": True, "rewrites": {"x": 1}} for name in passes]
    log.append({"pass": "QuantizeInt8", "changed": False, "rewrites": {}})  # ran, did nothing
    judge, note = accuracy_rule(log)
    assert judge["min_cosine"] == expected and bool(note) == bool(passes)
    if passes:
        assert " and ".join(passes) in note
    # An explicit rule is the user's, whatever the pass log says.
    assert accuracy_rule(log, atol=1e-3) == ({"rtol": 1e-4, "atol": 1e-3, "min_cosine": None}, "")
    assert accuracy_rule(log, min_cosine=0.5)[0]["min_cosine"] == 0.5


# --- errors --------------------------------------------------------------------------------


def test_errors_name_the_option_and_leave_the_old_page(built, capsys, tmp_path):
    out = tmp_path / "report.html"
    out.write_text("old")
    rc, _, err = run_cli(capsys, "report", built["topk_om"], "-o", out, "--tuning-db",
                         tmp_path / "none.db")
    assert rc == 1 and "--tuning-db" in err and "none.db: no such knowledge base" in err
    assert not (tmp_path / "none.db").exists()  # not created by looking
    rc, _, err = run_cli(capsys, "report", built["topk_om"], "-o", out, "--storage",
                         tmp_path / "none.db")
    assert rc == 1 and "--storage" in err
    rc, _, err = run_cli(capsys, "report", built["topk_om"], "-o", out, "--inputs",
                         built["feeds"])
    assert rc == 1 and "--inputs applies to the accuracy check; add --reference" in err
    rc, _, err = run_cli(capsys, "report", built["topk_om"], "-o", out, "--min-cosine", "0.99")
    assert rc == 1 and "--min-cosine applies to the accuracy check; add --reference" in err
    rc, _, err = run_cli(capsys, "report", built["topk_om"], "-o", out, "--reference",
                         built["topk"], "--min-cosine", "0.99", "--atol", "1e-3")
    assert rc == 1 and "--min-cosine replaces the --rtol/--atol rule" in err
    bad = tmp_path / "bad.npz"
    np.savez(bad, y=np.zeros(3, np.float32))
    rc, _, err = run_cli(capsys, "report", built["topk_om"], "-o", out, "--reference",
                         built["topk"], "--inputs", bad)
    assert rc == 1 and "bad.npz" in err
    rc, _, err = run_cli(capsys, "report", built["topk"], "-o", out)
    assert rc == 1 and "not a compiled .om; compile it first" in err
    garbage = tmp_path / "garbage.om"
    garbage.write_bytes(b"not an artifact")
    rc, _, err = run_cli(capsys, "report", garbage, "-o", out)
    assert rc == 1 and "not a compiled .om artifact" in err and "compile it" not in err, err
    rc, _, err = run_cli(capsys, "report", built["topk_om"], "-o", tmp_path / "no" / "r.html")
    assert rc == 1 and "does not exist" in err
    assert out.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".report")] == []


# --- the pieces ----------------------------------------------------------------------------


def chain_graph(length: int, branches: int = 0) -> GraphData:
    """input -> Relu × length -> output, plus `branches` Neg nodes reading the first Relu and
    joined by an Add at the end (they break the chain there)."""
    nodes = [OpNode("in:x", "input", "x")]
    edges = []
    prev = "in:x"
    for i in range(length):
        nodes.append(OpNode(f"p:{i}", "Relu", f"r{i}", "p", "cpu"))
        edges.append((prev, f"p:{i}", f"t{i}"))
        prev = f"p:{i}"
    for b in range(branches):
        nodes.append(OpNode(f"q:{b}", "Neg", f"n{b}", "q", "npu"))
        edges += [("p:0", f"q:{b}", "t0"), (f"q:{b}", "p:end", f"n{b}")]
    if branches:
        nodes.append(OpNode("p:end", "Add", "end", "p", "cpu"))
        edges.append((prev, "p:end", "last"))
        prev = "p:end"
    nodes.append(OpNode("out:y", "output", "y"))
    edges.append((prev, "out:y", "y"))
    return GraphData(nodes, edges, [("p", "cpu"), ("q", "npu")])


def test_layout_layers_edges_downwards_and_never_overlaps_boxes():
    graph = chain_graph(12, branches=3)
    placed = layout(graph, collapse=False)
    assert len(placed.boxes) == len(graph.nodes)
    for a, b, _, _ in placed.edges:
        assert placed.boxes[a].layer < placed.boxes[b].layer
    by_layer: dict[int, list[float]] = {}
    for box in placed.boxes.values():
        by_layer.setdefault(box.layer, []).append(box.x)
    for xs in by_layer.values():
        xs.sort()
        assert all(b - a >= NODE_W + NODE_SEP - 1e-6 for a, b in itertools.pairwise(xs))
    # The Relu chain is straight: every Relu sits at the same x.
    assert len({round(placed.boxes[f"p:{i}"].x, 3) for i in range(1, 12)}) == 1


def test_big_graphs_collapse_chains_and_cap_the_boxes():
    graph = chain_graph(80, branches=2)
    placed = layout(graph)  # > 60 ops: collapsed
    chain = [b for b in placed.boxes.values() if len(b.members) > 1]
    assert len(chain) == 1 and len(chain[0].members) == 79  # p:1 … p:79; p:0 branches
    assert len(chain[0].members) >= CHAIN_MIN
    assert any("79 nodes are drawn as 1 collapsed chain(s)" in n for n in placed.notes)
    # Each op its own, so that no two boxes are alike (like ones fold, below).
    wide = GraphData([OpNode("in:x", "input", "x")]
                     + [OpNode(f"p:{i}", f"Op{i}", "", "p", "cpu") for i in range(MAX_BOXES + 20)],
                     [("in:x", f"p:{i}", "x") for i in range(MAX_BOXES + 20)], [("p", "cpu")])
    capped = layout(wide)
    assert len(capped.boxes) == MAX_BOXES
    assert any(f"only the first {MAX_BOXES} of {MAX_BOXES + 21} boxes" in n
               for n in capped.notes)


def test_like_branches_side_by_side_are_drawn_as_one_box():
    # An SSD's per-class post-processing: a Gather, a Greater and a NonZero per class, each
    # read from the scores and returned: 90 of them made one row 60,000 pixels wide.
    classes = 50
    nodes = [OpNode("in:x", "input", "x"), OpNode("p:s", "Conv", "scores", "p", "cpu")]
    edges = [("in:x", "p:s", "x")]
    for c in range(classes):
        nodes += [OpNode(f"p:g{c}", "Gather", f"g{c}", "p", "cpu"),
                  OpNode(f"p:t{c}", "Greater", f"t{c}", "p", "cpu"),
                  OpNode(f"p:n{c}", "NonZero", f"n{c}", "p", "cpu"),
                  OpNode(f"out:n{c}", "output", f"n{c}")]
        edges += [("p:s", f"p:g{c}", "s"), (f"p:g{c}", f"p:t{c}", f"g{c}"),
                  (f"p:t{c}", f"p:n{c}", f"t{c}"), (f"p:n{c}", f"out:n{c}", f"n{c}")]
    placed = layout(GraphData(nodes, edges, [("p", "cpu")]))
    assert len(placed.boxes) == 4
    branch, output = (b for b in placed.boxes.values() if b.copies > 1)
    assert branch.copies == output.copies == classes and len(branch.members) == 3
    assert placed.width < 4 * (NODE_W + NODE_SEP)
    assert any(f"{classes} like boxes side by side are drawn as 1 (with the model outputs they "
               "feed)" in n for n in placed.notes), placed.notes
    svg, _ = graph_svg(GraphData(nodes, edges, [("p", "cpu")]))
    assert f"{classes}× Gather → NonZero: 3 ops" in svg and "50 copies side by side" in svg


def test_every_partition_gets_a_fill_of_its_own():
    partitions = [(f"p{i}", "npu" if i % 2 else "cpu") for i in range(100)]
    fills = partition_colours(partitions)
    assert len(set(fills.values())) == 100  # the palette has 10
    assert all(re.fullmatch(r"#[0-9a-f]{6}", fill) for fill in fills.values())
    assert fills["p0"] == PALETTE[0] and fills["p9"] == PALETTE[9]  # the palette first
    assert IO_FILL not in fills.values()


def test_stored_plan_rebuilds_the_planned_buffers():
    proto = parse_model("""
        g (float[1,60] x) => (y) {
            a = Relu (x)
            b = Reshape (a, shape)
            c = Sigmoid (b)
            d = Mul (c, b)
            y = Neg (d)
        }""", HEADER, shape=np.array([1, 6, 10], np.int64))  # 240 B: aligned up to 256
    model = load_onnx(proto)
    infer_shapes(model)
    plan = plan_memory(model)
    stored = StoredPlan.from_dict(plan.to_dict())
    assert stored.steps == plan.steps and stored.arena_bytes == plan.arena_bytes
    assert {b.id: (b.first, b.last, b.size) for b in stored.buffers} == \
        {b.id: (b.first, b.last, b.size) for b in plan.buffers}
    assert stored.offsets == plan.offsets


def test_histories_svg_is_what_draw_histories_writes(tmp_path):
    series = [("a", [float("inf"), 3.0, 2.0, 2.0, 1.5], 3.0), ("b", [1.0, 1.0, 0.9], 1.0)]
    path = tmp_path / "h.svg"
    draw_histories(series, str(path))
    assert path.read_text() == histories_svg(series)
    ET.fromstring(histories_svg(series))
    draw_histories(series, str(tmp_path / "h.png"))
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- in a browser --------------------------------------------------------------------------


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def png_pixels(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, the raw decompressed scanlines) of a PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    chunks, pos = [], 8
    while pos < len(data):
        length, tag = struct.unpack(">I4s", data[pos:pos + 8])
        if tag == b"IDAT":
            chunks.append(data[pos + 8:pos + 8 + length])
        pos += 12 + length
    return width, height, zlib.decompress(b"".join(chunks))


@pytest.mark.skipif(chromium() is None, reason="no chromium binary on PATH (chromium, "
                    "chromium-browser or google-chrome); .ci/chromium.sh installs Debian's")
def test_the_page_renders_in_headless_chromium(built, capsys, tmp_path):
    report(capsys, tmp_path, built["topk_om"], "--reference", built["topk"])
    url = (tmp_path / "report.html").as_uri()
    browser = [chromium(), "--headless", "--disable-gpu", "--no-sandbox",
               "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*browser, "--dump-dom", url], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    page = Page(dom)
    assert {key for key, _ in SECTIONS} <= page.ids
    assert dom.count("<svg") == 2 and "PASS" in dom
    shot = tmp_path / "shot.png"
    subprocess.run([*browser, f"--screenshot={shot}", "--window-size=1000,1400", url],
                   capture_output=True, timeout=120, check=True)
    width, height, raw = png_pixels(shot.read_bytes())
    assert (width, height) == (1000, 1400)
    # A blank or single-colour page compresses to a handful of distinct bytes; text, tables
    # and the coloured graph give hundreds of distinct values across the scanlines.
    assert len(set(raw)) > 100
    assert os.path.getsize(shot) > 20_000


def test_the_summary_names_a_sequence_outputs_type(tmp_path, capsys):
    # A ZipMap's seq(map(…)) or a sequence output has no dtype in the manifest: the summary
    # read "??" where inspect shows the type from the partition model.
    model = parse_model("g (float[2,3] x) => (seq(float[2,3]) s, float[2,3] y) "
                        "{ s = SequenceConstruct(x, x)\n y = Relu(x) }",
                        header='<ir_version: 8, opset_import: ["" : 17]>\n')
    graphopt.save(graphopt.optimize(model), tmp_path / "m.om")
    rc, _, err = run_cli(capsys, "report", tmp_path / "m.om", "-o", tmp_path / "r.html")
    assert rc == 0, err
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "x float32[2,3] → s seq(float32) ([2,3] each); y float32[2,3]" in page


def test_a_partitions_size_counts_its_weights_blob(capsys, tmp_path):
    # As `graphopt inspect` shows it: the model's bytes alone made a 2 MiB model look 1 KiB.
    rng = np.random.default_rng(4)
    proto = parse_model("g (float[4,512] x) => (float[4,1024] y) { y = MatMul(x, w) }",
                        w=rng.standard_normal((512, 1024)).astype(np.float32))
    om = tmp_path / "m.om"
    graphopt.save(graphopt.optimize(proto, target="cpu"), om)
    text, _, _ = report(capsys, tmp_path, om)
    assert re.search(r"B \+ 2\.0 MiB weights", Page(section(text, "partitions")).plain)
    rc, out, _ = run_cli(capsys, "inspect", om)
    assert rc == 0 and "+ 2.0 MiB weights" in out


def test_box_labels_name_domains_chains_and_fit_the_box():
    from graphopt.tools.report_graph import graph_svg

    graph = chain_graph(5)
    graph.nodes[1].op = "com.microsoft.nchwc::Conv"
    graph.nodes[2].op = "com.microsoft::SkipLayerNormalization"
    svg, _ = graph_svg(graph, collapse=False)
    texts = {t.text: t for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")}
    assert "nchwc::Conv" in texts  # not the standard Conv it is not
    squeezed = texts["SkipLayerNormalization"]  # whole, in a smaller font
    assert float(squeezed.get("font-size")) < 11
    assert texts["Relu"].get("font-size") is None
    svg, _ = graph_svg(chain_graph(5), collapse=True)
    texts = [t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]
    assert "Relu → Relu: 5 ops" in texts  # a chain, not five of one op
    graph = chain_graph(5)
    graph.nodes[5].op = "com.microsoft::QuickGelu"
    svg, _ = graph_svg(graph, collapse=True)
    texts = [t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]
    assert "Relu → QuickGelu: 5 ops" in texts
    # A domain took a group's ten characters: nchwc::Co… for Conv and ReorderInput alike.
    graph = chain_graph(5)
    graph.nodes[1].op = "com.microsoft.nchwc::ReorderInput"
    graph.nodes[5].op = "com.microsoft.nchwc::ReorderOutput"
    svg, _ = graph_svg(graph, collapse=True)
    texts = [t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]
    assert "ReorderIn… → ReorderOu…: 5 ops" in texts, texts


def test_the_inputs_start_at_the_left_of_a_wide_picture(tmp_path):
    from graphopt import zoo
    from graphopt.codegen import load_om
    from graphopt.tools.report_data import build_graph

    # The zoo's UNet: its barycenter layout put the input right of the middle.
    path = tmp_path / "unet.om"
    graphopt.save(graphopt.optimize(zoo.build("unet"), target="ascend310"), path)
    placed = layout(build_graph(load_om(path)))
    (first,) = [b for b in placed.boxes.values() if b.head.op == "input"]
    assert first.x <= placed.width / 2


def test_an_if_that_holds_the_network_is_drawn_with_what_its_branches_read(capsys, tmp_path):
    # silero-vad's If holds the whole network: its branches read the model's inputs, which
    # were drawn with no edge, and the summary line counted 2 nodes where the table has 154.
    branch = lambda name, op: helper.make_graph(  # noqa: E731 - two one-line bodies
        [helper.make_node(op, ["x"], [f"{name}_y"])], name, [],
        [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [2, 3])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch("then", "Relu"),
                          else_branch=branch("else", "Neg"))], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    om = tmp_path / "if.om"
    graphopt.save(graphopt.optimize(helper.make_model(
        graph, ir_version=IR_VERSION, opset_imports=[helper.make_opsetid("", 17)])), om)
    from graphopt.codegen.om_read import load_om
    from graphopt.tools.report_data import build_graph

    drawn = build_graph(load_om(om))
    (node,) = [n.id for n in drawn.nodes if n.op == "If"]
    edges = {(u, v) for u, v, _ in drawn.edges}
    assert ("in:x", node) in edges and ("in:c", node) in edges
    _, _, stdout = report(capsys, tmp_path, om)
    assert "1 partition(s), 1 node(s) and 2 inside If/Loop/Scan bodies" in stdout


def test_placement_names_the_primary_device_and_a_model_without_nodes(tmp_path, capsys):
    # The report had named the target where the device belongs ("primary device (ascend310)"),
    # and inspect called a pass-through model's empty cpu partition the primary device.
    passthrough = tmp_path / "identity.onnx"
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    onnx.save(helper.make_model(helper.make_graph([], "g", [value], [value]), ir_version=IR_VERSION,
                                opset_imports=[helper.make_opsetid("", 17)]), passthrough)
    relu = tmp_path / "relu.onnx"
    onnx.save(parse_model("g (float[1, 3, 4, 4] x) => (float[1, 3, 4, 4] y) { y = Relu(x) }"),
              relu)
    for source, shown, page in (
            (passthrough, "placement: no node to place (the model passes its inputs through)",
             "<p>No node to place: the model passes its inputs through.</p>"),
            (relu, "placement: every node on npu, the primary device of target ascend310",
             "<p>Every node runs on the npu, the primary device of target ascend310: "
             "no fallbacks.</p>")):
        om = tmp_path / f"{source.stem}.om"
        assert main(["optimize", str(source), "-o", str(om), "--target", "ascend310", "-q"]) == 0
        capsys.readouterr()
        rc, out, err = run_cli(capsys, "inspect", str(om))
        assert rc == 0 and shown in out, out
        html = tmp_path / f"{source.stem}.html"
        rc, out, err = run_cli(capsys, "report", str(om), "-o", str(html))
        assert rc == 0 and page in html.read_text(), err
