"""Speed and memory of RealFormer against fairseq's own Transformer, side by side.

Variants (same sizes, batches and weights' shapes): ``fairseq``, fairseq's stock ``transformer``
(Post-LN, fused SDPA self-attention in training), and those of fairseq_realformer/variants.py on
the ``realformer`` architecture; by default ``post-ln`` (fairseq's own modules: must cost nothing),
``realformer-sum`` and ``realformer`` (RealFormer on ADMIN, profiled ω, all three paths, running sum
or mean: the paper's). ``+compiled`` appended trains with compiled layers: a plugin variant with
``--compile-layers``, ``fairseq+compiled`` with fairseq's layers compiled by hand (``nn.Module.compile``,
what a fairseq user could do); its first training step, which compiles, is timed apart (``warmup_s``;
``compile_s``, the compiler's own time), and it decodes eager, untimed.

Measured for each size (6L-6L and 18L-18L, 512/2048/8), sentence length (~30 and ~100 tokens) and
--tokens-per-batch (a comma list: each timed, generation at the first only): training tokens/s
(forward + backward + Adam step; target tokens), the peak memory of those steps (memory.py), and
beam-4 sentences/s with incremental decoding (--gen-sentences a batch, 0: none; every hypothesis as
long as the reference, so every variant does the same work). Timings are interleaved across
variants and repeated; the tables give medians and each variant's ratio to fairseq in the same
cell, as the ratio of the medians and as the median of the per-repeat (paired) ratios.

Precision on a GPU (--dtype), as fairseq-train with the plugin: ``fp32``; ``bf16`` (--bf16: float32
weights, gradients and Adam, the forward under the plugin's bfloat16 autocast); ``fp16`` (--fp16: a
float16 model, float32 master weights that Adam steps, the loss scaled by 128 as fairseq's
FP16Optimizer starts, its overflow checks aside). --profile also records each variant's CUDA
kernels in one training step (cuda_profile.py): the attention kernels name the SDPA backend that
ran, and the device's busy time against the step's length says whether the step waits on the host.

    python benchmarks/speed.py --quick                 # CPU, a few minutes
    python benchmarks/speed.py --quick --variants fairseq,realformer,realformer-value-residual,resi-dual,resi-dual-realformer
    python benchmarks/speed.py --dtype bf16 --json gpu.json   # on a GPU (and --dtype fp16)
    python benchmarks/speed.py --variants fairseq,fairseq+compiled,realformer,realformer+compiled
"""

if __name__ == "__main__" and not __package__:  # run by its path, from any folder: as `python -m` its module
    import by_path  # noqa: F401  (common/by_path.py, linked beside this file)

import argparse
import gc
import itertools
import os
import statistics
import sys
import time
from functools import partial

import torch

from benchmarks.bench import BASELINE, COMPILED, DTYPES, SIZES, VARIANTS, Bench, known_variant, say, timed, write_json
from benchmarks.budget import Budget, Cell, Expected, run
from benchmarks.budget import add_arguments as add_budget_arguments
from benchmarks.cuda_profile import cuda_kernels_of_a_training_step
from benchmarks.memory import count_saved_activations, peak_memory, peak_memory_probe, saved_for_backward_bytes
from benchmarks.speed_report import device_name, machine, report, short_table
from common.repo import import_fairseq_quietly
from common.results import read_result

