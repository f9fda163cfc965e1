"""What `graphopt report` shows, gathered from an .om: header, graph, pass log, memory plans,
placement, kernel configs, and (when given) the tuning storage's studies and an accuracy run."""

from __future__ import annotations

import datetime
import math
import os
from collections import Counter
from dataclasses import dataclass, field

from graphopt.codegen.inspect_om import describe_om, pass_totals
from graphopt.codegen.om_manifest import file_sha256
from graphopt.codegen.om_read import OmArtifact, load_om
from graphopt.errors import StandInError
from graphopt.ir import load_onnx
from graphopt.ir.graph import captured_values
from graphopt.ir.printer import format_type
from graphopt.option_names import REPORT_FLAGS, caller_keywords, option, usage
from graphopt.tools.accuracy_rule import accuracy_rule, pass_log_of_om

INPUT, OUTPUT = "input", "output"  # the op of the graph's input and output nodes
WEIGHT_CASTS = frozenset({"DequantizeLinear", "QuantizeLinear"})


@dataclass
class OpNode:
    """One node of the drawn graph: an op of some partition, or a model input or output."""

    id: str
    op: str
    name: str
    partition: str = ""   # "" for the model's inputs and outputs
    device: str = ""
    inputs: list[tuple[str, str]] = field(default_factory=list)   # (tensor, type text)
    outputs: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class GraphData:
    nodes: list[OpNode]
    edges: list[tuple[str, str, str]]   # (producer id, consumer id, tensor)
    partitions: list[tuple[str, str]]   # (name, device), in execution order
    weight_casts: int = 0               # (De)QuantizeLinear nodes of weights, not drawn


@dataclass
class Curve:
    """Best-so-far seconds after each trial of one study, and the default's seconds."""

    name: str
    history: list[float]
    default: float | None


@dataclass
class Tuning:
    storage: str
    kernels: list[dict] = field(default_factory=list)   # one per signature of this model
    kernel_note: str = ""                                # why there are no kernel rows
    curves: list[Curve] = field(default_factory=list)   # op studies with trials
    subgraph: dict | None = None                          # of the .om's decisions, else its model's
    subgraph_curve: Curve | None = None
    subgraph_note: str = ""                               # why there is no subgraph study


@dataclass
class ReportData:
    artifact: OmArtifact
    om_sha256: str
    modified: str                          # the .om file's mtime, UTC
    graph: GraphData
    source_file: str | None = None         # the source model, found and matching its sha256
    tuning: Tuning | None = None
    accuracy: object | None = None         # a tools.compare.CompareReport
    accuracy_note: str = ""                # why outputs are judged by cosine unasked
    accuracy_skipped: str = ""             # why the asked-for check could not run here
    partition_ops: list[dict] = field(default_factory=list)  # describe_om's partition_ops

    @property
    def manifest(self) -> dict:
        return self.artifact.manifest


# --- the graph -----------------------------------------------------------------------------


def build_graph(artifact: OmArtifact) -> GraphData:
    """Every top-level node of every partition, joined across partitions by tensor name (the
    .om routes tensors by name), plus a node per model input and output."""
    manifest = artifact.manifest
    nodes: list[OpNode] = []
    producer: dict[str, str] = {}
    types: dict[str, str] = {}
    for entry in manifest["inputs"]:
        node_id = f"in:{entry['name']}"
        nodes.append(OpNode(node_id, INPUT, entry["name"]))
        producer[entry["name"]] = node_id
    reads: list[tuple[str, list[str]]] = []
    weights: set[str] = set()   # values a weight cast computes: read like initializers
    casts = 0
    for part in artifact.partitions:
        # Shapes only: external weights are never read here.
        model = load_onnx(part.model, user_model=False)
        for index, node in enumerate(model.graph):
            node_id = f"{part.name}:{index}"
            ins = [v for v in node.inputs if v is not None]
            outs = [v for v in node.outputs if v is not None]
            for v in ins + outs:
                types.setdefault(v.name, format_type(v))
            if is_weight_cast(node, weights):
                weights.update(v.name for v in outs)
                casts += 1
                continue
            nodes.append(OpNode(node_id, node.qualified_op, node.name, part.name, part.device,
                                [(v.name, format_type(v)) for v in ins],
                                [(v.name, format_type(v)) for v in outs]))
            for v in outs:
                producer[v.name] = node_id
            # An If/Loop/Scan reads what its bodies capture from this graph as well (silero-vad's
            # If holds the network: its input and state had no edge at all).
            captured = [v for sub in node.subgraphs() for v in captured_values(sub)]
            # Weights and folded constants are not drawn: only values some node computes.
            reads.append((node_id, [v.name for v in ins + captured
                                    if not v.is_constant and v.name not in weights]))
    edges = []
    for node_id, names in reads:
        for name in dict.fromkeys(names):
            if name in producer:
                edges.append((producer[name], node_id, name))
    for entry in manifest["outputs"]:
        node_id = f"out:{entry['name']}"
        nodes.append(OpNode(node_id, OUTPUT, entry["name"],
                            inputs=[(entry["name"], types.get(entry["name"], ""))]))
        if entry["name"] in producer:
            edges.append((producer[entry["name"]], node_id, entry["name"]))
    for node in nodes:
        if node.op == INPUT:
            node.outputs = [(node.name, types.get(node.name, ""))]
    partitions = [(p.name, p.device) for p in artifact.partitions]
    return GraphData(nodes, edges, partitions, casts)


