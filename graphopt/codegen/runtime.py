"""Run an .om artifact with onnxruntime: one session per partition, tensors routed by name."""

from __future__ import annotations

import copy
import os
import sys
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnxruntime as ort

from graphopt.codegen.deferred_check import DeferredCheck, deferred_check
from graphopt.codegen.feeds import (as_array, check_strings, describe, dtype_mismatch, fed_shape,
                                    fitted_value, is_optional, numpy_dtype, same_bits,
                                    shared_dim_clash, shared_dims, strings_for_onnxruntime,
                                    typed_entry, unknown_input)
from graphopt.codegen.index_bounds import check_dim, check_ids
from graphopt.codegen.om_file import OpenedFile
from graphopt.codegen.om_manifest import INDEX_DIMS, INDEX_ROWS
from graphopt.codegen.om_read import OmArtifact, cpu_count, load_om
from graphopt.codegen.partition_sessions import (DISABLE_PREPACKING, Step, first_line,
                                                 open_steps, session_options, skips_prepacking)
from graphopt.codegen.plain_feeds import PlainFeeds, plain, plain_feeds
from graphopt.codegen.profile_match import ProfileMatcher, profiles_count
from graphopt.errors import ArtifactError, GraphoptError, InputError, OptionError
from graphopt.warning_scope import notice


def _call(step: Step, feeds: Mapping[str, Any]) -> list:
    """Run one partition; onnxruntime's untyped exceptions become a GraphoptError naming it."""
    try:
        return step.call(step.outputs, feeds)
    except GraphoptError:
        raise  # a TypedRunner's refusal, which names the value already
    except Exception as exc:  # onnxruntime raises its own untyped exceptions
        raise _failed(step, exc) from None


def _failed(step: Step, exc: Exception) -> GraphoptError:
    return GraphoptError(f"partition {step.name!r} failed in onnxruntime: {first_line(exc)}")


def _direct(step: Step | None, spec: PlainFeeds | None, mapped: OpenedFile | None, path: str):
    """run()'s shortcut for one partition fed plainly its inputs (plain_feeds.plain): feeds ->
    outputs, or None when the feeds need the full checks. The general path's frames and checks
    cost 1.5 µs more a call on zoo/tiny (a 60–125 µs run) and ~10 µs on a 0.5 ms GPT-2 at open
    dims, since its kernels evict the interpreter's data from the caches."""
    if step is None or spec is None:
        return None
    call, outputs = step.call, step.outputs
    binding = getattr(call, "binding", None)
    run = binding.run if binding is not None else None  # without call's own frame
    unchanged = mapped.check_unchanged if mapped is not None else None

    def direct(feeds: Any) -> dict[str, Any] | None:
        if not plain(feeds, spec):
            return None
        if unchanged is not None:
            try:
                unchanged()
            except OSError:  # its file closed by a close() on another thread
                raise _closed(path) from None
        try:
            results = run(outputs, feeds, None) if run is not None else call(outputs, feeds)
            return dict(zip(outputs, results))
        except GraphoptError:
            raise
        except Exception as exc:  # onnxruntime's, as in _call
            raise _failed(step, exc) from None

    return direct


def _outside_graphopt() -> int:
    """The warnings stacklevel of the first caller outside the graphopt package: the user's
    line that loaded the artifact, through graphopt.load or OmSession alike."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _closed(path: str) -> GraphoptError:
    return GraphoptError(f"{path}: the session was closed; load the artifact again to run it")


def _reverifier(artifact: OmArtifact):
    """The weights blobs' check, through a weak reference: the file holds it, and a cycle
    through the artifact would keep a dropped session's file open until a collection."""
    held = weakref.ref(artifact)

    def reverify() -> None:
        found = held()
        if found is not None:
            found.verify_weights(max(1, cpu_count() - 1))

    return reverify


