"""Speed and memory of RealFormer against fairseq's own Transformer, side by side.

Variants (same sizes, batches and weights' shapes): ``fairseq``, fairseq's stock ``transformer``
(Post-LN, fused SDPA self-attention in training), and those of fairseq_realformer/variants.py on
the ``realformer`` architecture; by default
    post-ln          our model with no residual path, Post-LN: fairseq's own modules (must cost nothing;
                     since issue 41 their training self-attention projects q, k, v in one GEMM)
    realformer-sum   RealFormer on ADMIN (profiled ω), all three paths, running sum
    realformer       RealFormer on ADMIN (profiled ω), all three paths, running mean (the paper's)

Measured for each size (6L-6L and 18L-18L, 512/2048/8) and sentence length (~30 and ~100 tokens):
training tokens/s (forward + backward + Adam step; target tokens), peak memory of doing the same
training steps (GPU: max allocated above the allocation before the model is built, in this process
once the timing runs' models are freed; CPU: peak RSS of a fresh process above its RSS before the
model is built), and beam-4 generation sentences/s with incremental decoding (every hypothesis exactly as long as the reference length, so every
variant does the same work). Timings are interleaved across variants, repeated, and reported as
medians; the table gives each variant's ratio to fairseq in the same run, both as the ratio of
the medians and as the median of the per-repeat (paired) ratios.

Precision on a GPU (``--dtype``) is what fairseq-train does with the plugin loaded:
    fp32   float32 throughout
    bf16   ``--bf16``: float32 weights, gradients and Adam; forward (training and generation) under
           the plugin's bfloat16 autocast (fairseq_realformer/precision.py)
    fp16   ``--fp16``: the model cast to float16 and a float32 master copy that Adam steps, the
           loss scaled by 128 (fairseq's FP16Optimizer at its initial scale; overflow checks aside)

    python benchmarks/speed.py --quick                 # CPU, a few minutes
    python benchmarks/speed.py --quick --variants fairseq,realformer,realformer-value-residual,resi-dual,resi-dual-realformer
    python benchmarks/speed.py --dtype bf16 --json gpu.json   # on a GPU (and --dtype fp16)

A variant's name with ``+compiled`` appended trains with compiled layers: a plugin variant with
``--compile-layers`` (fairseq_realformer/modules/compiled.py), ``fairseq+compiled`` with fairseq's
own layers compiled by hand (``nn.Module.compile``, what a user of fairseq could do), e.g.
``--variants fairseq,fairseq+compiled,realformer,realformer+compiled``. Their first training
step, which compiles, is timed apart (``warmup_s``, and ``compile_s``: the compiler's own time); their
decoding runs eager, so it is not timed again. ``--tokens-per-batch 4096,16384`` times
training at each batch size (generation, whose batch is ``--gen-sentences``, at the first only;
``--gen-sentences 0``: none).
``--profile`` also records, per cell and variant, the CUDA kernels of one training step
(torch.profiler) and the attention kernels among them, which name the SDPA backend that ran; and
the device's busy time in that step, against the timed step's length: a step the GPU is busy for
only part of waits on the host, and fewer kernels (or less Python) are what make it faster.
"""

import argparse
import contextlib
import datetime
import gc
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from budget import Budget, Cell, Expected, run  # noqa: E402
from host import cpu_model, host  # noqa: E402
from repo import USER_DIR, import_fairseq_quietly  # noqa: E402  (variants read as a file: no fairseq yet)
from repo import VARIANTS as PLUGIN_VARIANTS  # noqa: E402

VARIANTS = {
    "fairseq": ["--arch", "transformer"],
    **{name: ["--arch", "realformer", *flags] for name, flags in PLUGIN_VARIANTS.items()},
}
DEFAULT_VARIANTS = "fairseq,post-ln,realformer-sum,realformer"
BASELINE = "fairseq"  # measured first in each cell; the ratios are to it
COMPILED = "+compiled"  # a variant's suffix: its layers compiled


