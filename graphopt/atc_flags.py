"""Hints for ATC's and AOE's spellings of flags (`--input_shape=…`), which argparse reports as
unrecognized: what graphopt calls the same thing, or why it needs none."""

from __future__ import annotations

import argparse

# ATC's --json=FILE, --mode=1's output; `inspect --json` is a switch, which argparse reports as
# given an "ignored explicit argument".
JSON_FILE = ("ATC's --mode=1 output file; graphopt inspect x.om --json --nodes -o x.json here "
             "(graphopt atc takes the atc line as it is)")

# ATC/AOE flags whose graphopt counterpart is not the same name with dashes.
ATC_ONLY = {
    "--soc_version": "ATC's chip; --target here (ascend310, ascend310b, ascend910b, or a "
                     "profile file)",
    "--framework": "ATC's; graphopt reads ONNX only",
    "--model": "ATC's; the model is the first argument here (graphopt atc takes an atc "
               "command line as it is)",
    "--precision_mode": "ATC's; --precision here (force_fp16: fp16, allow_mix_precision: "
                        "mixed-fp16, must_keep_origin_dtype: keep)",
    "--dynamic_batch_size": "ATC's; --dynamic-dims \"batch:1,2,4\" here",
    "--dynamic_image_size": "ATC's; --dynamic-dims, listed, here: "
                            "\"x[2]=224,x[3]=224;x[2]=448,x[3]=448\"",
    "--input_format": "ATC's; ONNX inputs are NCHW, or NHWC where the model says so",
    "--log": "ATC's; errors are one line here, and -q prints nothing else",
    "--op_select_implmode": "ATC's; kernel choice is onnxruntime's here: drop it",
    "--optypelist_for_implmode": "ATC's; kernel choice is onnxruntime's here: drop it",
    "--op_precision_mode": "ATC's; kernel choice is onnxruntime's here: drop it",
    "--enable_small_channel": "ATC's; kernel choice is onnxruntime's here: drop it",
    "--allow_hf32": "ATC's; float32 stays float32 here: drop it",
    "--modify_mixlist": "ATC's; --precision-allow and --precision-deny take op types for "
                        "--precision mixed-fp16 here",
    "--customize_dtypes": "ATC's; --keep-dtype keeps named nodes or OpType::X in float32 here",
    "--compression_optimize_conf": "ATC's; --quantize int8 with --calibration quantizes here",
    "--input_shape_range": "ATC's; -1 in --input-shape with --dynamic-dims lists the sizes to "
                           "compile here",
    "--is_output_adjust_hw_layout": "ATC's; outputs keep the model's layout here: drop it",
    "--buffer_optimize": "ATC's; the memory plan is graphopt's own here: drop it",
    "--op_debug_level": "ATC's; graphopt optimize --dump-dir writes the IR after each pass",
    "--job_type": "AOE's; graphopt tune --job op is its 2, --job subgraph its 1",
    # Its values are ATC's (a value per -1 dim of --input_shape), not --dynamic-dims' own.
    "--dynamic_dims": "ATC's, with --input_shape's -1 dims (graphopt atc takes the line as it "
                      "is); --dynamic-dims \"DIM:V1,V2\" names the model's own dims here",
    "--check_report": "ATC's; the compile's notes say what it changed and refused, and "
                      "graphopt partition shows each op's device and fallback reason",
    "--singleop": "ATC's single-op compile; graphopt compiles whole ONNX models",
    "--display_model_info": "ATC's; graphopt inspect x.om shows the artifact",
    "--dump_mode": "ATC's; graphopt optimize --dump-dir writes the IR after each pass",
    "--debug_dir": "ATC's; graphopt optimize --dump-dir writes the IR after each pass",
    "--op_debug_config": "ATC's; kernels are onnxruntime's here: drop it",
    "--op_compiler_cache_mode": "ATC's; no kernels are compiled here: drop it",
    "--op_compiler_cache_dir": "ATC's; no kernels are compiled here: drop it",
    "--host_env_os": "ATC's; the .om runs wherever graphopt's runtime and onnxruntime do: "
                     "drop it",
    "--host_env_cpu": "ATC's; the .om runs wherever graphopt's runtime and onnxruntime do: "
                      "drop it",
    "--sparsity": "ATC's; graphopt has no structured sparsity: drop it",
    "--is_input_adjust_hw_layout": "ATC's; inputs keep the model's layout here: drop it",
    "--disable_reuse_memory": "ATC's; the .om's memory plan is recorded for inspection, and "
                              "onnxruntime allocates as it runs: drop it",
    "--enable_single_stream": "ATC's; partitions run one after another here: drop it",
    "--auto_tune_mode": "ATC's; graphopt tune tunes tilings and fusion decisions "
                        "(--tuning-db applies them)",
    "--enable_compress_weight": "ATC's; --quantize int4 stores MatMul weights in 4 bits here",
    "--compress_weight_conf": "ATC's; --quantize int4 stores MatMul weights in 4 bits here",
    "--external_weight": "ATC's; the .om holds its weights, which onnxruntime maps from it",
    "--status_check": "ATC's; kernels are onnxruntime's here: drop it",
    "--oo_level": "ATC's; -O0 to -O3 here (graphopt passes lists what each runs)",
    "--input_hint_shape": "ATC's; -1 in --input-shape with --dynamic-dims lists the sizes to "
                          "compile here",
    "--deterministic": "ATC's; onnxruntime's CPU kernels give the same result run after run",
    "--virtual_type": "ATC's; graphopt has no virtual-device mode: drop it",
    "--weight": "ATC's, for Caffe weights; graphopt reads ONNX only",
    "--op_name_map": "ATC's; graphopt reads ONNX only",
    "--mode": "ATC's; its --mode=1 (a model as JSON) is graphopt inspect x.om --json --nodes "
              "-o x.json, its --mode=6 graphopt inspect x.om (graphopt atc takes the atc line "
              "as it is)",
    "--om": "ATC's --mode's input; graphopt inspect takes the .om as its argument",
    "--json": JSON_FILE,
    "--atomic_clean_policy": "ATC's; onnxruntime allocates and clears memory as it runs: "
                             "drop it",
    "--core_type": "ATC's; a target profile's engines decide where ops run here "
                   "(graphopt partition shows it): drop it",
    "--aicore_num": "ATC's; a target profile's core count prices the kernels here: drop it, "
                    "or compile for a profile file with fewer cores (graphopt optimize "
                    "--target my_chip.json)",
    "--op_bank_path": "ATC's, for AOE's tuned kernels; --tuning-db applies graphopt tune's "
                      "knowledge base here",
    "--mdl_bank_path": "ATC's, for AOE's tuned subgraphs; --tuning-db applies graphopt tune's "
                       "knowledge base here",
    "--enable_scope_fusion_passes": "ATC's, for TensorFlow scopes; graphopt reads ONNX only, "
                                    "and its fusions run by default (graphopt passes lists "
                                    "them)",
    "--shape_generalized_build_mode": "ATC's; -1 in --input-shape keeps a dim dynamic here, "
                                      "and --dynamic-dims compiles listed sizes",
}