DEFAULT_VARIANTS = "fairseq,post-ln,realformer-sum,realformer"
SETUP_GUESS_S = 30  # the first variant's build, first steps and timed steps, before anything is seen


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CPU-sized: 6L-6L only, small batches, 3 repeats")
    p.add_argument("--sizes", help=f"comma list of {', '.join(SIZES)} (default: all; --quick: 6L-6L)")
    p.add_argument("--lengths", default="30,100", help="sentence lengths in tokens (default: %(default)s)")
    p.add_argument(
        "--tokens-per-batch",
        metavar="N[,N...]",
        help="target tokens a batch, or a list (default: 4096 GPU, 1024 CPU, 512 --quick)",
    )
    p.add_argument(
        "--gen-sentences", type=int, help="sentences per generation batch (default: 64 GPU, 8 CPU, 4 --quick)"
    )
    p.add_argument("--steps", type=int, help="training steps per timed repeat (default: 10 GPU, 3 CPU, 2 --quick)")
    p.add_argument("--repeats", type=int, help="interleaved repeats; medians are reported (default: 5, 3 --quick)")
    p.add_argument(
        "--dtype", choices=DTYPES, default="fp32", help="fp32, or what fairseq-train's --bf16 / --fp16 do (on a GPU)"
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--variants", default=DEFAULT_VARIANTS, help=f"comma list of {', '.join(VARIANTS)} (default: %(default)s)"
    )
    p.add_argument(
        "--saved-activations",
        choices=DTYPES,
        metavar="DTYPE",
        help="also count the bytes autograd saves for backward in one training forward pass of 4096 target "
        "tokens in DTYPE, on any device (bf16 on a CPU: what a GPU would hold)",
    )
    p.add_argument("--saved-only", action="store_true", help="with --saved-activations: no timed steps")
    p.add_argument("--profile", action="store_true", help="the CUDA kernels of one training step (torch.profiler)")
    add_budget_arguments(p)
    p.add_argument("--json", help="also write the numbers here, as each variant is measured")
    p.add_argument("--summary", metavar="JSON", help="print the short table of this run's JSON, and nothing else")
    p.add_argument("--memory-probe", nargs=3, metavar=("VARIANT", "SIZE", "LENGTH"), help=argparse.SUPPRESS)
    p.add_argument("--saved-probe", nargs=3, metavar=("VARIANT", "SIZE", "LENGTH"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    gpu = args.device.startswith("cuda")
    args.sizes = (args.sizes or ("6L-6L" if args.quick else ",".join(SIZES))).split(",")
    args.lengths = [int(x) for x in args.lengths.split(",")]
    args.variants = args.variants.split(",")
    if set(args.sizes) - set(SIZES):
        p.error(f"--sizes: unknown {', '.join(sorted(set(args.sizes) - set(SIZES)))}; choose from {', '.join(SIZES)}")
    unknown = [v for v in args.variants if not known_variant(v)]
    if unknown:
        p.error(
            f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)} (any may end in {COMPILED})"
        )
    if args.saved_only and not args.saved_activations:
        p.error("--saved-only counts what --saved-activations DTYPE asks for: give both")
    if args.dtype != "fp32" and not gpu:
        p.error("--dtype fp16/bf16 needs a GPU (--device cuda)")
    default_tokens = 4096 if gpu else 512 if args.quick else 1024
    try:
        args.token_budgets = [int(x) for x in (args.tokens_per_batch or str(default_tokens)).split(",")]
    except ValueError:
        p.error(f"--tokens-per-batch {args.tokens_per_batch}: expected a number or a comma list, e.g. 4096,16384")
    args.tokens_per_batch = args.token_budgets[0]
    if args.gen_sentences is None:
        args.gen_sentences = 64 if gpu else 4 if args.quick else 8
    args.steps = args.steps or (10 if gpu else 2 if args.quick else 3)
    args.repeats = args.repeats or (3 if args.quick else 5)
    return args


