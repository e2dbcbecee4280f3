"""Host time of a training step and of a beam decode: RealFormer against fairseq's own Transformer,
on a model too narrow for its arithmetic to matter (issue 41).

On a GPU at a few thousand tokens a batch, a step waits on the host: the H100 trained fairseq's
6L-6L at 3.9x the tokens/s with 4x the batch (benchmarks/RESULTS.md), so the step's time was
what the host spends issuing it. That time is Python, PyTorch's dispatch of each ATen operation and
the kernel launches. ``kernel_count.py`` counts the operations; this script times the rest, which
the counts miss: a ``torch.autograd.Function`` that saves kernels runs Python forward and backward,
and a code path with fewer operations can still cost the host more. Here every tensor is tiny, so
what a step costs is that host work, on this CPU, one thread.

Measured for each variant and size (6L-6L, 18L-18L layers; width 16, 2 heads of 8, feed-forward 32,
a 64-symbol dictionary), float32 or (``--precision bf16``) under the plugin's --bf16 autocast:
    train ms     one training step as kernel_count.py's ``train_step``: forward on 4 sentences of
                 LENGTH tokens, the cross-entropy loss, ``loss.backward()`` (no optimizer step: it
                 is per parameter tensor and the same code for every variant; ``params`` gives their
                 number)
    decode ms    one ``SequenceGenerator`` call: beam 4, 2 sentences, LENGTH tokens + EOS each
    µs/op        the time over kernel_count.py's count of ATen operations in the same step
Time is the thread's CPU time (``time.thread_time``), so another process on the machine lengthens
it less than it would wall time, though not by nothing (shared caches and cores). Steps are timed in
blocks, interleaved across variants and repeated. A variant's time is its fastest block: the host
work itself, which noise only ever adds to; the ratio to fairseq is also given as the median of the
per-repeat (paired) ratios, which a drift of the machine cancels out of.

Variants: speed.py's; a plugin variant's name with ``+eager``, ``+fused`` or ``+concat`` appended
runs its residual attention that way. The fused paths' time here is not a GPU's: on a CPU their
``scaled_dot_product_attention`` (with a bias, or queries wider than the values) runs PyTorch's
math path, many operations that kernel_count.py counts as one and that a GPU runs as one kernel.

    python benchmarks/host_time.py                                  # default variants, both sizes
    python benchmarks/host_time.py --sizes 6L-6L --variants fairseq,admin --repeats 21
    python benchmarks/host_time.py --precision bf16 --json benchmarks/results/cpu-host-time-bf16.json
"""

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernel_count  # noqa: E402
import speed  # noqa: E402

DEFAULT_VARIANTS = "fairseq,post-ln,admin,realformer,realformer-sum"
NARROW = [
    *("--encoder-embed-dim", "16", "--decoder-embed-dim", "16"),
    *("--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32"),
    *("--encoder-attention-heads", "2", "--decoder-attention-heads", "2"),
]
VOCAB = 64
TRAIN_SENTENCES = 4
DECODE_SENTENCES = 2


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--variants", default=DEFAULT_VARIANTS, help="comma list of speed.py's variants (default: %(default)s)"
    )
    p.add_argument(
        "--sizes", default=",".join(speed.SIZES), help=f"comma list of {', '.join(speed.SIZES)} (default: %(default)s)"
    )
    p.add_argument("--length", type=int, default=16, help="sentence length in tokens (default: %(default)s)")
    p.add_argument("--steps", type=int, default=5, help="training steps per timed block (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=21, help="interleaved repeats (default: %(default)s)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="(default: %(default)s)")
    p.add_argument("--json", help="also write the numbers here")
    args = p.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    args.sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [v for v in args.variants if not kernel_count.known(v)]
    if unknown or not args.variants:
        p.error(f"--variants: {'unknown ' + ', '.join(unknown) if unknown else 'nothing given'}; see speed.py")
    if "fairseq" not in args.variants:
        args.variants.insert(0, "fairseq")  # every ratio is to fairseq
    bad = [s for s in args.sizes if s not in speed.SIZES]
    if bad or not args.sizes:
        p.error(
            f"--sizes: {'unknown ' + ', '.join(bad) if bad else 'nothing given'}; choose from {', '.join(speed.SIZES)}"
        )
    for flag in ("length", "steps", "repeats"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag}: must be at least 1, not {getattr(args, flag)}")
    return args


class Narrow:
    """One variant at one size, narrow: its model, a training batch and a generator."""

    def __init__(self, variant, layers, length, precision):
        from fairseq.sequence_generator import SequenceGenerator

        from fairseq_realformer.modules import admin

        self.model, dictionary = speed.build(variant, layers, "cpu", torch.float32, NARROW, VOCAB)
        self.sample = speed.batch(dictionary, TRAIN_SENTENCES, length, "cpu")
        admin.initialize(self.model, self.sample["net_input"])  # ω profiled before anything is timed
        self.generator = SequenceGenerator(
            [self.model], dictionary, beam_size=kernel_count.BEAM, max_len_a=0, max_len_b=length, min_len=length
        )
        self.gen_sample = speed.batch(dictionary, DECODE_SENTENCES, length, "cpu", seed=1)
        self.length, self.precision = length, precision

    def train(self, counting=None):
        kernel_count.train_step(self.model, self.sample, counting, self.precision)

    def decode(self, counting=None):
        kernel_count.decode(self.generator, self.gen_sample, self.length, counting, self.precision)

    def ops(self):
        """ATen operations of one training step and one decode, counted as kernel_count.py does."""
        train, gen = kernel_count.Counting(), kernel_count.Counting()
        self.train(train)
        self.decode(gen)
        return sum(train.counts.values()), sum(gen.counts.values())


