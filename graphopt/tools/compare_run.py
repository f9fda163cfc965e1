"""The two sides of `graphopt compare`: load an .onnx or .om, check signatures and feeds, run
with chosen intermediates exposed as extra outputs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx.external_data_helper import load_external_data_for_tensor

from graphopt import api_args, numerics
from graphopt.codegen.feeds import (check_feeds, describe, load_npz, overridable_inputs,
                                    typed_inputs)
from graphopt.codegen.inspect_onnx import read_onnx
from graphopt.codegen.om_manifest import file_sha256
from graphopt.codegen.om_read import is_om
from graphopt.errors import GraphoptError, InputError
from graphopt.input_files import utf8_named
from graphopt.input_shapes import check_pins, input_shapes_argument
from graphopt.lent_weights import external_tensors, lend_external
from graphopt.nchwc_block import block_mismatch
from graphopt.option_names import COMPARE_FLAGS, option
from graphopt.random_seeds import draws_unseeded, seeded_runs
from graphopt.source_marks import (cut_outputs, extra_cut_outputs, extra_io_types,
                                   extra_preprocessing, extra_rescaled_values,
                                   inserted_preprocessing, io_types, rescaled_values)
from graphopt.warning_scope import kept_notices


@dataclass(frozen=True)
class Tensor:
    """A value computed inside a model, as graph order meets it."""

    name: str
    producer: str         # "Mul 'scale'": the node that computes it
    partition: str = ""   # the .om partition that holds that node


@dataclass
class Side:
    """One model under comparison: an ONNX proto run at onnxruntime's `level`, or an .om session."""

    label: str
    inputs: list[dict]                 # signature entries {"name", "dtype", "shape"}
    outputs: list[str]
    proto: onnx.ModelProto | None = None
    session: object | None = None      # graphopt.codegen.runtime.OmSession
    tensors: list[Tensor] = field(default_factory=list)  # computed values, graph order
    notes: list[str] = field(default_factory=list)       # what loading it warned about
    # An .om's computed values per shape profile, which differ: other pins, other folds.
    profile_tensors: dict[str, list[Tensor]] = field(default_factory=dict)
    level: str = "disable"  # the onnxruntime optimization level a proto runs at
    # The proto's session for runs without extra outputs, made once: compare --samples and
    # the accuracy report run one side per sample (BERT-base's session takes ~0.5 s to make).
    _session: tuple | None = field(default=None, repr=False, compare=False)  # (level, session)
    # The file the proto was read from, as read: onnxruntime opens it there rather than from
    # the proto serialized again (one more copy of the weights; past 2 GiB, a copy on disk).
    path: str | None = None

    def tensors_for(self, feeds: Mapping[str, object]) -> list[Tensor]:
        """The computed values of the plan `feeds` run: an .om's shape profile they match."""
        if self.session is not None and self.profile_tensors:
            return self.profile_tensors[self.session.profile_for(feeds)]
        return self.tensors

    def cut_outputs(self) -> list[str]:
        """The source model's outputs the compile that made this side cut off (--out-nodes)."""
        if self.session is not None:
            return extra_cut_outputs(self.session.artifact.extra)
        return cut_outputs(self.proto.metadata_props) if self.proto is not None else []

    def rescaled_values(self) -> list[str]:
        """The values the compile that made this side rescaled per channel, under their names."""
        if self.session is not None:
            return extra_rescaled_values(self.session.artifact.extra)
        return rescaled_values(self.proto.metadata_props) if self.proto is not None else []

    def preprocessing(self) -> dict:
        """The image preprocessing (--insert-op-conf) the compile that made this side inserted,
        by input name: {} when it inserted none."""
        if self.session is not None:
            return extra_preprocessing(self.session.artifact.extra)
        return inserted_preprocessing(self.proto.metadata_props) if self.proto is not None else {}

    def io_types(self) -> dict:
        """The input and output dtypes the compile that made this side changed
        (--input-fp16-nodes, --output-type): {"inputs": {…}, "outputs": {…}}."""
        if self.session is not None:
            return extra_io_types(self.session.artifact.extra)
        return io_types(self.proto.metadata_props if self.proto is not None else {})

    def profile_note(self, feeds: Mapping[str, object]) -> str | None:
        """Which of an .om's shape profiles `feeds` run on; None for a model without."""
        profiles = self.session.artifact.profiles if self.session is not None else []
        if not profiles:
            return None
        from graphopt.codegen.profile_match import dims_label

        chosen = self.session.profile_for(feeds)
        dims = next(p["dims"] for p in profiles if p["name"] == chosen)
        return (f"{self.label} ran its shape profile {chosen} ({dims_label(dims)}), one of "
                f"{len(profiles)}")

    def run(self, feeds: Mapping[str, object], extra: list[str]) -> dict[str, object]:
        """The outputs and the `extra` intermediates (those this side computes)."""
        if self.session is not None:
            values = self.session.run(dict(feeds))
            if extra:
                values.update(self._run_partitions(feeds, set(extra)))
            return values
        if extra and self.level != "disable":
            # A value exposed as an output stops onnxruntime's fusions around it (a QDQ group
            # stays float-simulated instead of an int8 kernel): the outputs come from a run of
            # the model as deployed, the intermediates from a second one.
            values = _run_onnx(self.proto, self.label, feeds, extra, self.level)
            values.update(self._run_plain(feeds))
            return values
        if not extra:
            return self._run_plain(feeds)
        return _run_onnx(self.proto, self.label, feeds, extra, self.level)

    def _run_plain(self, feeds: Mapping[str, object]) -> dict[str, object]:
        """The proto's outputs alone, on the session made for them at its first run."""
        try:
            if self._session is None or self._session[0] != self.level:
                # onnxruntime opens a path as UTF-8: under another file-system encoding
                # (LANG=en_US.ISO-8859-1, a C locale without UTF-8 mode) a non-ASCII name
                # names another file, or none; the proto read from it is the same model.
                # A model with unseeded random ops runs from its proto, which numerics seeds.
                source = self.path if self.path is not None and utf8_named(self.path) \
                    and not draws_unseeded(self.proto) else self.proto
                self._session = (self.level, numerics.session(source, self.level))
            session = self._session[1]
            names = [o.name for o in session.get_outputs()]
            runner = numerics.typed_runner(session) or session.run
            return dict(zip(names, runner(names, dict(feeds))))
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own untyped exceptions
            raise _cannot_run(self.label, self.proto, exc) from None

    def _run_partitions(self, feeds, wanted: set[str]) -> dict[str, np.ndarray]:
        # The session cannot return values inside a partition, so each partition runs again as
        # a standalone model with them added as outputs, at the level its compile recorded.
        # Its session's settings too: a partition whose weights stay unpacked computes its
        # GEMMs in another order than a packed one, and intermediates must match the outputs.
        from graphopt.codegen.partition_sessions import partition_session_config

        artifact = self.session.artifact
        if artifact.profiles:  # the shape profile these feeds run on
            artifact = artifact.profile(self.session.profile_for(feeds))
        env = dict(feeds)
        for part in artifact.partitions:
            model = artifact.partition_model(part.name)
            produced = {out for node in model.graph.node for out in node.output}
            exposed = sorted((wanted & produced) - set(part.outputs))
            values = _run_onnx(model, f"{self.label} partition {part.name!r}",
                               {name: env[name] for name in part.inputs}, exposed,
                               level=part.optimization_level or "all",
                               config=partition_session_config(part),
                               disabled_optimizers=part.disabled_optimizers)
            env.update(values)
        return {name: env[name] for name in wanted if name in env}


