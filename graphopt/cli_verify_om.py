"""--verify of an .om: the artifact as written is loaded and run before it replaces -o."""

from __future__ import annotations

from graphopt.errors import StandInError, VerificationError


def artifact_check(args):
    """The check atomic_write runs on the written .om before it replaces `-o`: the source model
    and the artifact, loaded by graphopt's runtime, on --verify's inputs, judged by the rule
    --verify applies. The compiled model was verified already, but not what only the artifact
    holds: its signature, its partitions' sessions (an exporter's stale output declaration
    made a verified compile into an .om that did not load). The check's `measured` holds the
    artifact's largest error per output, for the summary: the compiled model's own figure is
    of the compiled graph, the artifact's of its sessions (their levels and layouts), both on
    one onnxruntime thread; its `notes`, why an error past rtol/atol was accepted (outputs
    after a TopK that onnxruntime's own optimizer selects alike), which the summary prints
    beside that figure."""
    def check(path: str) -> None:
        from graphopt.codegen.om_read import is_om, load_om
        from graphopt.source_edits import edited_source, given_edits
        from graphopt.tools.accuracy_rule import accuracy_rule, pass_log_of_om
        from graphopt.tools.compare import compare_models

        if not is_om(path):
            return
        artifact = load_om(path)
        judge, _ = accuracy_rule(pass_log_of_om(artifact), args.rtol, args.atol)
        reference = args.model
        edits = given_edits(args)
        if edits:  # the model as the compile took it
            reference = edited_source(reference, label=args.model,
                                      input_shapes=args.input_shape, **edits)
        # The inputs given (or seeded ones at the pins), then seeded ones at every other shape
        # profile's shapes: a profile's section of the artifact (its signature, routing,
        # sessions) went unchecked but for the one those inputs fit.
        runs = [(args.inputs, args.input_shape, "")]
        profiles = artifact.manifest.get("profiles") or []
        if len(profiles) > 1:
            runs += [(None, _pins(profile), f" in shape profile {profile.get('name')}")
                     for profile in profiles]
        for inputs, shapes, where in runs:
            try:
                report = compare_models(reference, path, inputs, input_shapes=shapes, **judge,
                                        rounding=args.rtol is None and args.atol is None)
            except StandInError:
                return  # compiled for a device this machine lacks: the model was verified
            except Exception as exc:  # noqa: BLE001 - any failure to load or run the artifact
                raise VerificationError(f"--verify: {args.output} as written does not run"
                                        f"{where}: {exc}") from None
            failing = [row for row in report.outputs if not row.passed]
            if failing and _lowered_stfts(artifact):  # judged against exact STFTs, as --verify
                from graphopt.compile_verify import exact_stft_reference

                exact = exact_stft_reference(reference)
                if exact is not None:
                    report = compare_models(exact, path, inputs, input_shapes=shapes, **judge,
                                            rounding=args.rtol is None and args.atol is None)
                    failing = [row for row in report.outputs if not row.passed]
            if any(row.note and row.note.startswith("rounding") for row in report.outputs):
                check.notes.extend(n for n in report.notes
                                   if ("summation order" in n or "rounding" in n)
                                   and n not in check.notes)
            for row in report.outputs:  # against the reference that judged it
                if row.max_abs is not None:
                    check.measured[row.name] = max(row.max_abs, check.measured.get(row.name, 0))
            if failing:
                worst = ", ".join(_failure(row) for row in failing[:3])
                drawn = ("uniform pixel values, 0 to 255, for its frames"
                         if args.insert_op_conf else "standard normal values")
                seeded = ("" if inputs else f" (on seeded random inputs: {drawn}; give inputs "
                          "like the deployment's with --inputs)")
                raise VerificationError(f"--verify: {args.output} as written differs from the "
                                        f"original{where}: {worst}{seeded}; nothing written")
    check.measured = {}
    check.notes = []
    return check


def _lowered_stfts(artifact) -> bool:
    """Whether the artifact's compile lowered STFTs (-O3's LowerSTFT)."""
    return any(isinstance(entry, dict) and entry.get("pass") == "LowerSTFT"
               and sum((entry.get("rewrites") or {}).values())
               for entry in artifact.pass_log)


def _pins(profile: dict) -> dict[str, list[int]]:
    """The input shapes a profile of an .om's manifest fixes (-1 where it leaves a dim open),
    for seeded inputs that fit it."""
    return {entry["name"]: [d if isinstance(d, int) else -1 for d in entry["shape"]]
            for entry in profile.get("inputs") or ()
            if isinstance(entry, dict) and isinstance(entry.get("shape"), list)
            and not entry.get("type")}


def _failure(row) -> str:
    """A failing compare row as the error names it: how far off, in how many elements."""
    if row.max_abs is None:
        return f"{row.name} ({row.note or 'differs'})"
    count = f", {row.mismatches} element(s) beyond rtol/atol" if row.mismatches else ""
    return f"{row.name} (max abs {row.max_abs:.3g}{count})"