class Timings:
    """budget.run's measurer for speed.py. A cell's baseline (``fairseq``, measured first) stays built
    until the cell's timings end, and every other variant's timed steps alternate with the
    baseline's, repeat by repeat: its paired ratio compares steps taken side by side in time, and
    each variant's record is whole (and written) as soon as it is measured."""

    def __init__(self, args):
        self.args, self.baseline = args, None
        self.gpu = str(args.device).startswith("cuda")
        self.fresh_probes = not self.gpu  # peak_memory: a CPU's in a new process

    def compiles(self, variant):
        return variant.endswith(COMPILED)

    def time(self, variant, cell):
        """Build *variant*; its first training step timed apart (a compiled one compiles in it), a
        second untimed; with --profile its CUDA kernels in one step; then --repeats of --steps."""
        from fairseq_realformer.modules.compiled import COMPILE_TIME

        args = self.args
        args.tokens_per_batch = cell.tokens  # what Bench reads
        start = time.perf_counter()
        bench = Bench(variant, cell.layers, cell.length, args)
        build_s = time.perf_counter() - start
        before = COMPILE_TIME.seconds
        warmup_s = timed(lambda: bench.train_steps(1))
        compile_s = COMPILE_TIME.seconds - before
        steps_start = time.perf_counter()
        bench.train_steps(1)  # a compiled step's backward may compile lazily, at its second use
        # generation at the first batch size only, eager only (a compiled variant decodes eager)
        generates = cell.tokens == args.token_budgets[0] and args.gen_sentences > 0 and not self.compiles(variant)
        if generates:
            bench.generate()
        kernels = cuda_kernels_of_a_training_step(bench) if args.profile and self.gpu else None
        base = self.baseline if variant != BASELINE else None
        train, base_train, gen, base_gen = [], [], [], []
        for _ in range(args.repeats):
            for b, series in ((base, base_train), (bench, train)):
                if b is not None:
                    series.append(b.tokens * args.steps / timed(lambda: b.train_steps(args.steps)))
            for b, series in ((base, base_gen), (bench, gen)):
                if generates and b is not None:
                    series.append(args.gen_sentences / timed(b.generate))
        steps_s = time.perf_counter() - steps_start  # for the budget: what grows with a step's work
        if variant == BASELINE:
            self.baseline, base_train, base_gen = bench, train, gen

        def spread(xs):  # how much the repeats disagree: the noise floor of the ratios
            return (max(xs) - min(xs)) / statistics.median(xs)

        def paired(xs, bs):  # median of the per-repeat ratios: a slow drift of the machine cancels out
            return statistics.median(x / b for x, b in zip(xs, bs)) if bs else None

        record = {
            "variant": variant,
            "size": cell.size,
            "length": cell.length,
            "tokens_per_batch": cell.tokens,
            "parameters": sum(p.numel() for p in bench.params),
            "train_tokens_per_s": statistics.median(train),
            "train_step_ms": 1e3 * bench.tokens / statistics.median(train),
            "train_spread": spread(train),
            "train_ratio_paired": paired(train, base_train),
            "build_s": build_s,
            "warmup_s": warmup_s,
            "compile_s": compile_s,
            "steps_s": steps_s,
        }
        if generates:
            record.update(gen_sents_per_s=statistics.median(gen), gen_spread=spread(gen))
            record["gen_ratio_paired"] = paired(gen, base_gen)
        if kernels is not None:
            record["cuda_kernels"] = kernels
        speed = f"{record['train_tokens_per_s']:.0f} tokens/s"
        first = f"first step {warmup_s:.1f} s (compiling {compile_s:.1f} s)"
        say("speed", f"{cell.describe()}: {variant} {speed}, {first}", file=sys.stderr)
        return record

    def end_timings(self, cell):
        self.baseline = None
        gc.collect()
        if self.gpu:
            torch.cuda.empty_cache()

    def probe(self, variant, cell):
        self.args.tokens_per_batch = cell.tokens
        return peak_memory(self.args, variant, cell.size, cell.length)


def main(argv=None):
    args = parse_args(argv)
    if args.summary:
        result = read_result(args.summary)
        # a JSON older than --tokens-per-batch's comma list keeps its one batch size in its settings
        runs = [{"tokens_per_batch": result["settings"].get("tokens_per_batch"), **run} for run in result["runs"]]
        print(f"{result['device']}; {result['date']}")
        print(short_table(runs, result.get("skipped", []), None))
        return
    import_fairseq_quietly()
    # several variants and cells in one process keep their graphs side by side on each layer
    # class's compiled forward (fairseq_realformer/modules/compiled.py): more than one run needs
    torch._dynamo.config.recompile_limit = 64  # (cache_size_limit before PyTorch 2.6, an alias since)
    for probe, measure in ((args.memory_probe, peak_memory_probe), (args.saved_probe, saved_for_backward_bytes)):
        if probe:
            variant, size, length = probe
            print(measure(args, variant, size, int(length)))
            return
    if args.saved_only:
        write_results(args, [], [], count_saved_activations(args), Budget(args.budget))
        return
    # the question first: the baseline and the next variant given (the GPU command: the compiled
    # RealFormer) at the first cell; then the other variants; then each larger batch, size, length
    grid = itertools.product(args.lengths, args.sizes, args.token_budgets)
    cells = [Cell(size, SIZES[size], length, tokens) for length, size, tokens in grid]
    variants = sorted(args.variants, key=lambda v: v != BASELINE)  # every other variant is paired with it
    expected = Expected(args.compile_guess, SETUP_GUESS_S, BASELINE)
    budget = Budget(args.budget)
    written = partial(write_results, args, saved=[], budget=budget)  # (runs, skipped): as each is known
    runs, skipped = run(cells, variants, Timings(args), budget, expected, written)
    args.tokens_per_batch = args.token_budgets[0]
    saved = count_saved_activations(args) if args.saved_activations else []
    write_results(args, runs, skipped, saved, budget)
    print(report(args, runs, skipped, budget), flush=True)


def write_results(args, runs, skipped, saved, budget):
    content = {"budget": budget.spent(), "runs": runs, "skipped": skipped, "saved_for_backward": saved}
    write_json(args, __file__, None, device_name(args), machine(args), ("memory_probe", "saved_probe"), **content)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count()))
    main()
