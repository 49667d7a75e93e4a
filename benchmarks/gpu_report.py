"""OUT_DIR/report.md of gpu_suite.py: the machine, every command, each part's figures, the issue's targets."""

from __future__ import annotations

TIME_BUDGET = "not measured (time budget)"  # gpu_suite's status of a command the budget left no time for
TITLES = {"0": "Setup", "1": "Training step vs transformers", "2": "bertrain pretrain end to end",
          "3": "Host synchronizations in the step", "4": "LAMB vs fused AdamW", "5": "torch.compile",
          "6": "Exact resume", "7": "Where the step's time goes", "8": "Targets"}


def fmt(value, spec: str = ".3g", suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def data_wait(r: dict | None) -> str:
    """A run's data wait (the host's time fetching batches over the wall time) as a percentage; n/a unmeasured."""
    share = r and r.get("data_wait_share")
    return fmt(share and 100 * share, ".1f", "%")


def table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


def step_rows(results: dict, part: str = "1") -> dict:
    """(shape, seq) -> part 1's figures (or part 5's compiled step, "5-step"): sequences/s, speed-up over
    transformers, useful MFU."""
    return {(r["shape"], r["seq"]): dict(r, ours_seq_s=r["batch"] / r["ours"], hf_seq_s=r["batch"] / r["hf"],
                                         speedup=r["hf"] / r["ours"], mfu=r["flops"] / r["ours"] / r["peak"],
                                         hf_mfu=r["flops"] / r["hf"] / r["peak"]) for r in results.get(part, [])}


def failures(commands, part: str) -> list[str]:
    """What went wrong in a part's commands: status, log and the last lines of output; notes on the others."""
    lines = []
    for c in commands:
        if c.part != part:
            continue
        if c.note:
            lines.append(f"Note, {c.label}: {c.note}.")
        if c.status.startswith(TIME_BUDGET):
            lines.append(f"**{c.label}: {c.status}**: not started, so that the more important parts kept their time.")
        elif c.status != "ok" and not c.status.startswith("not run"):
            lines += [f"**{c.label}: {c.status}** (log: {c.log}). Last lines:", "```", c.tail or "(no output)", "```"]
    return lines


def header(state: dict, commands) -> list[str]:
    info = state.get("info") or {}
    if state["quick"]:
        gpu = "none: a CPU run of the suite (--device cpu --quick: tiny shapes, fp32). Not GPU figures."
    else:
        gpu = f"{info.get('gpu') or info.get('gpu_smi', 'n/a')} ({fmt(info.get('gpu_memory_gb'), '.0f')} GiB)"
    done = "finished" if state.get("finished") else "still running"
    lines = [f"# bertrain GPU suite: {info.get('gpu') or 'CPU'}", "", f"- GPU: {gpu}",
             f"- torch {info.get('torch', 'n/a')}, CUDA {info.get('cuda', 'n/a')}, driver {info.get('driver', 'n/a')}",
             f"- transformers {info.get('transformers', 'n/a')}, accelerate {info.get('accelerate', 'n/a')}, "
             f"tokenizers {info.get('tokenizers', 'n/a')}, Triton {info.get('triton') or 'n/a'}, Python "
             f"{info.get('python', 'n/a')}, {info.get('cores', 'n/a')} CPU cores"
             + (f", /dev/shm {info['shm_free_gib']} GiB free" if "shm_free_gib" in info else ""),
             f"- date: {info.get('date', 'n/a')}; bertrain commit {info.get('commit', 'n/a')}",
             f"- suite: `{state['argv']}`, {done} after {state.get('elapsed_s', 0):.0f} s; "
             f"scratch (data, run dirs; removed at the end): {state['scratch']}"]
    lines += ([f"- {info['error']}"] if info.get("error") else []) + (
        [f"- **ABORTED: {state['abort']}**"] if state.get("abort") else [])
    lines += ["", "## Commands", "", "Each figure's exact command (from the repository root; the suite sets "
              "PYTHONPATH=. and WANDB_MODE=disabled):", ""]
    lines += [f"{i}. part {c.part} ({TITLES[c.part]}), {c.label}: `{c.line()}`" for i, c in enumerate(commands, 1)]
    lines += ["", "## Status", ""]
    lines += table(["part", "command", "status", "seconds", "planned s (H100)", "log"],
                   [[c.part, c.label, c.status, f"{c.seconds:.1f}", "" if state["quick"] else f"{c.expect:.0f}",
                     c.log] for c in commands])
    return lines


def part1(state, commands, results) -> list[str]:
    rows = step_rows(results)
    out = ["Medians of alternated rounds, each step with its tool's AdamW (torch's fused kernel; bertrain's "
           "FusedAdamW keeps its lists between steps); useful MFU = model_step.useful_flops (MLM head at the masked "
           "positions only) / step time / the bf16 GEMM's FLOP/s in the same run (fp32 on a CPU). Last column: "
           "ours again, same model, with autocast casting each weight instead of one cast per encoder layer "
           "(`--per-weight-casts`); > 1: the default's one cast is faster.", ""]
    body = []
    for shape, seq in (tuple(key) for key in state["step_shapes"]):
        r = rows.get((shape, seq))
        body.append([shape, seq] + (["no figure: see step.log"] + [""] * 7 if r is None else [
            r["batch"], fmt(r["ours_seq_s"], ".1f"), fmt(r["hf_seq_s"], ".1f"), fmt(r["speedup"], ".2f", "x"),
            fmt(100 * r["mfu"], ".1f", "%"), fmt(100 * r["hf_mfu"], ".1f", "%"), fmt(r["peak"] / 1e12, ".3g"),
            fmt(r.get("per_weight_casts") and r["per_weight_casts"] / r["ours"], ".3f", "x")]))
    return out + table(["shape", "seq", "batch", "ours seq/s", "transformers seq/s", "speed-up", "ours useful MFU",
                        "transformers MFU", "GEMM peak TF/s", "one cast per layer vs per weight"], body)


def useful_flops_per_s(r: dict) -> float:
    """A pretrain run's useful FLOP/s: its useful MFU times the GEMM peak it was measured against."""
    return r["useful_mfu"] * r["peak_flops"]


def bare_flops_at(bare: dict, computed_padding_share: float) -> float:
    """Part 1's bare step's useful FLOP/s had it computed that share of padding."""
    return bare["flops"] / bare["ours"] * (1 - computed_padding_share)


def vs_bare(r: dict | None, bare: dict | None) -> float | None:
    """A pretrain run's useful FLOP/s / part 1's at the padding the run's encoder computed (see part 2's header):
    FLOP/s, not MFU, as the two MFUs divide by GEMM peaks measured at different times."""
    if not r or not bare or "useful_mfu" not in r or "computed_padding_share" not in r:
        return None
    return useful_flops_per_s(r) / bare_flops_at(bare, r["computed_padding_share"])


def vs_bare_same_batches(r: dict | None) -> float | None:
    """A pretrain run's useful FLOP/s / the bare step's on the run's own last batches (gpu_pretrain.py
    --bare-steps): what the loop itself costs, its batches' packing and lengths the same on both sides."""
    same = (r or {}).get("bare_same_batches")
    if not same or "useful_mfu" not in r or same.get("run_tokens", same["real_tokens"]) != same["real_tokens"]:
        return None  # not measured, or not the run's batches (their real tokens differ from its last steps')
    return useful_flops_per_s(r) / same["useful_flops_per_s"]


def pretrain_row(run: dict, r: dict | None, bare: dict | None) -> list:
    if r is None or "useful_mfu" not in r:
        status = "no figure: see the log" if r is None else f"exit {r.get('exit_code')}, figures incomplete (log)"
        return [run["label"], run["seq"], run["batch"], status] + [""] * 13
    memory = r.get("peak_memory_gb", r.get("peak_rss_gb"))
    computed = r.get("computed_padding_share")
    bare_at = bare and computed is not None and bare_flops_at(bare, computed)
    steps = f"last {r['measured_steps']} of {r['steps_run']}" + (" (time limit)" if r.get("time_limited") else "")
    return [run["label"], run["seq"], run["batch"], steps, fmt(r["tokens_per_s"], ",.0f"),
            fmt(r["samples_per_s"], ".1f"), fmt(100 * r["useful_mfu"], ".1f", "%"),
            fmt(useful_flops_per_s(r) / 1e12, ".1f"),
            f"{fmt(100 * r['padding_share'], '.1f', '%')} / {fmt(computed and 100 * computed, '.1f', '%')}",
            fmt(bare_at and bare_at / 1e12, ".1f"), fmt(vs_bare(r, bare), ".2f"), fmt(vs_bare_same_batches(r), ".2f"),
            data_wait(r), r.get("loader_workers", ""), fmt(host_share(r), ".2f"), fmt(memory, ".1f", " GiB"),
            fmt(r["wall_s"], ".0f")]


def host_share(r: dict) -> float | None:
    """The host's median time in train_step over the step's time: near 1, the host is the limit."""
    host = r.get("host_train_step_ms_median")
    return host / r["step_ms"] if host is not None and r.get("step_ms") else None


def part2(state, commands, results) -> list[str]:
    by_label = {r["label"]: r for r in results.get("2", [])}
    bare = step_rows(results)
    runs = [run for run in state["runs"] if "compile" not in run["label"]]
    out = ["`bertrain pretrain` (in-process, benchmarks/gpu_pretrain.py; eager: `train.compile: auto` compiles "
           "runs of 5,000 steps or more, part 5 the compiled loop) on synthetic documents of shuffled pydoc "
           "paragraphs prepared above by `bertrain prepare` (every run in its first epoch); figures over each run's "
           "last steps (metrics.jsonl's windows, each ending in the loop's log-time device read; a run that reached "
           "its time limit stopped itself and covers what it did). real tokens/s: non-pad tokens. useful MFU: the "
           "real tokens' FLOPs (model_step.useful_flops) against a GEMM timed after the run.", "",
           "**vs bare** compares like with like: the run's useful TFLOP/s / (part 1's at the same shape and "
           "batch x (1 - the padding share the encoder computed)). Part 1's batches have no padding; on this run's "
           "batches the bare step would compute the same padding (the padded encoder runs every position of "
           "[B, T]; the packed one, model.unpad true or auto choosing it, only the real tokens: 0% computed), so "
           "its useful FLOP/s would shrink by that share. 1.00 = the loop, its data and its packing cost nothing "
           "over the bare step; the target is >= 0.90. FLOP/s rather than MFU: the run's MFU divides by a GEMM "
           "timed after the run, part 1's by one timed between its steps (an idle GPU's clocks run higher: 11-13% "
           "on the H200). **vs bare, its batches**: the run's useful FLOP/s / the bare step's (part 1's step: "
           "forward, backward, fused AdamW, nothing else) on the run's own last batches after the run, in the same "
           "process (`gpu_pretrain.py --bare-steps`): the same packing, lengths and masks on both sides, so it is "
           "the cost of the loop alone (data, clipping, bookkeeping); vs bare also counts what shorter, packed "
           "batches change in the step itself (fixed costs such as the optimizer's over fewer tokens, the "
           "variable-length attention kernel). padding: share of the batches' positions / share of the positions "
           "the encoder computed. "
           "data wait: host time in TrainStream.next / wall time (an upper bound: the host runs ahead of the "
           "device). loader workers: data.num_workers as the run resolved it (auto: 0, batches made in the training "
           "process). host in step: the "
           "host's median time in train_step (forward and backward queued) / the step's time; near 1.00 the host is "
           "the limit, not the GPU. peak memory: torch.cuda.max_memory_allocated (on a CPU: peak RSS).", ""]
    out += table(["run", "seq", "batch", "steps", "real tokens/s", "seq/s", "useful MFU", "useful TFLOP/s",
                  "padding: batches / computed", "bare TFLOP/s at that padding", "vs bare", "vs bare, its batches",
                  "data wait", "loader workers", "host in step", "peak memory", "wall s"],
                 [pretrain_row(run, by_label.get(run["label"]), bare.get(tuple(run["bare"]))) for run in runs])
    for run in runs:  # where the loop's shortfall lies: in the loop, or in its batches' step
        r, bare_full = by_label.get(run["label"]), bare.get(tuple(run["bare"]))
        same, ratio = (r or {}).get("bare_same_batches"), vs_bare_same_batches(r)
        if ratio is None or not bare_full:
            continue
        full = bare_full["flops"] / bare_full["ours"]
        out += ["", f"{run['label']}: the bare step on the run's last {same['steps']} batches ran "
                f"{same['useful_flops_per_s'] / 1e12:.1f} useful TFLOP/s ({same['step_ms']:.1f} ms a step), "
                f"{same['useful_flops_per_s'] / full:.2f}x part 1's {full / 1e12:.1f} on unpadded batches; the loop "
                f"ran {ratio:.2f}x the former."]
    padded, unpadded = by_label.get("bert_base-512-unpad-false"), by_label.get("bert_base-512-unpad-true")
    if padded and unpadded and "samples_per_s" in padded and "samples_per_s" in unpadded:
        out += ["", f"model.unpad true vs false at the longer length: "
                f"{unpadded['samples_per_s'] / padded['samples_per_s']:.2f}x sequences/s."]
    large = bare.get(next((tuple(run["bare"]) for run in runs if run["label"] == "bert_large-128"), None))
    out += with_workers_sentence("bert_large's loop", by_label.get("bert_large-128"),
                                 by_label.get("bert_large-128-with-workers"), large, "vs bare")
    transfer = next((c for c in commands if c.label == "loader-transfer" and c.status == "ok"), None)
    if transfer:
        out += ["", "**Taking a batch** (`benchmarks/loader_transfer.py`, the synthetic data above): the training "
                "process's time per micro-batch made in-process, or received from loader workers with each tensor in "
                "a shared-memory storage of its own (the loader before `bertrain/batch_buffer.py`), in a new buffer "
                "a batch (the loader before its slots) or written into buffers each worker keeps (its slots: now), "
                "page-locked on a GPU, then its copy to the device; the workers ahead (the process sleeps between "
                "batches, as while the device runs a step).", "", "```", transfer.tail, "```"]
    return out


def part3(state, commands, results) -> list[str]:
    out = ["train_step + optimizer_step + the non-finite watch on the real loader's batches (2 micro-batches a "
           "step); the batch's arrival and the log-time read are outside. Step 1 also creates the optimizer "
           "state.", ""]
    body = []
    for r in results.get("3", []):
        if "error" in r:
            body.append([r["case"], "failed", "", "", r["error"]])
        else:
            where = "; ".join(f"{k} x{v}" for k, v in r["where"].items()) or "none"
            body.append([r["case"], r["first_step"], f"{r['later_steps']} (steps 2-{r['steps']})",
                         r["error_mode"], f"{where} ({r['method']})"])
    return out + table(["case", "syncs in step 1", "syncs after", "'error' mode step", "where"], body)


def part4(state, commands, results) -> list[str]:
    pair = lambda r, keys: " / ".join(fmt(r.get(key), ".2f") for key in keys.split())  # noqa: E731
    body = [[r.get("config"), fmt(r.get("parameters") and r["parameters"] / 1e6, ".1f", "M"), r.get("kernel"),
             fmt(r.get("kernel_vs_torch_ops"), ".1e"), pair(r, "adamw_ms fused_adamw_ms"), pair(r, "lamb_ms"),
             pair(r, "lamb_torch_ops_ms"), fmt(r.get("ratio"), ".2f", "x"), pair(r, "adamw_host_ms fused_adamw_host_ms "
             "lamb_host_ms"), f"{pair(r, 'clip_in_place_ms clip_scale_ms')}; "
             f"{pair(r, 'lamb_clip_in_place_ms lamb_clip_scale_ms')}"] for r in results.get("4", [])]
    return ["Optimizer step alone, random gradients, `found_inf` set as the loop sets it; medians of alternated "
            "rounds. kernel vs torch ops: the largest weight difference between LAMB's kernel and LAMB's torch ops "
            "after 3 steps from the same weights and gradients, over the largest weight change (float32 rounding: "
            "below 1e-4). host ms: the host's time per step without waiting for the device (near the step's time: "
            "the step is launch-bound). FusedAdamW: bertrain's (torch's kernel, its lists kept between steps); LAMB / "
            "AdamW is against torch's. clipped: the step with gradient clipping, in place as torch's clip_grad_norm_ "
            "then the step, or as the step's grad_scale (as train/step.py clips).", ""] + table(
        ["parameters of", "count", "LAMB kernel", "kernel vs torch ops", "fused AdamW ms: torch's / FusedAdamW",
         "LAMB ms", "LAMB torch ops ms", "LAMB / AdamW", "host ms: AdamW torch's / FusedAdamW / LAMB",
         "clipped ms, in place / grad_scale: AdamW; LAMB"], body) + lamb_kernels(results)


def lamb_kernels(results) -> list[str]:
    """LAMB's Triton kernel per schedule, block x warps and group size (lamb_kernels.py), against fused AdamW."""
    rows = results.get("4-kernels", [])
    if not rows:
        return []
    same = {True: "bitwise", False: "**differ**"}
    body = [[r["config"], f"**{r['error']}**", "", "", "", "", "", ""] if "error" in r else
            [r["config"], fmt(r["device_ms"], ".3f"), fmt(r["device_ratio"], ".2f", "x"), fmt(r["wall_ms"], ".3f"),
             fmt(r["wall_ratio"], ".2f", "x"), fmt(r.get("vs_default"), ".1e"), same.get(r.get("same_as_two_pass"), ""),
             "yes" if r["host_ahead"] else "no: host-bound"] for r in rows]
    return ["", f"**LAMB's kernel configurations** (`lamb_kernels.py`, {rows[0]['parameters_of']}'s parameters): "
            "device ms per step with the host ahead (as in training, where the forward and backward keep the device "
            "busy while the host queues the optimizer), wall ms as above, each against fused AdamW timed beside it; "
            "weights after 3 steps against the default's (over its change) and, for the pipelined schedule, against "
            "the two-pass kernel at the same block and warps.", ""] + table(
        ["schedule block x warps", "device ms", "/ AdamW", "wall ms", "/ AdamW", "vs default", "= two-pass",
         "host ahead"], body)


def best_lamb_kernel(results) -> dict | None:
    """The lamb_kernels.py row with the lowest device ratio, measured with the host ahead."""
    rows = [r for r in results.get("4-kernels", []) if r.get("host_ahead")]
    return min(rows, key=lambda r: r["device_ratio"], default=None)


def with_workers_sentence(whose: str, default: dict | None, with_workers: dict | None, bare: dict | None,
                          measure: str) -> list[str]:
    """A loop with loader workers against the same loop without (auto's choice), where both have figures."""
    if not vs_bare(default, bare) or not vs_bare(with_workers, bare):
        return []
    return ["", f"{whose} with {with_workers.get('loader_workers')} loader workers (the training thread pins their "
            f"batches) against {default.get('loader_workers')} (`data.num_workers: auto`): {measure} "
            f"{vs_bare(with_workers, bare):.2f} against {vs_bare(default, bare):.2f}, host in step "
            f"{fmt(host_share(with_workers), '.2f')} against {fmt(host_share(default), '.2f')}, data wait "
            f"{data_wait(with_workers)} against {data_wait(default)}."]


def part5(state, commands, results) -> list[str]:
    runs = [run for run in state["runs"] if "compile" in run["label"]]
    first = runs[0]
    eager_label = first["label"].removesuffix("-compile")  # part 2's run of the same shape
    found = {r["label"]: r for part in ("2", "5") for r in results.get(part, [])}
    eager, compiled = found.get(eager_label), found.get(first["label"])
    bare = step_rows(results, "5-step").get(tuple(first["bare"]))
    named = [(f"eager (part 2's {eager_label})", eager_label)] + [
        (", ".join(filter(None, ["train.compile=true", workers(run, found.get(run["label"]))])), run["label"])
        for run in runs]
    body = []
    for name, label in named:
        r = found.get(label)
        if r is None or "first_step_s" not in r:
            command = next((c for c in commands if c.label == label), None)
            out_of_time = command is not None and command.status.startswith((TIME_BUDGET, "timed out", "stopped"))
            body.append([name, TIME_BUDGET if out_of_time else "no figure"] + [""] * 8)
        else:
            body.append([name, fmt(r.get("first_step_s"), ".1f"), fmt(r.get("step_ms"), ".1f"),
                         fmt(r.get("tokens_per_s"), ",.0f"),
                         data_wait(r),
                         fmt(host_share(r), ".2f"), r.get("compiled_graphs", ""), r.get("graph_breaks", ""),
                         "" if r is eager else fmt(vs_bare(r, bare), ".2f"),
                         "" if r is eager else fmt(vs_bare_same_batches(r), ".2f")])
    window = f"the {first['last']} before its profiled steps" if first.get("profile") else f"the last {first['last']}"
    out = [f"{first['config']} seq {first['seq']} batch {first['batch']}, {first['steps']} steps, step time over "
           f"{window}. First step: host seconds from its first batch to the next step's (compilation "
           f"happens there; a later run finds inductor's cache). data wait, host in step: as in part 2. vs compiled "
           f"bare: the compiled loop against the compiled bare step below, as part 2's vs bare (train.compile: auto "
           f"compiles long GPU runs, so this is the loop they run; the target is >= 0.90); its batches: against the "
           f"compiled bare step on the run's own last measured batches, as part 2's. graph breaks: the "
           f"splits dynamo made while compiling, each an extra compiled call a layer (on a CPU the packed "
           f"attention's length buckets run eager, between two graphs).", ""] + table(
        ["", "first step s", "step ms", "real tokens/s", "data wait", "host in step", "graphs compiled",
         "graph breaks", "vs compiled bare", "vs compiled bare, its batches"], body)
    if compiled and eager and "first_step_s" in compiled and "step_ms" in compiled and "step_ms" in eager:
        out += ["", f"compile time ≈ {compiled['first_step_s'] - eager['first_step_s']:.1f} s (first steps' "
                f"difference); compiled step {eager['step_ms'] / compiled['step_ms']:.2f}x the eager step's speed."]
    same = (compiled or {}).get("bare_same_batches")
    if vs_bare_same_batches(compiled) is not None:
        out += ["", f"{first['label']}: the compiled bare step on the run's last {same['steps']} measured batches ran "
                f"{same['useful_flops_per_s'] / 1e12:.1f} useful TFLOP/s ({same['step_ms']:.1f} ms a step); the loop "
                f"ran {vs_bare_same_batches(compiled):.2f}x that."]
    out += with_workers_sentence("The compiled loop", compiled, next(
        (found.get(run["label"]) for run in runs[1:] if run["label"].endswith("-with-workers")), None), bare,
        "vs compiled bare")
    return out + compiled_step(state, commands, results)


def workers(run: dict, r: dict | None = None) -> str:
    """The loader workers a run had: as its figures record them, else as it sets them ("": auto, unrecorded)."""
    counts = [s.split("=", 1)[1] for s in run["sets"] if s.startswith("data.num_workers=")]
    count = (r or {}).get("loader_workers", counts[-1] if counts else None)
    return "" if count is None else f"{count} loader workers"


def compiled_step(state, commands, results) -> list[str]:
    """Part 1's bare step again with ours compiled per layer (transformers eager), beside part 1's eager row."""
    eager, compiled = step_rows(results), step_rows(results, "5-step")
    body = []
    for key, r in compiled.items():
        e = eager.get(key, {})
        body.append([key[0], key[1], r["batch"], fmt(r.get("compile_s"), ".1f"), fmt(e.get("ours_seq_s"), ".1f"),
                     fmt(r["ours_seq_s"], ".1f"), fmt(e.get("ours_seq_s") and r["ours_seq_s"] / e["ours_seq_s"], ".2f",
                                                      "x"),
                     fmt(100 * r["mfu"], ".1f", "%"), fmt(r["speedup"], ".2f", "x")])
    if not body:
        command = next((c for c in commands if c.label == "gpu_step-compile"), None)
        return ["", f"Compiled bare step: no figure ({command.status if command else 'not planned'})."]
    return ["", "The bare step of part 1 with train.compile's per-layer torch.compile (`gpu_step.py --compile`; "
            "transformers eager, timed again in this run): compile s is its first step.", ""] + table(
        ["shape", "seq", "batch", "compile s", "eager seq/s (part 1)", "compiled seq/s", "compiled / eager",
         "compiled useful MFU", "compiled vs transformers"], body)


def part6(state, commands, results) -> list[str]:
    command = next(c for c in commands if c.part == "6")
    verdict = {"ok": "PASS", "failed (exit 1)": "FAIL (losses or weights differ)"}.get(command.status, command.status)
    return [f"`--check-resume` of tiny_albert with LAMB and dropout (6 steps, stop at 3, resume to 6, fresh "
            f"processes): **{verdict}**", "", "```", command.tail or "(no output yet)", "```"]


def part7(state, commands, results) -> list[str]:
    r = (results.get("7") or [None])[0]
    if r is None:
        return ["no figure: see step.log"]
    total = r["total_ms"]
    groups = sorted(r["groups_ms"].items(), key=lambda item: -item[1])
    ops = [(f"`{name}`", ms) for name, ms in sorted(r["ops_ms"].items(), key=lambda item: -item[1])[:12]]
    return ([f"`benchmarks/gpu_profile.py`: torch.profiler over {r['shape']} seq {r['seq']} batch {r['batch']} "
             f"training steps (forward, backward, fused AdamW), the ops' self device time: {total:.2f} ms a step.",
             ""] + table(["group", "ms per step", "share"], [[g, fmt(ms, ".2f"), fmt(100 * ms / total, ".1f", "%")]
                                                             for g, ms in groups]) + [""]
            + table(["op", "ms per step", "share"], [[n, fmt(ms, ".2f"), fmt(100 * ms / total, ".1f", "%")]
                                                     for n, ms in ops])
            + device_waits(r.get("gaps"), "the bare step's (3 steps after a sync, as part 1 times them)")
            + loop_against_bare(results, r)
            + compiled_loop_against_bare(results)
            + [line for part in ("2", "5") for run in results.get(part, []) for line in host_segments(run)])


# the loop's marked points (gpu_pretrain.py --marks) with the bare step's point that ends the same work, if any
SEGMENTS = [("batch taken", None), ("forward queued", "forward end"), ("backward end", "backward end"),
            ("norm end", None), ("train_step end", None), ("optimizer start", None),
            ("optimizer end", "optimizer end"), ("step end", "step end")]


def host_segments(run: dict) -> list[str]:
    """A marked loop's host time in each part of its step, and the host's lead at its end, beside the bare step's on
    the run's batches (gpu_pretrain.py --marks)."""
    loop, bare = run.get("marks"), (run.get("bare_same_batches") or {}).get("marks")
    if not loop:
        return []

    def segments(marked: dict | None) -> dict:
        """point → (host ms since the point before, lead, lowest lead); empty unless the steps reached "step end"."""
        out, before = {}, 0.0
        for row in (marked or {}).get("points", [])[1:]:
            out[row["point"]] = (row["host_ms"] - before, row["lead_ms"], row["lowest_lead_ms"])
            before = row["host_ms"]
        return out if "step end" in out else {}

    ours, theirs = segments(loop), segments(bare)
    body = []
    for point, bare_point in SEGMENTS:
        if point in ours:
            host, lead, lowest = ours[point]
            other = theirs.get(bare_point) if bare_point else None
            body.append([point, fmt(host, ".3f"), fmt(lead, ".3f"), fmt(lowest, ".3f"),
                         fmt(other and other[0], ".3f"), fmt(other and other[1], ".3f")])
    whole = [sum(host for host, _, _ in side.values()) if side else None for side in (ours, theirs)]  # to "step end"
    body.append(["whole step", fmt(whole[0], ".3f"), "", "", fmt(whole[1], ".3f"), ""])
    return ["", f"**{run['label']}: the host's time in each part of the loop's step** (`gpu_pretrain.py --marks`: the "
            f"host's clock and a CUDA event at each point, no profiler; medians over {loop['steps']} steps from step "
            f"{loop.get('first', '?')}; ms). The host's lead is how far the device was behind it there: near 0 (under "
            f"0.05 ms), the device waited for the host. Beside it, the bare step on the run's batches"
            + (f" ({bare['steps']} steps)" if bare else " (not marked)") + ": its forward segment holds zero_grad, "
            "its optimizer segment starts at the backward's end.", ""] + table(
        ["segment (ends at)", "loop host ms", "loop lead ms", "lowest lead ms", "bare host ms", "bare lead ms"], body)


def compiled_loop_against_bare(results) -> list[str]:
    """Part 5's profiled compiled loop against the compiled bare step's profile (gpu_profile.py --compile)."""
    bare = (results.get("7-compile") or [None])[0]
    if bare is None:
        return ["", "**The compiled loop's step against the compiled bare step**: not measured (the profile-compile "
                "command did not run, or failed: step.log)."]
    return loop_against_bare(results, bare, compiled=True)


def loop_against_bare(results, bare: dict, compiled: bool = False) -> list[str]:
    """Part 2's profiled loop steps (gpu_pretrain.py --profile) against the bare step above, per real token; or,
    `compiled`, part 5's compiled loop's against the compiled bare step's (part 5's step time)."""
    run_part, step_part = ("5", "5-step") if compiled else ("2", "1")
    run = next((r for r in results.get(run_part, []) if r.get("profile")), None)
    if run is None:
        return []
    loop, bare_tokens = run["profile"], bare["batch"] * bare["seq"]
    bare_step_ms = 1e3 * step_rows(results, step_part).get((bare["shape"], bare["seq"]), {}).get("ours", 0.0)

    def rows(loop_ms: dict, bare_ms: dict, names) -> list[list[str]]:
        out = []
        for name in names:
            ours, theirs = loop_ms.get(name, 0.0), bare_ms.get(name, 0.0)
            per_loop, per_bare = 1e6 * ours / loop["tokens"], 1e6 * theirs / bare_tokens
            out.append([name, fmt(ours, ".2f"), fmt(theirs, ".2f"), fmt(per_loop, ".1f"), fmt(per_bare, ".1f"),
                        fmt(per_loop - per_bare, "+.1f")])
        return out

    def gap(loop_ms: dict, bare_ms: dict, name: str) -> float:
        return 1e6 * loop_ms.get(name, 0.0) / loop["tokens"] - 1e6 * bare_ms.get(name, 0.0) / bare_tokens

    groups = sorted(set(loop["groups_ms"]) | set(bare["groups_ms"]),
                    key=lambda g: -abs(gap(loop["groups_ms"], bare["groups_ms"], g)))
    ops = sorted(set(loop["ops_ms"]) | set(bare["ops_ms"]), key=lambda o: -abs(gap(loop["ops_ms"], bare["ops_ms"], o)))
    header = ["", "loop ms per step", "bare ms per step", "loop ms per 1M tokens", "bare ms per 1M tokens",
              "difference per 1M tokens"]
    if compiled:
        title = (f"**The compiled loop's step against the compiled bare step.** The same with train.compile's "
                 f"compiled layers: part 5's {run['label']} run, loop steps {loop['steps'][0]}-{loop['steps'][1]}, "
                 f"{loop['tokens']:,.0f} real tokens a step, against `gpu_profile.py --compile` at {bare['shape']} seq "
                 f"{bare['seq']} batch {bare['batch']}; step (measured): part 5's run and its compiled bare step. "
                 f"Inductor's Triton kernels are counted by name, each in the group of the first op its name lists.")
    else:
        title = (f"**The loop's step against the bare step.** `bertrain pretrain`'s {run['label']} run (part 2) "
                 f"profiled whole loop steps {loop['steps'][0]}-{loop['steps'][1]} (batch transfer, forward, "
                 f"backward, clipping, optimizer; `gpu_pretrain.py --profile`), {loop['tokens']:,.0f} real tokens a "
                 f"step, against the bare step above ({bare_tokens:,} tokens a step, no padding), per million real "
                 f"tokens; a positive difference is time the loop spends beyond the bare step. step (measured): part "
                 f"2's step time over its measured steps and part 1's bare step (no profiler); device idle: that step "
                 f"less its ops' device time, the time the device waited (for the host, a sync or the data).")
    return (["", title + " The profiled steps come after the measured ones (a loop profiled earlier stays slower).",
             ""]
            + table(header, rows(loop["groups_ms"], bare["groups_ms"], groups)
                    + rows({"all ops": loop["total_ms"], "step (measured)": run.get("step_ms", 0.0),
                            "device idle (step - ops)": run.get("step_ms", 0.0) - loop["total_ms"]},
                           {"all ops": bare["total_ms"], "step (measured)": bare_step_ms,
                            "device idle (step - ops)": bare_step_ms - bare["total_ms"]},
                           ["all ops", "step (measured)", "device idle (step - ops)"]))
            + ["", "The ops that differ most:", ""]
            + table(["op"] + header[1:], [[f"`{row[0]}`"] + row[1:] for row in rows(loop["ops_ms"], bare["ops_ms"],
                                                                                      ops[:10])])
            + (device_waits(bare.get("gaps"), "the compiled bare step's") if compiled else [])
            + device_waits(loop.get("gaps"), "the compiled loop's" if compiled else "the loop's"))


def device_waits(gaps: dict | None, whose: str) -> list[str]:
    """The profiled steps' device idle time from their trace (trace_gaps.py), and the host ops that were late."""
    if not gaps:
        return []
    if "error" in gaps:
        return ["", f"Where {whose} device waited: the trace could not be read ({gaps['error']})."]
    lines = ["", f"**Where {whose} device waited** (the profiled steps' trace, `benchmarks/trace_gaps.py`; ms a step; "
                 f"the profiler's own host work makes the host later than it is unprofiled): busy "
                 f"{gaps['busy_ms']:.2f} of {gaps['span_ms']:.2f}, idle {gaps['idle_ms']:.2f}: "
                 f"**{gaps['host_late_ms']:.2f} where the host launched the next kernel only after the device had run "
                 f"out of work** (host-bound there), {gaps['queued_ms']:.2f} with the kernel queued but waiting (a "
                 f"sync, a stream wait, a copy), {gaps['short_ms']:.2f} in gaps under {gaps['min_gap_us']:g} us."
                 + (f" The host launched each kernel a median {gaps['lead_p50_ms']:.3f} ms before it started (10th "
                    f"percentile {gaps['lead_p10_ms']:.3f} ms): near 0, the device waits on the host; far above a "
                    f"kernel's time, the host runs ahead." if "lead_p50_ms" in gaps else "")]
    if gaps["late_ops"]:
        lines += ["", "The host's outermost op at each late launch, by the idle time before its kernel:", ""]
        lines += table(["host op", "idle ms a step", "late launches a step"],
                       [[f"`{row['op']}`", fmt(row["ms"], ".3f"), fmt(row["gaps"], ".1f")] for row in gaps["late_ops"]])
    return lines


def targets(state, commands, results) -> list[str]:
    rows, roles = step_rows(results), state["roles"]
    body = []

    def judge(name, value, shown, ok):
        body.append([name, shown if value is not None else "not measured",
                     "not measured" if value is None else ("met" if ok(value) else "**NOT met**")])

    compiled = step_rows(results, "5-step")
    for key in roles["bert-large"]:
        for how, r in (("", rows.get(tuple(key), {})), (" (train.compile, part 5)", compiled.get(tuple(key)))):
            if r is None:  # the compiled step: a row only where it ran
                continue
            judge(f"{key[0]} seq {key[1]}{how}: useful MFU >= 50%", r.get("mfu"),
                  fmt(100 * r.get("mfu", 0), ".1f", "%"), lambda v: v >= 0.5)
            judge(f"{key[0]} seq {key[1]}{how}: >= 1.5x transformers", r.get("speedup"),
                  fmt(r.get("speedup"), ".2f", "x"), lambda v: v >= 1.5)
    for role, need in (("bert-base", 1.3), ("albert", 1.1)):
        for key in roles[role]:
            r = rows.get(tuple(key), {})
            judge(f"{key[0]} seq {key[1]}: >= {need}x transformers", r.get("speedup"),
                  fmt(r.get("speedup"), ".2f", "x"), lambda v, need=need: v >= need)
    runs = {r["label"]: r for part in ("2", "5") for r in results.get(part, []) if "useful_mfu" in r}
    for run in state["runs"][:2]:
        r, bare = runs.get(run["label"]), rows.get(tuple(run["bare"]))
        ratio = vs_bare(r, bare)
        judge(f"pretrain {run['label']}: within 10% of the bare step (vs bare >= 0.9, part 2)", ratio,
              f"{fmt(ratio, '.2f')} (data wait {data_wait(r)})",
              lambda v: v >= 0.9)
        if r and r.get("bare_same_batches"):  # the loop's own cost, apart from what its batches change in the step
            same = vs_bare_same_batches(r)
            judge(f"pretrain {run['label']}: within 10% of the bare step on the run's own batches (vs bare, its "
                  f"batches >= 0.9, part 2)", same, fmt(same, ".2f"), lambda v: v >= 0.9)
    run = next((run for run in state["runs"] if "compile" in run["label"]), None)  # the compiled loop, as auto runs it
    if run is not None and run["label"] in runs:
        ratio = vs_bare(runs[run["label"]], compiled.get(tuple(run["bare"])))
        judge(f"pretrain {run['label']} (train.compile, part 5): within 10% of the compiled bare step", ratio,
              fmt(ratio, ".2f"), lambda v: v >= 0.9)
        if runs[run["label"]].get("bare_same_batches"):
            same = vs_bare_same_batches(runs[run["label"]])
            judge(f"pretrain {run['label']} (train.compile, part 5): within 10% of the compiled bare step on the "
                  f"run's own batches", same, fmt(same, ".2f"), lambda v: v >= 0.9)
    for r in results.get("3", []):
        judge(f"0 host syncs: {r['case']}", r.get("later_steps"),
              f"{r.get('later_steps')} after step 1 ({r.get('first_step')} in step 1), 'error' mode: "
              f"{r.get('error_mode')}", lambda v: v == 0)
    ratio = (results.get("4") or [{}])[0].get("ratio")
    judge("LAMB <= 1.3x fused AdamW", ratio, fmt(ratio, ".2f", "x"), lambda v: v <= 1.3)
    best = best_lamb_kernel(results)
    judge("LAMB <= 1.3x fused AdamW, device time (host ahead), best kernel configuration", best and
          best["device_ratio"], best and f"{best['device_ratio']:.2f}x ({best['config']})", lambda v: v <= 1.3)
    resume = next(c for c in commands if c.part == "6")
    ran = not resume.status.startswith(("not run", TIME_BUDGET))
    judge("exact resume (--check-resume)", resume.status if ran else None,
          "PASS" if resume.status == "ok" else resume.status, lambda v: v == "ok")
    note = ["CPU quick run: tiny shapes, so met / not met says nothing about the GPU targets.", ""] \
        if state["quick"] else []
    return note + table(["target (issue 25)", "measured", "met"], body)


def render(state: dict, commands, results: dict) -> str:
    lines = header(state, commands)
    sections = [("1", part1), ("2", part2), ("3", part3), ("4", part4), ("5", part5), ("6", part6), ("7", part7),
                ("8", targets)]
    for part, build in sections:
        lines += ["", f"## {part}. {TITLES[part]}", ""]
        try:
            lines += build(state, commands, results)
        except Exception as error:  # a malformed result must not cost the rest of the report
            lines.append(f"(this section failed to render: {type(error).__name__}: {error})")
        lines += failures(commands, part)
    lines += ["", "## Setup", ""] + (failures(commands, "0") or ["install and data preparation: see setup.log"])
    return "\n".join(lines) + "\n"