def _copy_of(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.copy()
    return copy.deepcopy(value)  # a sequence or map fed through


def _reopened(path: str, options: dict, members: dict | None = None) -> "OmSession":
    """An unpickled OmSession: the artifact at `path` loaded with the original's options,
    refused when the file there is no longer the artifact the original ran (`members`, its
    manifest's checksums): a worker would otherwise run another model under the same name."""
    session = OmSession(path, **options)
    if members is not None and session._artifact.manifest["members"] != members:
        session.close()
        raise ArtifactError(f"{path}: holds another artifact than the session that was "
                            "pickled or copied (replaced since it was loaded); load it again "
                            "to run the new one")
    return session


def _typed(artifact: OmArtifact, entries: list[dict]) -> list[dict]:
    """A copy of signature entries in which those of values that are not tensors (a sequence,
    a map, an optional), which the manifest records without a dtype or shape, have their
    "type" (and "element") from the partition models."""
    entries = _copied(entries)
    untyped = {e["name"]: e for e in entries if e["dtype"] is None}
    for name in artifact.execution_order if untyped else ():
        graph = artifact.models.parse(name).graph
        for info in (*graph.input, *graph.output):
            entry = untyped.pop(info.name, None)
            if entry is not None:
                entry.update({key: value for key, value in typed_entry(info).items()
                              if key in ("type", "element")})
    return entries


def _copied(value: Any) -> Any:
    """A copy of manifest data (dicts, lists, scalars); copy.deepcopy costs ~10× more."""
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copied(item) for item in value]
    return value


def _opened_profiles(artifact: OmArtifact, names: list[str] | None) -> list[dict]:
    """The artifact's profiles to open sessions for: all, or those `names` lists."""
    if names is None:
        return list(artifact.profiles)
    if isinstance(names, str) or not names or not all(isinstance(n, str) for n in names):
        raise OptionError(f"profiles must be a non-empty list of profile names, not {names!r}")
    known = [p["name"] for p in artifact.profiles]
    if not known:
        raise OptionError(f"{artifact.path} has no shape profiles to choose from")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise OptionError(f"{artifact.path} has no shape profile {unknown[0]!r} "
                          f"(profiles: {', '.join(known)})")
    return [p for p in artifact.profiles if p["name"] in names]


class _Program:
    """The sessions of one plan (the artifact's, or one shape profile's) in execution order,
    and which of them each set of wanted tensors needs."""

    def __init__(self, steps: list[Step], input_names: list[str], outputs: list[dict],
                 profile: str | None = None) -> None:
        self.steps = tuple(steps)
        self.profile = profile  # the shape profile's name, if the artifact has profiles
        self._outputs = [o["name"] for o in outputs]
        # A graph output may be a graph input passed straight through, so inputs count as producible.
        self._producible = {t for step in steps for t in step.outputs} | set(input_names)
        # The plan for all outputs, computed once: run() is on the serving hot path.
        self.default_plan = (self._outputs, self.plan(self._outputs))
        # One partition that takes exactly the checked feeds and returns exactly the outputs:
        # run() hands it the feeds as they are and zips its results (a few µs a call).
        step = steps[0] if len(steps) == 1 else None
        self.single = step if step is not None and set(step.inputs) == set(input_names) \
            and len(step.inputs) == len(input_names) and step.outputs == self._outputs else None

    def plan(self, wanted: list[str]) -> list[Step]:
        """The partitions the wanted tensors depend on, in execution order."""
        for name in wanted:
            if name not in self._producible:
                between = sorted({t for step in self.steps for t in step.outputs}
                                 - set(self._outputs))
                also = (f"; tensors passed between partitions may be named too: "
                        f"{', '.join(between[:8])}{', …' if len(between) > 8 else ''}"
                        if between else "")
                raise OptionError(f"unknown output {name!r}; the model's outputs are: "
                                  f"{', '.join(self._outputs)}{also}")
        needed = set(wanted)
        chosen = []
        for step in reversed(self.steps):
            if needed.intersection(step.outputs):
                chosen.append(step)
                needed.update(step.inputs)
        return chosen[::-1]