def is_weight_cast(node, weights: set[str]) -> bool:
    """A DequantizeLinear or QuantizeLinear whose every input is a constant or in `weights`
    (an INT8 weight's dequantization): the weight in another dtype, which drawn would put one
    box per weight in the top layer."""
    ins = [v for v in node.inputs if v is not None]
    return (node.op_type in WEIGHT_CASTS and bool(ins)
            and all(v.is_constant or v.name in weights for v in ins))


# --- the source model ----------------------------------------------------------------------


def locate_source(manifest: dict, om_path: str, candidates: list[str | None]) -> str | None:
    """The source model file: the first of `candidates`, then the manifest's basename next to
    the .om or in the working directory, whose sha256 is the manifest's. None when none is."""
    sha, base = manifest["source"]["sha256"], manifest["source"]["path"]
    if not sha:
        return None
    paths = [c for c in candidates if c]
    if base:
        paths += [os.path.join(os.path.dirname(os.path.abspath(om_path)), base), base]
    from graphopt.ir.data_files import external_data_sha256

    external = manifest["source"].get("external_sha256")
    for path in dict.fromkeys(paths):
        if os.path.isfile(path) and file_sha256(path) == sha and (
                not isinstance(external, str) or external_data_sha256(path) == external):
            return path
    return None


# --- tuning --------------------------------------------------------------------------------


def _npu_partitions(artifact: OmArtifact) -> list[str]:
    """The NPU partitions with kernel configs, of every shape profile."""
    from graphopt.codegen.inspect_om import profile_kernel_configs

    names: list[str] = []
    for _, info in profile_kernel_configs(artifact):
        parts = info.get("partitions")
        names += list(parts) if isinstance(parts, dict) else []
    return names


def model_signatures(artifact: OmArtifact) -> Counter:
    """Kernel signature -> how many of the .om's NPU cube nodes have it, the calls of the
    elementwise groups a cube kernel heads among them (they take that kernel's tuning)."""
    from graphopt.tuner.signature import kernel_signature, model_functions

    target = artifact.manifest["target"]
    counts: Counter = Counter()
    for name in _npu_partitions(artifact):
        model = load_onnx(artifact.models[name], user_model=False)
        functions = model_functions(model)
        for node in model.graph:
            sig = kernel_signature(node, functions, target)
            if sig is not None:
                counts[sig] += 1
    return counts


def gather_tuning(storage: str, artifact: OmArtifact, source_file: str | None, *,
                  named: str | None = None) -> Tuning:
    """The op-tuning studies of this .om's kernel signatures and the subgraph study of its
    decisions (or of its model); `named` names the storage in errors (by default as gather's
    tuning_db)."""
    from graphopt.tuner.storage import opened

    # must_exist: a mistyped path would otherwise become an empty database with nothing tuned.
    with opened(storage, option=named or option("tuning_db", REPORT_FLAGS),
                read_only=True) as store:
        return _gather_tuning(store, storage, artifact, source_file)