def _run_onnx(proto: onnx.ModelProto, label: str, feeds, extra: list[str],
              level: str = "disable", **settings) -> dict[str, np.ndarray]:
    # The extra outputs are added for this run and taken off after it, rather than to a copy:
    # a copy would hold the weights once more (440 MB on BERT-base) while onnxruntime holds
    # its own. Typeless outputs are fine for onnxruntime; it knows every value's type itself.
    outputs = proto.graph.output
    declared = len(outputs)
    outputs.extend(onnx.ValueInfoProto(name=name) for name in extra)
    try:
        return numerics.run(proto, dict(feeds), level=level, **settings)
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own untyped exceptions
        raise _cannot_run(label, proto, exc) from None
    finally:
        del outputs[declared:]


def _cannot_run(label: str, proto: onnx.ModelProto, exc: Exception) -> GraphoptError:
    """The one-line error for onnxruntime's refusal to run `proto` (named `label`)."""
    return GraphoptError(f"onnxruntime cannot run {label}: {numerics.ort_reason(exc)}"
                         f"{_npu_compile_hint(proto, exc)}")


def _npu_compile_hint(proto: onnx.ModelProto, exc: Exception) -> str:
    """Why an .onnx compiled for an NPU target may lack a kernel here: a bf16 compile for the
    910B loads on the NPU's provider, not on the CPU's, and the bare "no implementation for
    Relu" said nothing of it (an .om's partitions say so already)."""
    from graphopt.tools.accuracy_rule import LOSSY_DEVICE_KEY

    npu = any(p.key == LOSSY_DEVICE_KEY and p.value == "npu" for p in proto.metadata_props)
    if not npu or "NOT_IMPLEMENTED" not in str(exc):
        return ""
    return (" (compiled for an NPU target: onnxruntime's CPU provider here has no kernel for "
            "every op compiled for the device; run it where the device's provider is installed)")