class OmSession:
    """An executable .om: `run(feeds)` runs the partitions in execution order. An artifact with
    shape profiles holds one set of sessions per profile, and each run takes the profile its
    input shapes match.

    Safe to share between threads: `run` keeps its state in locals, and onnxruntime's
    InferenceSession.run is thread-safe. A pickled session (a multiprocessing worker's) loads
    the artifact again from its path, with the same options.

    The weights are mapped from the artifact file: replace a loaded .om only by renaming a new
    file over it (graphopt.save does), never by rewriting it in place.
    """

    def __init__(
        self,
        path_or_artifact: str | os.PathLike | OmArtifact,
        *,
        intra_op_num_threads: int | None = None,
        optimization_level: str | None = None,
        inter_op_num_threads: int | None = None,
        session_config: Mapping[str, str] | None = None,
        profile_dir: str | os.PathLike | None = None,
        profiles: list[str] | None = None,
    ) -> None:
        # Each partition (its manifest entry) runs at `optimization_level` if given, else at the
        # level its compile recorded (work graphopt did offline need not be redone at every
        # start), else "all"; and without weight pre-packing where its compile found none pays.
        def options(part: dict | None) -> ort.SessionOptions:
            level = part.get("optimization_level") if part else None
            made = session_options(intra_op_num_threads, optimization_level or level or "all",
                                    inter_op_num_threads, session_config)
            if part and skips_prepacking(part, session_config):
                made.add_session_config_entry(DISABLE_PREPACKING, "1")
            return made

        options(None)  # bad options fail before any file is read
        self._closed = False
        # What a pickled session reopens from in another process (multiprocessing workers).
        self._reopen = dict(intra_op_num_threads=intra_op_num_threads,
                            optimization_level=optimization_level,
                            inter_op_num_threads=inter_op_num_threads,
                            session_config=dict(session_config or {}), profiles=profiles)
        # `graphopt profile`: onnxruntime writes one chrome trace per partition into this dir.
        self._profile_dir = None if profile_dir is None else os.fspath(profile_dir)
        artifact = path_or_artifact
        # A session closes the file only of an artifact it loaded itself: two sessions made
        # from one OmArtifact share its file, and one's close() broke the other's runs.
        self._owns_file = not isinstance(artifact, OmArtifact)
        if self._owns_file:
            artifact = load_om(artifact, defer_checks=True)
        elif artifact.file is not None and artifact.file.closed:
            raise ArtifactError(f"{artifact.path}: its file was closed with the session that "
                                "loaded it: load the path again")
        # The partitions' and weights blobs' sums: at once for a small artifact, else on a
        # second thread while onnxruntime builds the sessions, which the first run (and
        # `artifact`) waits for.
        self._pending: DeferredCheck | None = deferred_check(artifact)
        # The artifact whose weights onnxruntime maps, held open since load_om: a run can tell
        # that it was rewritten in place (its sessions would read the new bytes as the old
        # weights). Renaming a new file over the path leaves it intact, and the sessions with it.
        self._mapped = artifact.file
        if self._mapped is not None:  # a change of the inode alone: hash the mapped bytes again
            self._mapped.reverify = _reverifier(artifact)
        opened = _opened_profiles(artifact, profiles)
        views = [artifact.profile(p["name"]) for p in opened] or [artifact]
        fallback: list[str] = []
        wanted: set[str] = set()
        input_names = [e["name"] for e in artifact.inputs]
        try:
            programs = [_Program(open_steps(view, options, self._profile_dir, fallback, wanted),
                                 input_names, artifact.outputs,
                                 profile["name"] if profile else None)
                        for view, profile in zip(views, opened or [None])]
            if artifact.file is not None:  # onnxruntime found the weights by path, not by handle
                artifact.file.check_still_at_path()
        except Exception:  # a partition's bytes flipped: onnxruntime's errors are any kind
            if self._pending is not None:
                self._pending.wait()  # a failed checksum explains a refused partition best
            raise
        if fallback:
            notice(
                f"{' or '.join(sorted(wanted))} not installed: {', '.join(fallback)} "
                "run on the CPU provider as a functional stand-in",
                RuntimeWarning,
                stacklevel=_outside_graphopt(),
            )
        self._artifact = artifact
        self._inputs = _typed(artifact, artifact.inputs)
        self._outputs = _typed(artifact, artifact.outputs)
        self._expected = {e["name"]: (e, numpy_dtype(e["dtype"])) for e in self._inputs}
        # Fully static input shapes, compared as one tuple: run() is on the serving hot path.
        self._static_shapes = {e["name"]: tuple(e["shape"]) for e in self._inputs
                               if e["shape"] is not None
                               and all(isinstance(d, int) for d in e["shape"])}
        self._shared_dims = shared_dims(self._inputs)
        # Inputs whose ids, or a dim counting positions, index a 4-bit embedding table, which
        # would return zeros for an id out of range where the original's Gather refuses it
        # (index_bounds).
        self._indexed = [(e["name"], e[INDEX_ROWS]) for e in self._inputs if INDEX_ROWS in e]
        self._counted = [(e["name"], axis, rows) for e in self._inputs
                         for axis, rows in e.get(INDEX_DIMS, ())]
        # Feeds that are plainly the declared tensors skip the general checks.
        self._plain = plain_feeds(self._expected, self._shared_dims)
        self._programs = programs
        self._program = programs[0]
        self._opened = opened
        # Every profile goes to the matcher: one this session did not open is named as such.
        plans = {program.profile: program for program in programs}
        self._matcher = (ProfileMatcher(input_names, [(p, plans.get(p["name"]))
                                                      for p in artifact.profiles])
                         if artifact.profiles else None)
        # Outputs that are graph inputs: returned as copies, as onnxruntime 1.24 and later
        # return them (1.23 hands back the feed's own buffer: writing to it changed the feed).
        self._passed_through = [e["name"] for e in self._outputs if e["name"] in self._expected]
        self._direct = (_direct(self._program.single, self._plain, self._mapped,
                                artifact.path)
                        if self._matcher is None and not self._indexed and not self._counted
                        and not self._passed_through else None)

    def __reduce__(self):
        # onnxruntime sessions do not pickle: the copy loads the artifact again from its path.
        if self._closed:  # a copy would come back open, which the closed one could not run
            raise _closed(self._artifact.path)
        return _reopened, (self._artifact.location, self._reopen,
                           self._artifact.manifest["members"])

    def close(self) -> None:
        """Release the onnxruntime sessions and the artifact file now rather than when the
        session is collected; `run` refuses afterwards. Closing again does nothing."""
        if self._closed:
            return
        self._closed = True
        self._direct = None
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.finish()  # it reads through the file about to be closed
        self._programs, self._program, self._matcher = [], None, None
        if self._mapped is not None and self._owns_file:
            self._mapped.close()
        self._mapped = None

    def __repr__(self) -> str:
        """One line: the artifact, its signature, partitions and profiles (not the sessions)."""
        def signature(entries: list[dict]) -> str:
            return ", ".join(f"{e['name']}: {describe(e)}" for e in entries)

        if self._closed:
            state = "closed"
        else:  # the partitions of the first profile, which every profile cuts alike or nearly
            state = f"partitions {', '.join(step.name for step in self._program.steps)}"
        if self._opened:
            state += f", {profiles_count(len(self._opened))}"
        return (f"<OmSession {self._artifact.path!r}: ({signature(self._inputs)}) -> "
                f"({signature(self._outputs)}), {state}>")

    def __enter__(self) -> "OmSession":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _file_unchanged(self) -> None:
        """The mapped artifact's in-place-rewrite check (OpenedFile.check_unchanged), which a
        close() on another thread may overtake: its closed file then says the session was
        closed, not EBADF."""
        mapped = self._mapped
        if mapped is None:
            return
        try:
            mapped.check_unchanged()
        except OSError:
            self._check_open()
            raise

    def _check_open(self) -> None:
        if self._closed:
            raise _closed(self._artifact.path)

    @property
    def _steps(self) -> list[Step]:
        """Every partition's session, of every profile."""
        return [step for program in self._programs for step in program.steps]

    def end_profiling(self) -> dict[str, str]:
        """Stop profiling (sessions made with `profile_dir`): each partition's trace file."""
        return {step.name: step.session.end_profiling() for step in self._steps}

    def profiling_starts_ns(self) -> dict[str, int]:
        """When each partition's profiler clock started (ns since the epoch): its trace's
        times count from there."""
        return {step.name: step.session.get_profiling_start_time_ns() for step in self._steps}

    @property
    def artifact(self) -> OmArtifact:
        """The loaded artifact, once its checksums passed (ArtifactError otherwise)."""
        self._verified()
        return self._artifact

    def _fixed_inputs(self) -> list[str]:
        """The source's inputs this artifact fixed, read from its details on the error path
        only (a run never reads them); none when the details cannot be read. Not through
        `artifact`, which waits for the weights' sums: the details check their own."""
        from graphopt.source_marks import extra_fixed_inputs

        try:
            return extra_fixed_inputs(self._artifact.extra)
        except GraphoptError:
            return []

    def _verified(self, pending: DeferredCheck | None = None) -> None:
        """Wait for the deferred checksums (`pending`, as a run read them when it started; by
        default the session's); ArtifactError, on every call, if a member was tampered with."""
        pending = pending or self._pending  # read once: another thread may clear it meanwhile
        if pending is not None:
            pending.wait()
            if self._pending is pending:
                self._pending = None

    @property
    def inputs(self) -> list[dict]:
        """The feeds `run` expects: [{"name", "dtype", "shape"}] (a copy); a value that is not
        a tensor also has its "type" (`seq(float32)`) and, for a sequence or optional of
        tensors, the "element" ({"dtype", "shape"}) it holds."""
        return _copied(self._inputs)

    @property
    def outputs(self) -> list[dict]:
        """What `run` returns by default: [{"name", "dtype", "shape"}] (a copy), typed as
        `inputs` are."""
        return _copied(self._outputs)

    @property
    def profiles(self) -> list[dict]:
        """The shape profiles this session opened (all, unless `profiles` chose some), the
        artifact's order kept: [{"name", "dims", "inputs"}] ([] without)."""
        types = {e["name"]: e for e in self._inputs if "type" in e}
        return [{"name": p["name"], "dims": _copied(p["dims"]),
                 "inputs": [{**_copied(types.get(e["name"], {})), **_copied(e)}
                            for e in p["inputs"]]}
                for p in self._opened]

    def profile_for(self, feeds: Mapping[str, Any]) -> str | None:
        """The name of the profile `run(feeds)` would take (None without profiles);
        GraphoptError when the feeds fit the signature but no profile."""
        self._check_open()
        env = self._check_feeds(feeds)
        if self._matcher is None:
            return None
        return self._matcher.select(env).profile

    @property
    def providers(self) -> dict[str, list[str]]:
        """The onnxruntime providers each partition actually got."""
        self._check_open()
        return {step.name: step.session.get_providers() for step in self._steps}

    def run(
        self, feeds: Mapping[str, Any], output_names: list[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run the artifact; returns the requested outputs (default, or an empty list, as
        onnxruntime takes it: all) by name.

        `output_names` may also name tensors passed between partitions, which helps debugging.
        Bad feeds raise InputError (a GraphoptError) naming the input.
        """
        if isinstance(output_names, (list, tuple)) and not output_names:
            # onnxruntime's run([], feeds) returns every output: a list a pipeline built
            # empty had returned {} here, without a word.
            output_names = None
        direct = self._direct
        # Read once: a close() on another thread clears it, and a run under way must still
        # wait for the check it started under, or outputs of tampered weights would leave.
        pending = self._pending
        if direct is not None and output_names is None and pending is None:
            outputs = direct(feeds)
            if outputs is not None:
                return outputs
        self._file_unchanged()
        self._check_open()
        if pending is None:
            return self._run(feeds, output_names)
        # The first runs overlap the checksums still being computed (onnxruntime releases the
        # GIL while it runs), but nothing computed from unverified bytes leaves: a run that
        # fails on a tampered member reports the failed checksum, not the symptom.
        try:
            results = self._run(feeds, output_names)
        except GraphoptError:
            self._verified(pending)
            raise
        self._verified(pending)
        return results

    def _run(self, feeds: Mapping[str, Any],
             output_names: list[str] | None) -> dict[str, np.ndarray]:
        env = self._check_feeds(feeds)
        for name, rows in self._indexed:
            check_ids(name, env[name], rows)
        for name, axis, rows in self._counted:
            check_dim(name, env[name], axis, rows)
        program, matcher = self._program, self._matcher
        if self._closed:  # by a close() on another thread since run() began
            raise _closed(self._artifact.path)
        program = program if matcher is None else matcher.select(env)
        if output_names is None and program.single is not None:
            step = program.single
            outputs = dict(zip(step.outputs, _call(step, env)))
            for name in self._passed_through:
                outputs[name] = _copy_of(outputs[name])
            return outputs
        if output_names is None:
            wanted, steps = program.default_plan
        else:
            if isinstance(output_names, str):  # list("logits") would ask for 'l', 'o', …
                raise OptionError(f"output_names must be a list of names, not the string "
                                  f"{output_names!r} (write [{output_names!r}])")
            try:
                wanted = list(output_names)
            except TypeError:  # 3, None inside a caller's variable: not a collection at all
                raise OptionError(f"output_names must be a list of names, not "
                                  f"{type(output_names).__name__}") from None
            steps = program.plan(wanted)
        for step in steps:
            results = _call(step, {name: env[name] for name in step.inputs})
            env.update(zip(step.outputs, results))
        outputs = {name: env[name] for name in wanted}
        for name in outputs.keys() & self._expected.keys():
            # A graph input asked for as an output: a copy, as onnxruntime returns, not the
            # caller's own array (writing to the result would change the feed).
            outputs[name] = _copy_of(outputs[name])
        return outputs

    def _check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        if self._plain is not None and plain(feeds, self._plain):
            return dict(feeds)  # run() adds partition outputs to its env
        if not isinstance(feeds, Mapping):
            raise InputError(f"feeds must map input names to arrays, not {type(feeds).__name__}")
        for name in feeds:
            if name not in self._expected:
                raise unknown_input(name, self._expected, self._fixed_inputs())
        env: dict[str, Any] = {}
        for name, (entry, dtype) in self._expected.items():
            if name not in feeds:
                if is_optional(entry):  # left out is empty, as onnxruntime takes it
                    env[name] = None
                    continue
                raise InputError(f"missing input {name!r} ({describe(entry)})")
            value = feeds[name]
            if "type" in entry:  # a sequence, map or optional: onnxruntime takes it as it is
                env[name] = fitted_value(entry, value)
                continue
            array = as_array(name, value, dtype)
            if entry["dtype"] == "string":
                ok = array.dtype.kind in "OU"
                check_strings(array, f"input {name!r}")
                array = strings_for_onnxruntime(array)
            elif dtype is not None and same_bits(array, dtype):  # bfloat16 read from an .npz
                array, ok = array.view(dtype), True
            else:
                ok = dtype is None or array.dtype == dtype
            if not ok:
                raise dtype_mismatch(f"input {name!r}", array, dtype, entry)
            shape = entry["shape"]
            if shape is not None and array.shape != self._static_shapes.get(name):
                if array.ndim != len(shape):
                    raise InputError(
                        f"input {name!r} has rank {array.ndim} (shape {list(array.shape)}), "
                        f"expected rank {len(shape)}: {describe(entry)}"
                    )
                for axis, (got, want) in enumerate(zip(array.shape, shape)):
                    if isinstance(want, int) and got != want:
                        raise InputError(
                            f"input {name!r} has shape {list(array.shape)}, expected {describe(entry)} "
                            f"(dim {axis} must be {want})"
                        )
            env[name] = array
        if self._shared_dims:  # most models name no dim twice: nothing to check per run
            clash = shared_dim_clash(self._shared_dims, {
                name: shape for name, value in env.items()
                for shape in [fed_shape(self._expected[name][0], value)] if shape is not None})
            if clash:
                raise InputError(clash)
        return env