def _gather_tuning(store, storage: str, artifact: OmArtifact, source_file: str | None) -> Tuning:
    from graphopt.tuner.optuna_import import optuna

    from graphopt.compile_tuning import EXTRA_SUBGRAPH_STUDY
    from graphopt.tuner.kb import kernel_history, list_kb

    tuning = Tuning(storage=_shown_storage(storage))
    manifest = artifact.manifest
    target = manifest["target"]
    signatures = model_signatures(artifact)
    if not signatures:
        tuning.kernel_note = (f"this .om has no NPU cube kernel with static shapes (target "
                              f"{target}), so op tuning does not apply")
    else:
        # Trials graphopt did not write are left out, as the compile that read them did. An
        # .om compiled with a profile file named like a built-in was tuned on that file's
        # figures: the stored ones, which its kernel configs agree with, not the built-in's.
        custom = "target_file" in artifact.extra
        rows = _applied_studies(list_kb(store, skipped=[], reprice=not custom))
        devices: dict = {}
        for sig, count in sorted(signatures.items()):
            row = rows.get(sig)
            tuning.kernels.append({"signature": sig, "nodes": count, **(row or {"trials": 0})})
            if row and row["trials"]:
                study = optuna.load_study(study_name=row["study"], storage=store)
                # Priced as the row beside it is: stored figures may be another cost model's.
                tuning.curves.append(Curve(sig, kernel_history(study, row, devices),
                                           row["default_seconds"]))
        if not any(k["trials"] for k in tuning.kernels):
            tuning.kernel_note = (f"the storage has no study of this model's {len(signatures)} "
                                  f"kernel signature(s); run `graphopt tune MODEL.onnx --target "
                                  f"{target} --tuning-db FILE`")
        elif not _tuned_kernels(artifact):
            # As the subgraph section says of decisions: gains beside an .om that has none of
            # them read as its own.
            faster = sum(1 for k in tuning.kernels if (k.get("speedup") or 0) > 1)
            if faster:
                tuning.kernel_note = (
                    f"this .om applies none of these tilings: compiled without this storage, "
                    f"its {faster} kernel signature(s) with a faster stored tiling run the "
                    "default; `graphopt optimize … --tuning-db FILE` applies them")
    # The study the compile took its decisions from: the storage may hold several of the model.
    _gather_subgraph(tuning, store, target, source_file, artifact.extra.get(EXTRA_SUBGRAPH_STUDY))
    return tuning


def _tuned_kernels(artifact: OmArtifact) -> int:
    """How many of the .om's kernels (of every shape profile) run a tiling from a knowledge
    base."""
    from graphopt.tuner.records import SOURCE_TUNED

    sections = [artifact.extra, *(artifact.extra.get("profiles") or {}).values()]
    return sum(record.get("tiling_source") == SOURCE_TUNED for section in sections
               for records in ((section.get("kernels") or {}).get("partitions") or {}).values()
               for record in records)


def _shown_storage(storage) -> str:
    """The storage as the user gave it (not the read-only URL it was opened by), with a
    database URL's password masked."""
    text = os.fspath(storage)
    if "://" not in text:
        return text
    from sqlalchemy.engine import make_url

    return make_url(text).render_as_string(hide_password=True)


def _applied_studies(rows: list[dict]) -> dict[str, dict]:
    """signature -> the knowledge-base row shown for a kernel: of several studies of one
    kernel (`tune --study NAME` beside the default), the one with the fastest stored best, as
    kb.best_tilings chooses (a compile re-prices every stored tiling: kb.tuned_tilings)."""
    def best(row: dict) -> float:
        return math.inf if row["best_seconds"] is None else row["best_seconds"]

    chosen: dict[str, dict] = {}
    for row in rows:
        if row["signature"] not in chosen or best(row) < best(chosen[row["signature"]]):
            chosen[row["signature"]] = row
    return chosen


def _gather_subgraph(tuning: Tuning, store, target: str, source_file: str | None,
                     applied: object = None) -> None:
    """The subgraph study whose decisions the .om holds, `applied` (the name it records); for
    an .om that names none, its model's: a subgraph study is keyed by the source model's bytes
    and pinned input shapes (tuner.subgraph_job.model_key), so it can be found only with the
    source model at hand."""
    from graphopt.tuner.optuna_import import optuna

    from graphopt.tuner.subgraph_job import SubgraphJob, model_key

    if isinstance(applied, str):
        if applied not in optuna.get_all_study_names(store):
            tuning.subgraph_note = (f"this .om holds the subgraph decisions of study {applied}, "
                                    "which the storage does not hold (give the one its compile "
                                    "read)")
            return
        _describe_subgraph(tuning, optuna.load_study(study_name=applied, storage=store), True)
        return
    prefix = f"subgraph/{target}/"
    names = [n for n in optuna.get_all_study_names(store) if n.startswith(prefix)]
    if not names:
        tuning.subgraph_note = (f"the storage has no subgraph study for target {target}; run "
                                f"`graphopt tune MODEL.onnx --target {target} --job subgraph "
                                "--tuning-db FILE`")
        return
    if source_file is None:
        tuning.subgraph_note = (f"the storage has {len(names)} subgraph study(ies) for {target}, "
                                "but they are keyed by the source model's bytes: give "
                                f"{usage('reference', 'MODEL.onnx', REPORT_FLAGS)} (or put the "
                                "source model next to the .om) to find this model's")
        return
    for name in sorted(names):
        study = optuna.load_study(study_name=name, storage=store)
        job = study.user_attrs.get("job") or {}
        of_model = SubgraphJob(source_file, target, input_shapes=job.get("input_shapes"))
        if name.split("/")[2] in {model_key(of_model), model_key(of_model, legacy=True)}:
            _describe_subgraph(tuning, study, False)
            return
    tuning.subgraph_note = (f"none of the {len(names)} subgraph study(ies) for {target} is of "
                            f"{os.path.basename(source_file)}")