def variant_flags(name):
    """The flags of *name*: a VARIANTS entry, or one + ``COMPILED`` (KeyError for anything else)."""
    base = name[: -len(COMPILED)] if name.endswith(COMPILED) else name
    if base != name and base in PLUGIN_VARIANTS:
        return [*VARIANTS[base], "--compile-layers"]
    return VARIANTS[base]  # fairseq+compiled: compiled by hand in ``build``


SIZES = {"6L-6L": 6, "18L-18L": 18}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
PRECISIONS = {
    "fp32": "float32",
    "bf16": "--bf16: bfloat16 autocast, float32 weights",
    "fp16": "--fp16: float16 model, float32 master weights",
}
FP16_LOSS_SCALE = 128.0  # fairseq's --fp16-init-scale
VOCAB = 10000
COMPILE_GUESS_S = 120  # --compile-guess: a compiled variant's first step before any has compiled here
SETUP_GUESS_S = 30  # the first variant's build, first steps and timed steps, before anything is seen


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CPU-sized: 6L-6L only, small batches, 3 repeats")
    p.add_argument("--sizes", help=f"comma list of {', '.join(SIZES)} (default: all; --quick: 6L-6L)")
    p.add_argument("--lengths", default="30,100", help="sentence lengths in tokens (default: %(default)s)")
    p.add_argument(
        "--tokens-per-batch",
        metavar="N[,N...]",
        help="training batch size in target tokens, or a comma list of sizes, each timed "
        "(default: 4096 on GPU, 1024 on CPU, 512 with --quick)",
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
        help="also count the bytes autograd saves for backward in one training forward pass, "
        "in DTYPE at 4096 target tokens (any device): the part of training memory the "
        "attention implementation decides, e.g. bf16 on a CPU for what a GPU would hold",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="count the CUDA kernels of one training step per variant (torch.profiler; none on a CPU) "
        "and name the attention kernels among them",
    )
    p.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="the seconds this run may use: a variant or a memory probe starts only if what it is "
        "expected to take fits in what is left (benchmarks/budget.py); the baseline and the next "
        "variant at the first cell run whatever (default: no limit)",
    )
    p.add_argument(
        "--compile-guess",
        type=float,
        default=COMPILE_GUESS_S,
        metavar="SECONDS",
        help="the first compiled variant's expected compile time, before any has compiled "
        "(default: %(default)s; later ones expect what was seen)",
    )
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
    unknown = [v for v in args.variants if not _known_variant(v)]
    if unknown:
        p.error(
            f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)} (any may end in {COMPILED})"
        )
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


def _known_variant(name):
    try:
        variant_flags(name)
    except KeyError:
        return False
    return True


def build(variant, layers, device, dtype, extra_flags=(), vocab=VOCAB):
    """The variant's model with random weights (the same seed for every variant); *extra_flags*
    after the variant's (e.g. another width), *vocab* symbols in its dictionary."""
    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_MODEL_REGISTRY

    import fairseq_realformer  # noqa: F401

    dictionary = Dictionary()
    for i in range(vocab - dictionary.nspecial):
        dictionary.add_symbol(f"w{i}")
    flags = [
        "/unused",
        "--user-dir",
        str(USER_DIR),
        *variant_flags(variant),
        "--share-all-embeddings",
        "--encoder-layers",
        str(layers),
        "--decoder-layers",
        str(layers),
        "--dropout",
        "0.1",
        *extra_flags,
    ]
    args = options.parse_args_and_arch(options.get_training_parser(), flags)
    task = type("Task", (), {"source_dictionary": dictionary, "target_dictionary": dictionary})
    torch.manual_seed(0)
    model = ARCH_MODEL_REGISTRY[args.arch].build_model(args, task).to(device)
    if dtype != torch.float32:
        model = model.to(dtype)
    if variant == "fairseq" + COMPILED:  # by hand, as a fairseq user could: every layer, every call
        from fairseq_realformer.modules import compiled

        compiled.COMPILE_TIME.watch()
        for layer in [*model.encoder.layers, *model.decoder.layers]:
            layer.compile(dynamic=True)
    return model, dictionary