def _computed(graph: onnx.GraphProto, partition: str = "") -> list[Tensor]:
    tensors = []
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            continue  # a weight written as a node, not a computed value
        producer = f"{node.op_type} '{node.name}'" if node.name else node.op_type
        tensors.extend(Tensor(out, producer, partition) for out in node.output if out)
    return tensors


def _read_onnx(path: str, om_too: bool) -> onnx.ModelProto:
    """The model at `path` with its external data: loaded, but within a `lending` block
    (compare_models') the main graph's weights stay mapped in their files, lent to the
    sessions and imports that read them (lent_weights)."""
    model = read_onnx(path, om_too)
    base_dir = os.path.dirname(os.path.abspath(path))
    try:
        lend_external(model, path)
        for tensor in list(external_tensors(model)):
            load_external_data_for_tensor(tensor, base_dir)
    except InputError as exc:
        raise InputError(f"{path}: cannot load the model's external data "
                         f"({str(exc).removeprefix(f'{path}: ')})") from None
    except (OSError, ValueError, onnx.checker.ValidationError) as exc:
        raise InputError(f"{path}: cannot load the model's external data ({exc})") from None
    return model


def _onnx_side(model, label: str, om_too: bool = True) -> Side:
    """`om_too`: an .om would have been taken in its place (a bad file is neither)."""
    proto = model if isinstance(model, onnx.ModelProto) else _read_onnx(label, om_too)
    # A model LayoutNchwc blocked for another CPU: say so, not onnxruntime's shape error.
    problem = block_mismatch({p.key: p.value for p in proto.metadata_props})
    if problem:
        raise InputError(f"{label}: {problem}")
    # As optimize refuses it. A reference without outputs had been judged by the candidate's
    # outputs, met among its intermediates, and passed.
    if not proto.graph.output:
        raise InputError(f"{label}: graph '{proto.graph.name}' has no outputs (nothing to "
                         "compute)")
    return Side(label, typed_inputs(proto), [vi.name for vi in proto.graph.output],
                proto=proto, tensors=_computed(proto.graph),
                path=None if isinstance(model, onnx.ModelProto) else label)


