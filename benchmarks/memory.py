"""Peak memory of a variant's training steps (speed.py), and the bytes autograd saves for backward
in one training forward pass (--saved-activations). On a CPU each is measured in a fresh process
of speed.py (``--memory-probe``, ``--saved-probe``), with nothing else allocated."""

import gc
import sys
from pathlib import Path

import torch

from benchmarks.bench import DTYPES, SIZES, Bench, batch, build, ratio, table
from common import commands

SPEED = Path(__file__).with_name("speed.py")  # the fresh process: speed.py's probe options


def in_fresh_process(args, probe, variant, size, length):
    """Run *probe* ("--memory-probe" or "--saved-probe") for one variant in a new process and
    return the number it prints: memory is measured with nothing else allocated (no other
    variant's model, no leftovers of the timing runs; 18L-18L in one process ran out of 24 GiB)."""
    cmd = [sys.executable, str(SPEED), probe, variant, size, str(length), "--device", str(args.device)]
    cmd += ["--dtype", args.dtype, "--tokens-per-batch", str(args.tokens_per_batch), "--steps", str(args.steps)]
    if args.saved_activations:
        cmd += ["--saved-activations", args.saved_activations]
    return int(commands.run(cmd).stdout.strip().splitlines()[-1])


def rss_bytes(field):
    """VmRSS (now) or VmHWM (peak) of this process. Not getrusage's ru_maxrss: Linux keeps that
    across exec, so a probe would report its parent's peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_memory(args, variant, size, length):
    """Peak memory of building *variant* and doing the timed training steps, above the memory in
    use before the model exists: on a GPU the allocated bytes, measured in this process (they
    count live tensors only, so once earlier models are freed nothing of them is in it); on a
    CPU the resident set, of a fresh process (imports excluded; glibc keeps freed memory)."""
    if str(args.device).startswith("cuda"):
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return _training_peak(args, variant, size, length, torch.cuda.memory_allocated, torch.cuda.max_memory_allocated)
    return in_fresh_process(args, "--memory-probe", variant, size, length)


def peak_memory_probe(args, variant, size, length):
    """``peak_memory`` on a CPU, run as a fresh process's only work."""
    import fairseq_realformer  # noqa: F401  (imports fairseq before the baseline is taken)

    return _training_peak(args, variant, size, length, lambda: rss_bytes("VmRSS"), lambda: rss_bytes("VmHWM"))


def _training_peak(args, variant, size, length, now, peak):
    """*peak*() after building *variant* and taking its timed training steps, less *now*() before."""
    before = now()
    Bench(variant, SIZES[size], length, args).train_steps(args.steps)
    return peak() - before


def saved_for_backward_bytes(args, variant, size, length):
    """Bytes of the distinct tensors autograd keeps for backward in one training forward pass."""
    from fairseq_realformer.modules import admin

    model, dictionary = build(variant, SIZES[size], args.device, DTYPES[args.saved_activations])
    sample = batch(dictionary, 4096 // length, length, args.device)
    admin.initialize(model, sample["net_input"])
    storages = {}

    def keep(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model(**sample["net_input"])
    return sum(storages.values())


def count_saved_activations(args):
    """--saved-activations: each variant's bytes saved for backward per cell, in a fresh process
    each; printed as a table and returned for the JSON."""
    saved, rows = [], []
    for size in args.sizes:
        for length in args.lengths:
            cell = {v: in_fresh_process(args, "--saved-probe", v, size, length) for v in args.variants}
            for v, n in cell.items():
                where = {"variant": v, "size": size, "length": length, "dtype": args.saved_activations}
                saved.append({**where, "saved_for_backward_bytes": n})
                rows.append([size, length, v, f"{n / 2**20:.0f}", ratio(n, cell.get("fairseq"))])
    dtype = args.saved_activations
    print(f"\nTensors saved for backward, one training forward pass of 4096 target tokens in {dtype}:\n")
    print("\n".join(table(["size", "length", "variant", "MiB", "× fairseq"], rows)))
    return saved