def batch(dictionary, sentences, length, device, seed=0):
    """Random sentences of *length* tokens (source and target), as fairseq's collater shapes them."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(dictionary.nspecial, len(dictionary), (sentences, length), generator=g)
    tgt = torch.randint(dictionary.nspecial, len(dictionary), (sentences, length), generator=g)
    src[:, -1] = tgt[:, -1] = dictionary.eos()
    prev = torch.cat([tgt[:, -1:], tgt[:, :-1]], dim=1)
    return {
        "net_input": {
            "src_tokens": src.to(device),
            "src_lengths": torch.full((sentences,), length, device=device),
            "prev_output_tokens": prev.to(device),
        },
        "target": tgt.to(device),
    }


class Bench:
    """One variant at one size: its model, optimizer, a training batch and a generator."""

    def __init__(self, variant, layers, length, args):
        from fairseq.sequence_generator import SequenceGenerator

        from fairseq_realformer import precision
        from fairseq_realformer.modules import admin

        self.device = args.device
        self.fp16 = args.dtype == "fp16"
        self.model, self.dictionary = build(variant, layers, args.device, DTYPES["fp16" if self.fp16 else "fp32"])
        self.sample = batch(self.dictionary, max(1, args.tokens_per_batch // length), length, args.device)
        admin.initialize(self.model, self.sample["net_input"])  # before the optimizer, as fairseq-train
        self.params = list(self.model.parameters())
        # fp16: Adam steps a float32 copy, which is copied back into the float16 model (FP16Optimizer)
        self.master = [p.detach().float().requires_grad_() for p in self.params] if self.fp16 else None
        self.optimizer = torch.optim.Adam(self.master or self.params, lr=1e-4, betas=(0.9, 0.98), eps=1e-8)
        self.autocast = (
            (lambda: precision.autocast(torch.device(args.device).type))
            if args.dtype == "bf16"
            else contextlib.nullcontext
        )
        self.tokens = self.sample["target"].numel()
        self.gen_sample = batch(self.dictionary, max(1, args.gen_sentences), length, args.device, seed=1)
        self.generator = SequenceGenerator(
            [self.model], self.dictionary, beam_size=4, max_len_a=0, max_len_b=length, min_len=length
        )
        self.length = length

    def train_steps(self, steps):
        self.model.train()
        for _ in range(steps):
            self.optimizer.zero_grad(set_to_none=True)
            self.model.zero_grad(set_to_none=True)
            with self.autocast():
                logits, _ = self.model(**self.sample["net_input"])
                loss = torch.nn.functional.cross_entropy(
                    logits.float().view(-1, logits.size(-1)), self.sample["target"].view(-1)
                )
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite training loss {loss.item()}")
            if self.fp16:
                (loss * FP16_LOSS_SCALE).backward()
                for master, param in zip(self.master, self.params):
                    master.grad = param.grad.float().mul_(1 / FP16_LOSS_SCALE)
                self.optimizer.step()
                with torch.no_grad():
                    for master, param in zip(self.master, self.params):
                        param.copy_(master)
            else:
                loss.backward()
                self.optimizer.step()
        sync(self.device)

    @torch.no_grad()
    def generate(self):
        self.model.eval()
        with self.autocast():
            hypos = self.generator.forward(self.gen_sample)
        sync(self.device)
        assert all(len(h[0]["tokens"]) == self.length + 1 for h in hypos)  # fixed work: length + EOS


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class Timings:
    """budget.Measurer for speed.py. A cell's baseline (``fairseq``, measured first) stays built
    until the cell's timings end, and every other variant's timed steps alternate with the
    baseline's, repeat by repeat: its paired ratio compares steps taken side by side in time, and
    each variant's record is whole (and written) as soon as it is measured."""

    def __init__(self, args):
        self.args, self.baseline = args, None
        self.fresh_probes = not str(args.device).startswith("cuda")  # peak_memory: a CPU's in a new process

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
        kernels = cuda_kernels_of_a_training_step(bench) if args.profile and not self.fresh_probes else None
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
        print(
            f"[speed {time.strftime('%H:%M:%S')}] {cell.describe()}: {variant} {record['train_tokens_per_s']:.0f} tokens/s, "
            f"first step {warmup_s:.1f} s (compiling {compile_s:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
        return record

    def end_timings(self, cell):
        self.baseline = None
        gc.collect()
        if str(self.args.device).startswith("cuda"):
            torch.cuda.empty_cache()

    def probe(self, variant, cell):
        self.args.tokens_per_batch = cell.tokens
        return peak_memory(self.args, variant, cell.size, cell.length)


# Substrings of the CUDA kernel names of PyTorch's SDPA backends (and of eager attention's pieces).
ATTENTION_KERNELS = {
    "memory-efficient": ("fmha", "efficient_attention", "mem_efficient"),
    "flash": ("flash_fwd", "flash_bwd", "pytorch_flash"),
    "cudnn": ("cudnn", "sm90_xmma_fmha", "generated_fmha"),
}


def busy_us(spans):
    """How long the device was busy over (start, end) spans in µs: their union, so that kernels
    overlapping on two streams count once."""
    busy, reached = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reached:
            busy += end - max(start, reached)
            reached = end
    return busy


def cuda_kernels_of_a_training_step(bench):
    """CUDA kernels launched by one training step of *bench* (torch.profiler): how many in all,
    the ten most frequent names, the attention kernels by SDPA backend, the 40 most frequent ATen
    operators of the step (to tell which ones launched the kernels), and the device's time: how long
    it was busy (``busy_us``; against the step's timed length it says whether the step waits on the
    host) and how much of that the attention kernels took, by backend."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            bench.train_steps(1)
        counts, ops, spans, kernel_us = {}, {}, [], {}
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                counts[event.name] = counts.get(event.name, 0) + 1
                spans.append((event.time_range.start, event.time_range.end))
                kernel_us[event.name] = kernel_us.get(event.name, 0.0) + event.time_range.elapsed_us()
            elif event.name.startswith("aten::"):  # which operators launched them (nested ones too)
                ops[event.name] = ops.get(event.name, 0) + 1
    except Exception as e:  # a profiler that fails must not cost the timings of a lent GPU's run
        return {"error": f"{type(e).__name__}: {e}"}
    backends, attention_us = {}, {}
    for name, n in counts.items():
        for backend, marks in ATTENTION_KERNELS.items():
            if any(mark in name.lower() for mark in marks):
                backends.setdefault(backend, {})[name] = n
                attention_us[backend] = attention_us.get(backend, 0.0) + kernel_us[name]
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:10]
    top_time = sorted(kernel_us.items(), key=lambda kv: -kv[1])[:10]
    top_ops = sorted(ops.items(), key=lambda kv: -kv[1])[:40]
    return {
        "total": sum(counts.values()),
        "distinct": len(counts),
        "attention": backends,
        "top": dict(top),
        "aten_ops": dict(top_ops),
        "busy_us": busy_us(spans),
        "attention_us": attention_us,
        "top_by_time_us": dict(top_time),
    }


def in_fresh_process(args, probe, variant, size, length):
    """Run *probe* ("--memory-probe" or "--saved-probe") for one variant in a new process and
    return the number it prints: memory is measured with nothing else allocated (no other
    variant's model, no leftovers of the timing runs; 18L-18L in one process ran out of 24 GiB)."""
    cmd = [
        sys.executable,
        __file__,
        probe,
        variant,
        size,
        str(length),
        "--device",
        str(args.device),
        "--dtype",
        args.dtype,
        "--tokens-per-batch",
        str(args.tokens_per_batch),
        "--steps",
        str(args.steps),
        *(["--saved-activations", args.saved_activations] if args.saved_activations else []),
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return int(out.strip().splitlines()[-1])


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
        baseline = torch.cuda.memory_allocated()
        bench = Bench(variant, SIZES[size], length, args)
        bench.train_steps(args.steps)
        del bench
        return torch.cuda.max_memory_allocated() - baseline
    return in_fresh_process(args, "--memory-probe", variant, size, length)


def peak_memory_probe(args, variant, size, length):
    """``peak_memory`` on a CPU, run as a fresh process's only work."""
    import fairseq_realformer  # noqa: F401  (imports fairseq before the baseline is taken)

    baseline = rss_bytes("VmRSS")
    bench = Bench(variant, SIZES[size], length, args)
    bench.train_steps(args.steps)
    return rss_bytes("VmHWM") - baseline


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
    lines = [
        f"Device: {device_name(args)}; torch {torch.__version__}; training batch ≈{budgets} "
        f"target tokens, {args.steps} steps × {args.repeats} interleaved repeats (medians); "
        f"generation: beam 4, {args.gen_sentences} sentences per batch",
        "",
        "| size | length | tokens | variant | train tokens/s | × fairseq | peak memory (MiB) | × fairseq | "
        "beam-4 sents/s | × fairseq | paired × fairseq train / gen | spread train / gen |"
        + (" CUDA kernels / step | × fairseq | GPU busy / step | attention kernels (ms) |" if args.profile else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|---|" if args.profile else ""),
    ]
    cell = lambda r: (r["size"], r["length"], r["tokens_per_batch"])  # noqa: E731
    base = {cell(r): r for r in runs if r["variant"] == "fairseq"}
    for r in runs:
        b = base.get(cell(r))
        ratio = lambda key: f"{r[key] / b[key]:.3f}" if b and b.get(key) and r.get(key) else "—"  # noqa: E731
        gen = f"{r['gen_sents_per_s']:.2f}" if "gen_sents_per_s" in r else "—"
        gen_spread = f"{r['gen_spread']:.0%}" if "gen_spread" in r else "—"
        line = (
            f"| {r['size']} | {r['length']} | {r['tokens_per_batch']} | {r['variant']} | "
            f"{r['train_tokens_per_s']:.0f} | {ratio('train_tokens_per_s')} | {mib(r.get('peak_mem_bytes'))} | "
            f"{ratio('peak_mem_bytes')} | {gen} | {ratio('gen_sents_per_s')} | {paired(r)} | "
            f"{r['train_spread']:.0%} / {gen_spread} |"
        )
        if args.profile:
            kernels, base_kernels = r.get("cuda_kernels"), (b or {}).get("cuda_kernels")
            counted = kernels and "total" in kernels
            count = f"{kernels['total']}" if counted else "—"
            times = (
                f"{kernels['total'] / base_kernels['total']:.3f}"
                if counted and base_kernels and base_kernels.get("total")
                else "—"
            )
            line += f" {count} | {times} | {busy_share(r)} | {attention_ms(r)} |"
        lines.append(line)
    lines += [
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
    base = {(r["size"], r["length"], r["tokens_per_batch"]): r for r in runs if r["variant"] == BASELINE}
    lines = [
        "| cell | variant | tokens/s | paired × fairseq | memory × fairseq | first step (compiling) |",
        "|" + "---|" * 6,
    ]
    for r in runs:
        b = base.get((r["size"], r["length"], r["tokens_per_batch"]), {})
        memory = "—"
        if r.get("peak_mem_bytes") and b.get("peak_mem_bytes"):
            memory = f"{r['peak_mem_bytes'] / b['peak_mem_bytes']:.3f}"
        ratio = "—" if r.get("train_ratio_paired") is None else f"{r['train_ratio_paired']:.3f}"
        lines.append(
            f"| {r['size']}/{r['length']}/{r['tokens_per_batch']} | {r['variant']} | {r['train_tokens_per_s']:.0f} | "
            f"{ratio} | {memory} | {r['warmup_s']:.1f} s ({r['compile_s']:.1f} s) |"
        )
    lines += [
        f"skipped: {s['what']} of {s['variant']} at {s['size']}/{s['length']}/{s['tokens_per_batch']}" for s in skipped
    ]
    if budget is not None and budget.seconds is not None:
        lines.append(f"budget: {budget.used():.0f} s used of {budget.seconds:.0f} s; {len(skipped)} steps skipped")
    return "\n".join(lines)


def main():
    args = parse_args()
    if args.summary:
        result = json.loads(Path(args.summary).read_text())
        print(f"{result['device']}; {result['date']}")
        print(short_table(result["runs"], result.get("skipped", []), None))
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
    # the question first: the baseline and the next variant given (the GPU command: the compiled
    # RealFormer) at the first cell; then the other variants; then each larger batch, size, length
    cells = [
        Cell(size, SIZES[size], length, tokens)
        for length in args.lengths
        for size in args.sizes
        for tokens in args.token_budgets
    ]
    variants = sorted(args.variants, key=lambda v: v != BASELINE)  # every other variant is paired with it
    expected = Expected(args.compile_guess, SETUP_GUESS_S, BASELINE)
    budget = Budget(args.budget)
    runs, skipped = run(
        cells,
        variants,
        Timings(args),
        budget,
        expected,
        lambda runs, skipped: write_json(args, runs, [], skipped, budget),
    )
    args.tokens_per_batch = args.token_budgets[0]
    saved = count_saved_activations(args) if args.saved_activations else []
    write_json(args, runs, saved, skipped, budget)
    print(report(args, runs, skipped, budget), flush=True)


def count_saved_activations(args):
    """--saved-activations: each variant's bytes saved for backward per cell, in a fresh process
    each; printed as a table and returned for the JSON."""
    lines = [
        "",
        f"Tensors saved for backward, one training forward pass of 4096 target tokens in {args.saved_activations}:",
        "",
        "| size | length | variant | MiB | × fairseq |",
        "|---|---|---|---|---|",
    ]
    saved = []
    for size in args.sizes:
        for length in args.lengths:
            cell = {v: in_fresh_process(args, "--saved-probe", v, size, length) for v in args.variants}
            for v, n in cell.items():
                saved.append(
                    {
                        "variant": v,
                        "size": size,
                        "length": length,
                        "dtype": args.saved_activations,
                        "saved_for_backward_bytes": n,
                    }
                )
                ratio = f"{n / cell['fairseq']:.3f}" if "fairseq" in cell else "—"
                lines.append(f"| {size} | {length} | {v} | {n / 2**20:.0f} | {ratio} |")
    print("\n".join(lines))
    return saved


def write_result(path, script, argv, device, machine, **content):
    """A benchmark's JSON at *path*: the command that wrote it (``python benchmarks/SCRIPT ARGV``),
    the date, the device and the machine, torch's version, then *content* (settings, runs, ...)."""
    header = {
        "command": shlex.join(["python", f"benchmarks/{script}", *argv]),
        "date": datetime.date.today().isoformat(),
        "device": device,
        "machine": machine,
        "torch": torch.__version__,
    }
    Path(path).write_text(json.dumps({**header, **content}, indent=1))


def write_json(args, runs, saved, skipped, budget):
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k not in ("json", "memory_probe", "saved_probe")}
        write_result(
            args.json,
            "speed.py",
            sys.argv[1:],
            device_name(args),
            machine(args),
            settings=settings,
            budget={"seconds": budget.seconds, "used_s": round(budget.used(), 1)},
            runs=runs,
            skipped=skipped,
            saved_for_backward=saved,
        )


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count()))
    main()