def with_candidates_edits(reference: Side, candidate: Side) -> tuple[Side, list[str]]:
    """`reference` edited as the candidate records its source was (--insert-op-conf's
    preprocessing, --input-fp16-nodes' and --output-type's dtypes), where the reference is not
    already: both then take and give the same; with notes saying so."""
    reference, preprocessed = _with_candidates_preprocessing(reference, candidate)
    reference, retyped = _with_candidates_io_types(reference, candidate)
    return reference, [note for note in (preprocessed, retyped) if note]


def _with_candidates_io_types(reference: Side, candidate: Side) -> tuple[Side, str | None]:
    """`reference` with the Casts at its edges that the candidate's --input-fp16-nodes and
    --output-type put at the source's, where the reference's dtypes are the source's."""
    recorded = candidate.io_types()
    if reference.proto is None or not (recorded["inputs"] or recorded["outputs"]):
        return reference, None
    from graphopt.codegen.om_manifest import dtype_name
    from graphopt.io_types import apply_io_types
    from graphopt.ir import load_onnx, to_onnx

    ref_inputs = {e["name"]: e["dtype"] for e in reference.inputs}
    ref_outputs = {o.name: dtype_name(o.type.tensor_type.elem_type)
                   for o in reference.proto.graph.output}
    inputs = [name for name, dtype in recorded["inputs"].items()
              if ref_inputs.get(name) not in (None, dtype)]
    outputs = {name: "FP16" if dtype == "float16" else "FP32"
               for name, dtype in recorded["outputs"].items()
               if ref_outputs.get(name) not in (None, dtype)}
    if not inputs and not outputs:
        return reference, None  # the reference has them already (edited alike)
    model = load_onnx(reference.proto, user_model=True)
    try:
        apply_io_types(model, inputs, outputs, reference.label)
    except GraphoptError as exc:
        raise InputError(f"{candidate.label} was compiled with {option('input_fp16_nodes')}/"
                         f"{option('output_type')}, and its record does not fit the reference: "
                         f"{exc}") from None
    edited = _onnx_side(to_onnx(model), reference.label)
    return edited, (f"{candidate.label} takes or gives other dtypes "
                    f"({option('input_fp16_nodes')}/{option('output_type')}): "
                    f"{reference.label} ran with the same Casts at its edges")


def _with_candidates_preprocessing(reference: Side, candidate: Side) -> tuple[Side, str | None]:
    """`reference` with the image preprocessing (--insert-op-conf) the candidate was compiled
    with in front of it, when the candidate records some for inputs the reference takes as it
    was before: both then take the same uint8 images; with a note saying so. Otherwise
    `reference` itself, and None."""
    recorded = candidate.preprocessing()
    if not recorded or reference.proto is None:
        return reference, None
    ref_types = {e["name"]: e["dtype"] for e in reference.inputs}
    cand_types = {e["name"]: e["dtype"] for e in candidate.inputs}
    if not any(ref_types.get(name) not in (None, cand_types.get(name)) for name in recorded):
        return reference, None  # the reference takes the images already (edited alike)
    from graphopt.aipp_graph import insert_aipp, recorded_ops
    from graphopt.ir import load_onnx, to_onnx

    model = load_onnx(reference.proto, user_model=True)
    try:
        insert_aipp(model, recorded_ops(recorded, model), None)
    except GraphoptError as exc:
        raise InputError(f"{candidate.label} was compiled with {option('insert_op_conf')}, and "
                         f"{exc}") from None
    edited = _onnx_side(to_onnx(model), reference.label)
    return edited, (f"{candidate.label} takes uint8 images ({option('insert_op_conf')}): "
                    f"{reference.label} ran with the same preprocessing in front of it")


