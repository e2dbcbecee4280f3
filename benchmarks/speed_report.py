"""speed.py's tables: every measurement side by side with fairseq's own Transformer in the same
cell (the ratio of the medians, and the median of the per-repeat paired ratios), and the short
table a GPU run ends with."""

import torch

from benchmarks.bench import BASELINE, COMPILED, PRECISIONS, ratio, table
from common.host import cpu_model, host


def machine(args):
    """The hardware beside the device: the GPU's memory and the host's processor and cores."""
    if str(args.device).startswith("cuda"):
        gpu = torch.cuda.get_device_properties(args.device)
        return f"{gpu.name} ({gpu.total_memory / 2**30:.0f} GiB); host {host()}"
    return host()


def device_name(args):
    if str(args.device).startswith("cuda"):
        return f"{torch.cuda.get_device_name()} ({PRECISIONS[args.dtype]})"
    return f"CPU: {cpu_model()}, {torch.get_num_threads()} threads (fp32)"


def paired(run):
    if run.get("train_ratio_paired") is None:
        return "—"
    gen = run.get("gen_ratio_paired")
    return f"{run['train_ratio_paired']:.3f} / " + ("—" if gen is None else f"{gen:.3f}")


def cell(run):
    return run["size"], run["length"], run["tokens_per_batch"]


def with_baselines(runs):
    """Each run with the baseline's run of its cell ({} where there is none)."""
    base = {cell(r): r for r in runs if r["variant"] == BASELINE}
    return [(r, base.get(cell(r), {})) for r in runs]


def busy_share(run):
    kernels = run.get("cuda_kernels") or {}
    if not kernels.get("busy_us") or not run.get("train_step_ms"):
        return "—"
    return f"{kernels['busy_us'] / 1e3 / run['train_step_ms']:.0%}"


def attention_ms(run):
    by_backend = (run.get("cuda_kernels") or {}).get("attention_us")
    if not by_backend:
        return "—"
    return ", ".join(f"{backend} {us / 1e3:.2f}" for backend, us in sorted(by_backend.items()))


def report(args, runs, skipped=(), budget=None):
    budgets = ", ".join(map(str, args.token_budgets))
    header = ["size", "length", "tokens", "variant", "parameters", "train tokens/s", "× fairseq", "peak memory (MiB)"]
    header += ["× fairseq", "beam-4 sents/s", "× fairseq", "paired × fairseq train / gen", "spread train / gen"]
    if args.profile:
        header += ["CUDA kernels / step", "× fairseq", "GPU busy / step", "attention kernels (ms)"]
    rows = []
    for r, b in with_baselines(runs):
        gen = f"{r['gen_sents_per_s']:.2f}" if "gen_sents_per_s" in r else "—"
        gen_spread = f"{r['gen_spread']:.0%}" if "gen_spread" in r else "—"
        row = [*cell(r), r["variant"], f"{r['parameters']:,}", f"{r['train_tokens_per_s']:.0f}"]
        row += [ratio(r["train_tokens_per_s"], b.get("train_tokens_per_s")), mib(r.get("peak_mem_bytes"))]
        row += [ratio(r.get("peak_mem_bytes"), b.get("peak_mem_bytes")), gen]
        row += [ratio(r.get("gen_sents_per_s"), b.get("gen_sents_per_s")), paired(r)]
        row += [f"{r['train_spread']:.0%} / {gen_spread}"]
        if args.profile:
            kernels, base_kernels = r.get("cuda_kernels") or {}, b.get("cuda_kernels") or {}
            count = kernels.get("total", "—")
            row += [count, ratio(kernels.get("total"), base_kernels.get("total")), busy_share(r), attention_ms(r)]
        rows.append(row)
    lines = [
        f"Device: {device_name(args)}; torch {torch.__version__}; training batch ≈{budgets} "
        f"target tokens, {args.steps} steps × {args.repeats} interleaved repeats (medians); "
        f"generation: beam 4, {args.gen_sentences} sentences per batch",
        "",
        *table(header, rows),
        "",
        "× fairseq: ratio of the medians. paired: median over repeats of the ratio to fairseq's run in "
        "the same repeat (the machine's slow drifts cancel). spread: (max − min) / median of the repeats. "
        "`post-ln` runs fairseq's own modules: its distance from 1.000 is the noise of this run.",
    ]
    for r in runs:
        if r["variant"].endswith(COMPILED):
            lines.append(
                f"{r['variant']} at {r['size']}, {r['length']}, {r['tokens_per_batch']}: first training step "
                f"{r['warmup_s']:.1f} s, of which compiling {r['compile_s']:.1f} s (not in the timed steps)"
            )
    if args.profile:
        lines.append(
            "GPU busy / step: the device's busy time in one profiled training step over the timed step's "
            "length (well under 100 %: the step waits on the host). attention kernels: their time in that "
            "step, by SDPA backend."
        )
    return "\n".join(lines + ["", short_table(runs, skipped, budget)])


def mib(n):
    return "—" if n is None else f"{n / 2**20:.0f}"


def short_table(runs, skipped, budget):
    """What a reader of the run's last lines needs: each variant's paired speed and memory against
    the baseline of its cell, its first step, and what the budget skipped."""
    rows = []
    for r, b in with_baselines(runs):
        # a JSON older than speed.py's timing of the first step has none (cpu-speed-quick.json)
        first = f"{r['warmup_s']:.1f} s ({r['compile_s']:.1f} s)" if "warmup_s" in r else "—"
        paired_ratio = "—" if r.get("train_ratio_paired") is None else f"{r['train_ratio_paired']:.3f}"
        memory = ratio(r.get("peak_mem_bytes"), b.get("peak_mem_bytes"))
        rows.append(
            ["/".join(map(str, cell(r))), r["variant"], f"{r['train_tokens_per_s']:.0f}", paired_ratio, memory, first]
        )
    header = ["cell", "variant", "tokens/s", "paired × fairseq", "memory × fairseq", "first step (compiling)"]
    lines = table(header, rows)
    lines += [f"skipped: {s['what']} of {s['variant']} at {'/'.join(map(str, cell(s)))}" for s in skipped]
    if budget is not None and budget.seconds is not None:
        lines.append(f"budget: {budget.used():.0f} s used of {budget.seconds:.0f} s; {len(skipped)} steps skipped")
    return "\n".join(lines)