def atc_hints(parser: argparse.ArgumentParser, unrecognized: list[str]) -> list[str]:
    """For each argument in ATC's or AOE's spelling that `parser` does not know, how graphopt
    says it (graphopt atc's parser knows ATC's flags)."""
    known = {flag for action in parser._actions for flag in action.option_strings}
    hints = []
    for text in unrecognized:
        if text == "atc" and parser.prog.endswith(" atc"):  # `atc …` pasted after graphopt atc
            hints.append("atc is the command already: graphopt atc --model=…")
            continue
        flag = text.split("=", 1)[0]
        dashed = flag.replace("_", "-")
        if flag in known:
            continue
        if text == "--json" and not parser.prog.endswith(" atc"):
            # graphopt's own switch, which this command lacks: not ATC's --json=FILE
            hints.append(f"{parser.prog} prints no JSON (inspect, partition, profile, compare, "
                         "diff, bisect, targets and kb list take --json)")
        elif flag in ATC_ONLY:  # before the dashed name: --dynamic_dims' values are not ours
            hints.append(f"{flag} is {ATC_ONLY[flag]}")
        elif flag.startswith("--") and dashed != flag and dashed in known:
            hints.append(f"{flag} is {dashed} here")
        elif flag == "--target" and "--soc_version" in known:
            hints.append("--target is graphopt optimize's: an atc line names the chip with "
                         "--soc_version (Ascend310, Ascend310B1, Ascend910B1)")
        elif flag.startswith("--"):
            # As written first: graphopt atc's own flags are ATC's, with underscores.
            close = _close_option(flag.lower(), known) or _close_option(dashed.lower(), known)
            if close:  # --taget, --Target, onnxruntime's and ATC's --input for --inputs
                hints.append(f"{flag}: did you mean {close}?")
    return hints


def _close_option(flag: str, known: set[str]) -> str | None:
    """The option `flag` most likely misspells: one it is a prefix of, else the closest."""
    import difflib

    longer = sorted(k for k in known if k.startswith(flag) and k.startswith("--"))
    if len(longer) == 1 or flag in known:
        return longer[0] if longer else flag
    close = difflib.get_close_matches(flag, sorted(k for k in known if k.startswith("--")),
                                      n=1, cutoff=0.8)
    return close[0] if close else None