def load_reference(model) -> Side:
    """The reference: an .onnx path, a ModelProto or its bytes, or a Side this function
    returned."""
    if isinstance(model, Side):
        return model
    model = api_args.model(model, "reference")
    if isinstance(model, onnx.ModelProto):
        return _onnx_side(model, "<reference>")
    path = model
    if os.path.isfile(path) and is_om(path):
        raise InputError(f"{path}: the reference must be an .onnx model, not an .om artifact")
    return _onnx_side(None, path, om_too=False)


def load_candidate(model) -> Side:
    """The candidate: an .onnx or .om path, a ModelProto or an .onnx's bytes, or a Side this
    function returned."""
    from graphopt.codegen.loader import load

    if isinstance(model, Side):
        return model
    model = api_args.model(model, "candidate", "an .onnx or .om path, a ModelProto or an "
                           ".onnx's bytes (a loaded .om: its path)")
    if isinstance(model, onnx.ModelProto):
        return _deployed(_onnx_side(model, "<candidate>"))
    path = model
    if not (path.lower().endswith(".om") or (os.path.isfile(path) and is_om(path))):
        return _deployed(_onnx_side(None, path))
    with kept_notices() as caught, seeded_runs():
        # One onnxruntime thread, as the reference runs: a thread pool sums in another order,
        # and a dynamically quantized LSTM's batch of 2 differs by 0.2 between 1 and 2 threads
        # on the original alone, which read as the compile's error. (Warns when an NPU
        # partition stands in on the CPU provider.) Its samplers draw the reference's noise.
        session = load(path, intra_op_num_threads=1, inter_op_num_threads=1)
    artifact = session.artifact
    by_profile = {p["name"]: _om_tensors(artifact.profile(p["name"]))
                  for p in artifact.profiles}
    return Side(path, session.inputs, [o["name"] for o in session.outputs], session=session,
                tensors=_om_tensors(artifact), notes=caught,
                profile_tensors=by_profile)


def source_note(reference: Side, candidate: Side) -> str | None:
    """A note when the candidate is an .om whose manifest records a source model other than
    the reference file (by sha256): its outputs may differ for that reason alone."""
    if candidate.session is None or not os.path.isfile(reference.label):
        return None
    from graphopt.ir.data_files import external_data_sha256

    source = candidate.session.artifact.manifest.get("source")
    expected = source.get("sha256") if isinstance(source, dict) else None
    if not isinstance(expected, str):
        return None
    if file_sha256(reference.label) != expected:
        return (f"{reference.label} is not the model {candidate.label} was compiled from (its "
                f"manifest records {source.get('path', '?')} with sha256 {expected[:12]}…): "
                "the outputs may differ for that reason alone")
    external = source.get("external_sha256")
    if isinstance(external, str) and external_data_sha256(reference.label) != external:
        return (f"{reference.label} reads other external data than the model "
                f"{candidate.label} was compiled from (its weights files differ from those "
                "its manifest records): the outputs may differ for that reason alone")
    return None


def _deployed(side: Side) -> Side:
    """A candidate .onnx judged at the level accuracy_rule.deployed_level chooses for it."""
    from graphopt.tools.accuracy_rule import deployed_level

    side.level = deployed_level(side.proto.metadata_props)
    return side


def _om_tensors(artifact) -> list[Tensor]:
    """The values an artifact's partitions compute (of its default plan, or of the shape
    profile `artifact` views), each once, in execution order."""
    tensors, seen = [], set()
    for part in artifact.partitions:
        for tensor in _computed(part.model.graph, part.name):
            if tensor.name not in seen:
                seen.add(tensor.name)
                tensors.append(tensor)
    return tensors