def _describe_subgraph(tuning: Tuning, study, applied: bool) -> None:
    """The subgraph section's figures of one study, `applied` whether the .om holds its
    decisions; its trials, default and best as `kb list` counts and prices them (the best is
    the chosen decisions', kb.subgraph_row), its curve every trial's best so far, as
    `tune --plot` draws it."""
    from graphopt.tuner.kb import subgraph_row
    from graphopt.tuner.search import history

    job = study.user_attrs.get("job") or {}
    row = subgraph_row(study)
    chosen = study.user_attrs.get("chosen") or {}
    baseline = next((t.params for t in study.get_trials(deepcopy=False)
                     if t.user_attrs.get("default")), {})
    values = [v for v in history(study) if v != float("inf")]
    tuning.subgraph = {
        **row, "applied": applied, "best_trial_seconds": min(values) if values else None,
        "objective": job.get("objective", "?"), "level": job.get("level", "?"),
        "input_shapes": job.get("input_shapes"), "chosen": chosen,
        "changed": sum(1 for key, value in chosen.items() if baseline.get(key) != value)}
    tuning.subgraph_curve = Curve(study.study_name, history(study), row["default_seconds"])


# --- everything ----------------------------------------------------------------------------


def gather(om_path: str, *, reference: str | None = None, inputs: str | None = None,
           input_shapes: str | None = None, per_tensor: bool = False,
           tuning_db: str | None = None, tuning_option: str | None = None,
           rtol: float | None = None, atol: float | None = None,
           min_cosine: float | None = None) -> ReportData:
    """Load and verify the .om and collect every section's data; the optional parts are
    None when not asked for. The accuracy rule is `accuracy_rule`'s. `tuning_option` names
    the storage in errors (by default as this function's tuning_db)."""
    artifact = load_om(om_path)
    stat = os.stat(om_path)
    modified = datetime.datetime.fromtimestamp(stat.st_mtime, datetime.timezone.utc)
    data = ReportData(artifact=artifact, om_sha256=file_sha256(om_path),
                      modified=modified.strftime("%Y-%m-%d %H:%M:%S UTC"),
                      graph=build_graph(artifact),
                      partition_ops=describe_om(artifact)["partition_ops"])
    data.source_file = locate_source(artifact.manifest, om_path, [reference])
    if tuning_db is not None:
        data.tuning = gather_tuning(tuning_db, artifact, data.source_file, named=tuning_option)
    if reference is not None:
        from graphopt.tools.compare import compare_models

        judge, data.accuracy_note = accuracy_rule(pass_log_of_om(artifact), rtol, atol,
                                                  min_cosine)
        try:
            with caller_keywords({"feeds": "inputs"}):  # compare's feeds are gather's inputs
                data.accuracy = compare_models(reference, om_path, inputs,
                                               per_tensor=per_tensor, input_shapes=input_shapes,
                                               rounding=rtol is None and atol is None, **judge)
        except StandInError as exc:
            # Compiled for a device this machine lacks: the page still shows the compile.
            data.accuracy_skipped = str(exc)
    return data


def pass_rows(pass_log: list) -> list[dict]:
    """Per pass, in first-run order: runs, runs that changed the graph, node delta, rewrites
    by rule (inspect_om.pass_totals plus what the HTML table has room for)."""
    changed: Counter = Counter()
    delta: Counter = Counter()
    for entry in pass_log:
        if not isinstance(entry, dict):
            continue
        name = entry.get("pass") if isinstance(entry.get("pass"), str) else "(unnamed)"
        changed[name] += bool(entry.get("changed"))
        before, after = entry.get("nodes_before"), entry.get("nodes_after")
        if isinstance(before, int) and isinstance(after, int):
            delta[name] += after - before
    return [{"pass": name, "runs": total["runs"], "changed": changed[name],
             "delta": delta[name], "rewrites": total["rewrites"]}
            for name, total in pass_totals(pass_log).items()]