def cpu_ms(fn, times=1):
    start = time.thread_time()
    for _ in range(times):
        fn()
    return (time.thread_time() - start) * 1e3 / times


def measure(args, size):
    benches = {v: Narrow(v, speed.SIZES[size], args.length, args.precision) for v in args.variants}
    for bench in benches.values():  # warm-up: lazy initialisation, the allocator's caches
        bench.train()
        bench.decode()
    train, decode = {v: [] for v in benches}, {v: [] for v in benches}
    for _ in range(args.repeats):
        for v, bench in benches.items():
            train[v].append(cpu_ms(bench.train, args.steps))
            decode[v].append(cpu_ms(bench.decode))
    runs = []
    for v, bench in benches.items():
        train_ops, decode_ops = bench.ops()
        runs.append(
            {
                "variant": v,
                "size": size,
                "flags": speed.variant_flags(v),
                "params": sum(1 for _ in bench.model.parameters()),
                "train_ms": train[v],
                "decode_ms": decode[v],
                "train_ops": train_ops,
                "decode_ops": decode_ops,
            }
        )
    return runs


def summary(runs):
    """Per run: the fastest block, ratios to fairseq of the same size (of the fastest blocks, and the
    median of the paired ones), µs per op."""
    base = {r["size"]: r for r in runs if r["variant"] == "fairseq"}
    rows = []
    for r in runs:
        b = base[r["size"]]
        row = {"variant": r["variant"], "size": r["size"], "params": r["params"]}
        for what in ("train", "decode"):
            ms, ref = r[f"{what}_ms"], b[f"{what}_ms"]
            row[f"{what}_ms"] = min(ms)
            row[f"{what}_ratio"] = row[f"{what}_ms"] / min(ref)
            row[f"{what}_paired"] = statistics.median(x / y for x, y in zip(ms, ref))
            row[f"{what}_spread"] = (statistics.median(ms) - min(ms)) / min(ms)
            row[f"{what}_ops"] = r[f"{what}_ops"]
            row[f"{what}_ops_ratio"] = r[f"{what}_ops"] / b[f"{what}_ops"]
            row[f"{what}_us_per_op"] = row[f"{what}_ms"] * 1e3 / r[f"{what}_ops"]
        rows.append(row)
    return rows


def device_name(precision):
    return f"CPU: {platform.processor() or platform.machine()}, 1 thread, thread CPU time ({precision})"


def report(rows, args):
    lines = [
        f"Device: {device_name(args.precision)}; torch {torch.__version__}; width 16, {TRAIN_SENTENCES} sentences × "
        f"{args.length} tokens a training step (forward, loss, backward), beam {kernel_count.BEAM} over "
        f"{DECODE_SENTENCES} sentences a decode; the fastest of {args.repeats} interleaved repeats",
        "",
        "| size | variant | train ms | × fairseq | paired | noise | ops × fairseq | µs/op | decode ms | × fairseq "
        "| paired | noise | ops × fairseq | µs/op | params |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r["size"], r["variant"]]
        for what in ("train", "decode"):
            cells += [
                f"{r[f'{what}_ms']:.2f}",
                f"{r[f'{what}_ratio']:.3f}",
                f"{r[f'{what}_paired']:.3f}",
                f"{r[f'{what}_spread']:.0%}",
                f"{r[f'{what}_ops_ratio']:.3f}",
                f"{r[f'{what}_us_per_op']:.2f}",
            ]
        lines.append("| " + " | ".join(map(str, [*cells, r["params"]])) + " |")
    lines += [
        "",
        "ms: the fastest repeat; paired: the median of the per-repeat ratios to fairseq; noise: how much slower "
        "the median repeat was than the fastest; ops: ATen operations as kernel_count.py counts them; µs/op: "
        "host time per operation.",
    ]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the host's work, not the arithmetic's parallelism
    runs = []
    try:
        for size in args.sizes:
            start = time.perf_counter()
            runs += measure(args, size)
            print(f"[host_time] {size}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    finally:
        torch.set_num_threads(threads)
    rows = summary(runs)
    print(report(rows, args))
    if args.json:
        settings = {
            "variants": args.variants,
            "sizes": args.sizes,
            "length": args.length,
            "steps": args.steps,
            "repeats": args.repeats,
            "precision": args.precision,
            "width_flags": NARROW,
            "vocab": VOCAB,
            "train_sentences": TRAIN_SENTENCES,
            "decode_sentences": DECODE_SENTENCES,
            "beam": kernel_count.BEAM,
        }
        speed.write_result(
            args.json,
            "host_time.py",
            sys.argv[1:] if argv is None else argv,
            device_name(args.precision),
            speed.machine(argparse.Namespace(device="cpu")),
            settings=settings,
            summary=rows,
            runs=runs,
        )


if __name__ == "__main__":
    main()