def check_signatures(reference: Side, candidate: Side) -> None:
    """InputError unless both take the same inputs with the same dtypes and compatible dims."""
    ref = {e["name"]: e for e in reference.inputs}
    cand = {e["name"]: e for e in candidate.inputs}
    where = f"{reference.label} and {candidate.label}"
    for name in ref.keys() - cand.keys():
        raise InputError(f"input {name!r} of {reference.label} is not an input of {candidate.label} "
                         f"(its inputs: {', '.join(cand) or 'none'})")
    for name in cand.keys() - ref.keys():
        raise InputError(f"input {name!r} of {candidate.label} is not an input of {reference.label} "
                         f"(its inputs: {', '.join(ref) or 'none'})")
    for name, r in ref.items():
        c = cand[name]
        if r["dtype"] != c["dtype"] or r.get("type") != c.get("type"):
            raise InputError(f"input {name!r} is {describe(r)} in {reference.label} but "
                             f"{describe(c)} in {candidate.label}")
        if r["shape"] is None or c["shape"] is None:
            continue
        clash = len(r["shape"]) != len(c["shape"]) or any(
            isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(r["shape"], c["shape"]))
        if clash:
            raise InputError(f"input {name!r} has shape {describe(r)} in {reference.label} but "
                             f"{describe(c)} in {candidate.label}; {where} cannot take the same feeds")


def shared_dims(reference: Side, candidate: Side, profile: int = 0) -> dict[str, list]:
    """Each reference input's dims (of known rank), with those the candidate was compiled with
    (an .om built with --input-shape, or its shape profile number `profile`) where the
    reference's are symbolic."""
    profiles = getattr(candidate.session, "profiles", None)
    fixed = {e["name"]: e["shape"] for e in (profiles[profile]["inputs"] if profiles
                                             else candidate.inputs)}
    dims = {}
    for entry in reference.inputs:
        shape, theirs = entry["shape"], fixed.get(entry["name"])
        if shape is None:
            continue
        if theirs is None or len(theirs) != len(shape):
            theirs = shape
        dims[entry["name"]] = [b if isinstance(b, int) and not isinstance(a, int) else a
                               for a, b in zip(shape, theirs)]
    return dims


def _fed(value):
    """A caller's feed: a sequence (list), map (dict) or empty optional (None) as it is, which
    np.asarray would turn into a tensor or refuse; anything else as an array."""
    if value is None or isinstance(value, (list, tuple, Mapping)):
        return value
    return np.asarray(value)


def _check_retyped_feeds(arrays: dict, candidate: Side, label: str) -> None:
    """InputError naming the compile's --input-fp16-nodes or --insert-op-conf for a feed of
    another dtype than the candidate takes there: the reference is run as that compile edited
    it, and its refusal named the reference, whose file takes float32."""
    retyped = {name: (dtype, option("input_fp16_nodes"), f"give {dtype} arrays "
                                                         f"(x.astype(np.{dtype}))")
               for name, dtype in candidate.io_types()["inputs"].items()}
    retyped.update({name: ("uint8", option("insert_op_conf"), "give the uint8 frames it "
                                                              "preprocesses")
                    for name in candidate.preprocessing()})
    for name, (dtype, flag, fix) in retyped.items():
        fed = arrays.get(name)
        if isinstance(fed, np.ndarray) and fed.dtype != np.dtype(dtype):
            raise InputError(f"{label}: input {name!r} has dtype {fed.dtype}, but "
                             f"{candidate.label} takes {dtype} there (its compile's {flag}), "
                             f"and the reference is compared as that compile edited it: {fix}")


def make_feeds(reference: Side, candidate: Side, feeds, seed: int,
               input_shapes) -> tuple[dict[str, np.ndarray], str]:
    """The feeds both sides run on, and how to describe them: `feeds` (a dict or an .npz path)
    checked against both signatures, else seeded random data in the reference's signature."""
    feeds = api_args.feeds(feeds, option("feeds", COMPARE_FLAGS))
    seed = api_args.seed(seed, option("seed", COMPARE_FLAGS))
    if feeds is not None:
        label = os.fspath(feeds) if isinstance(feeds, (str, os.PathLike)) else "feeds"
        if isinstance(feeds, (str, os.PathLike)):
            try:
                arrays = load_npz(feeds)
            except InputError as exc:  # which of the two files the message is about
                raise InputError(f"{option('feeds', COMPARE_FLAGS)} {exc}") from None
        else:
            arrays = {name: _fed(value) for name, value in feeds.items()}
        _check_retyped_feeds(arrays, candidate, label)
        overridable = overridable_inputs(reference.proto)
        for side in (reference, candidate):
            own = overridable_inputs(side.proto)  # an optimized .onnx keeps them overridable too
            try:
                check_feeds(side.inputs, {k: v for k, v in arrays.items() if k not in own})
            except InputError as exc:
                fixed = sorted(set(arrays) & overridable - own - {e["name"] for e in side.inputs})
                if fixed:  # the reference takes it; a compile fixed it (an .om takes no such feed)
                    raise InputError(f"{label}: {fixed[0]!r} overrides an initializer of "
                                     f"{reference.label}, which {side.label} holds fixed at its "
                                     "value; compare without it") from None
                raise InputError(f"{label}: {exc} (for {side.label})") from None
        return arrays, label
    shapes = input_shapes_argument(input_shapes)
    check_pins(shapes, reference.inputs, reference.label)
    # The random data fits both without the user repeating the candidate's pins.
    shared = shared_dims(reference, candidate)
    for entry in reference.inputs:
        dims = shared.get(entry["name"])
        if dims is None:
            continue
        # A -1 the user gave leaves the dim open: the candidate's size for it, where it has
        # one (an .om's shape profile, compiled from the same -1), still fits both.
        given = shapes.get(entry["name"]) or [-1] * len(dims)
        pins = [p if p != -1 else d if isinstance(d, int) and not isinstance(a, int) else -1
                for a, d, p in zip(entry["shape"], dims, given)]
        if any(p >= 0 for p in pins):
            shapes[entry["name"]] = pins
    try:
        arrays = numerics.random_feeds(reference.proto, seed=seed, shapes=shapes,
                                       feeds_keyword="feeds")
    except (ValueError, InputError) as exc:  # InputError: an input past numpy's rank
        raise InputError(f"{reference.label}: {exc}") from None
    try:
        check_feeds(candidate.inputs, arrays)
    except InputError as exc:
        if input_shapes:  # the user's pins: what they ask for does not fit, nothing to add
            raise InputError(f"{option('input_shapes', COMPARE_FLAGS)} shapes inputs that do "
                             f"not fit {candidate.label}: {exc}") from None
        raise InputError(f"random inputs made for {reference.label} do not fit {candidate.label}: "
                         f"{exc}; pin the dims with {option('input_shapes', COMPARE_FLAGS)} or "
                         f"pass {option('feeds', COMPARE_FLAGS)}") from None
    opened = open_dims_note(reference.inputs, shapes, arrays)
    return arrays, f"seeded random (seed {seed}{opened and f'; {opened}'})"


def open_dims_note(inputs: list[dict], shapes: dict, arrays: dict) -> str:
    """"open dims set to 1: input_ids [1,1]" for the `inputs` (signature entries) with an
    open dim beyond the batch (axis 0) that nothing pinned, which random data fills with 1: a
    sequence of one token says little about attention. A batch of one goes unsaid."""
    opened = []
    for entry in inputs:
        shape, pins = entry.get("shape"), shapes.get(entry["name"]) or []
        array = arrays.get(entry["name"])
        if shape is None or array is None or not hasattr(array, "shape"):
            continue
        open_axes = [axis for axis, dim in enumerate(shape) if not isinstance(dim, int)
                     and (axis >= len(pins) or pins[axis] < 0)]
        if any(axis > 0 for axis in open_axes) \
                and all(array.shape[axis] == 1 for axis in open_axes):
            opened.append(f"{entry['name']} [{','.join(map(str, array.shape))}]")
    if not opened:
        return ""
    more = f", +{len(opened) - 3} more" if len(opened) > 3 else ""
    return f"open dims set to 1: {', '.join(opened[:3])}{more}"
