"""Kernels per training step and per beam decode: RealFormer against fairseq's own Transformer,
counted, not timed (issue 41). On a GPU, at a few thousand tokens a batch, a step is bound by kernel
launches, so the number of kernels predicts the time; on this CPU it is counted exactly and the same
every run.

Measured for each variant and size (6L-6L, 18L-18L: 512/2048/8, the weights of speed.py's ``build``)
and sentence length (30 and 100 tokens), on the CPU, in float32 or (``--precision bf16``) under the
plugin's --bf16 autocast, whose casts a GPU runs as copy kernels:
    train ops     ATen operations of one training step: the model's forward on 16 sentences of
                  LENGTH tokens, the cross-entropy loss as speed.py's ``Bench.train_steps`` takes it,
                  and ``loss.backward()`` (no optimizer step; the gradients start empty)
    decode ops    ATen operations of one ``SequenceGenerator`` call: beam 4, 4 sentences, every
                  hypothesis forced to LENGTH tokens + EOS (min_len = max_len, as speed.py)
    saved         bytes autograd keeps for backward in the training forward of the model (distinct
                  storages, as speed.py's ``saved_for_backward_bytes``), for this batch
    saved (GPU)   the same, with each ``scaled_dot_product_attention`` call keeping what PyTorch's
                  fused GPU kernels keep (flash, memory-efficient, cuDNN): its inputs as given (a
                  view keeps its base), the bias, the output and a float32 log-sum-exp per query
                  row. On this CPU a call with a bias, or with queries wider than the values, runs
                  PyTorch's math path, which keeps its own intermediates besides; a GPU kernel does
                  not. A model of the kernels, not a measurement on a GPU.
each also as a ratio to fairseq's ``transformer`` at the same size and length. The counts do not
depend on the batch size; the saved bytes do. ADMIN's ω is profiled (``admin.initialize``) before
anything is counted, as fairseq-train does before its first step.

Counting rules:
  - Every ATen operation dispatched, forward and backward (``loss.backward()`` runs inside the
    counting ``TorchDispatchMode``), counted by its name (``add``, ``mm``, ...; overloads together).
  - Views and metadata-only operations are left out: every operation whose schema says it returns a
    view (``OpOverload.is_view``: view, t, transpose, expand, permute, slice, select, split, detach,
    ...) and those of ``NO_KERNEL_OPS`` (``_unsafe_view``, allocations without a fill, ...). What
    was left out is kept in the JSON, by name. Real copies and casts (``clone``, ``copy_``,
    ``_to_copy``) count.
  - A fused attention call (``scaled_dot_product_attention``) counts once forward
    (``fused_attention``) and once backward (``fused_attention_backward``), whatever backend this
    CPU picks for it: a ``TorchFunctionMode`` catches the call, also inside fairseq's path through
    ``F.multi_head_attention_forward``, and runs it unchanged inside a ``torch.autograd.Function``
    while the counting pauses. PyTorch's CPU attention kernels never reach the count; the script
    stops if one does (an uncaught call).
  - The counting changes no number: at each variant's first size and length, each step also runs
    without it first, with the same seed, and the loss, every gradient and every hypothesis must be
    equal bit for bit. The saved-bytes forward runs before the counted step, so nothing that a
    model builds on its first call is counted (the counts with and without the check are equal).

Variants: speed.py's (``fairseq`` and those of fairseq_realformer/variants.py), and as there a plugin
variant's name with ``+eager``, ``+fused`` or ``+concat`` appended runs its residual attention that way
(``--residual-attention-kernel``; the plain name is ``auto``).

    python benchmarks/kernel_count.py                    # default variants, both sizes and lengths
    python benchmarks/kernel_count.py --sizes 6L-6L --lengths 30 --breakdown realformer
    python benchmarks/kernel_count.py --variants fairseq,realformer+eager,realformer+fused --json counts.json
    python benchmarks/kernel_count.py --precision bf16 --sizes 6L-6L --breakdown realformer+fused
"""

import argparse
import contextlib
import inspect
import platform
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode, redispatch_function
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # noqa: E402

DEFAULT_VARIANTS = "fairseq,post-ln,admin,post-ln-realformer,realformer,realformer-sum"
TRAIN_SENTENCES = 16
DECODE_SENTENCES = 4
BEAM = 4
SEED = 1
# operations that launch no kernel but are not views by their schema: a result that reuses its
# input's memory (_unsafe_view) or memory allocated and not written (the empty family)
NO_KERNEL_OPS = frozenset(
    {"_unsafe_view", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_"}
)
FUSED, FUSED_BACKWARD = "fused_attention", "fused_attention_backward"
PRECISIONS = ("fp32", "bf16")
# the same builtin in torch 2.13; both named so that a Python wrapper around one is still caught
SDPA = (F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention)
# what an uncaught scaled_dot_product_attention decomposes into on this CPU
UNCAUGHT_ATTENTION = ("scaled_dot_product", "_fused_sdp_choice")
COUNTING_RULES = {
    "counted": "every ATen operation dispatched in the step (forward and backward), by overload packet name",
    "excluded": "operations with OpOverload.is_view, and no_kernel_ops",
    "no_kernel_ops": sorted(NO_KERNEL_OPS),
    "fused_attention": f"a scaled_dot_product_attention call counts as one '{FUSED}' and, in training, "
    f"one '{FUSED_BACKWARD}', whatever backend runs it",
    "excluded_seen": "each run's excluded_by_name: what was left out, by name",
    "checked": "a run with checked true computed, counted, the same loss, gradients and hypotheses bit for bit "
    "as uncounted (each variant's first size and length)",
}


def known(name):
    try:
        speed.variant_flags(name)
    except KeyError:
        return False
    return True


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--variants",
        default=DEFAULT_VARIANTS,
        help=f"comma list of {', '.join(speed.VARIANTS)}; a plugin variant may end in "
        f"{' or '.join(speed.KERNEL_SUFFIXES)} (default: %(default)s)",
    )
    p.add_argument(
        "--sizes", default=",".join(speed.SIZES), help=f"comma list of {', '.join(speed.SIZES)} (default: %(default)s)"
    )
    p.add_argument("--lengths", default="30,100", help="sentence lengths in tokens (default: %(default)s)")
    p.add_argument(
        "--breakdown",
        metavar="VARIANT",
        help="also print VARIANT's operations by name beside fairseq's, the largest differences first",
    )
    p.add_argument("--top", type=int, default=10, help="operation names per breakdown table (default: %(default)s)")
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="fp32, or bf16: the plugin's --bf16, bfloat16 autocast around the forward and the loss (not "
        "the backward) and around the decode, float32 weights; its casts are counted (default: %(default)s)",
    )
    p.add_argument("--json", help="also write the numbers here, with every count by operation name")
    args = p.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    args.sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    try:
        args.lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    except ValueError:
        p.error(f"--lengths: not a comma list of integers: {args.lengths}")
    variant_choices = f"{', '.join(speed.VARIANTS)} (a plugin variant may end in {' or '.join(speed.KERNEL_SUFFIXES)})"
    for flag, given, ok, choices in (
        ("--variants", args.variants, known, variant_choices),
        ("--sizes", args.sizes, lambda s: s in speed.SIZES, ", ".join(speed.SIZES)),
    ):
        unknown = [x for x in given if not ok(x)]
        if unknown or not given:
            p.error(f"{flag}: {'unknown ' + ', '.join(unknown) if unknown else 'nothing given'}; choose from {choices}")
    if not args.lengths or min(args.lengths) < 1:
        p.error(f"--lengths: {'nothing given' if not args.lengths else 'not positive: ' + str(min(args.lengths))}")
    if args.breakdown and not known(args.breakdown):
        p.error(f"--breakdown: unknown {args.breakdown}; choose from {variant_choices}")
    if args.breakdown:  # it sets the variant beside fairseq: count both
        args.variants += [v for v in dict.fromkeys(("fairseq", args.breakdown)) if v not in args.variants]
    return args


class OpCounter(TorchDispatchMode):
    """Counts the ATen operations dispatched under it, by name; views and no-kernel ops apart."""

    def __init__(self):
        super().__init__()
        self.counts, self.excluded = Counter(), Counter()
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            name = func.overloadpacket.__name__
            (self.excluded if func.is_view or name in NO_KERNEL_OPS else self.counts)[name] += 1
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def pause(self):
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1


class FusedAttention(torch.autograd.Function):
    """One attention call as one counted operation forward and one backward. The real call and its
    real backward run uncounted on detached inputs: the numbers are those of calling it directly."""

    @staticmethod
    def forward(ctx, counter, call, *tensors):
        counter.counts[FUSED] += 1
        with counter.pause():
            inputs = [t.detach().requires_grad_(t.requires_grad) for t in tensors]
            with torch.enable_grad():
                out = call(*inputs)
            ctx.counter, ctx.out = counter, out
            ctx.inputs = [x for x in inputs if x.requires_grad]
            ctx.wanted = [t.requires_grad for t in tensors]
            return out.detach()

    @staticmethod
    def backward(ctx, grad_out):
        ctx.counter.counts[FUSED_BACKWARD] += 1
        with ctx.counter.pause():
            grads = iter(torch.autograd.grad(ctx.out, ctx.inputs, grad_out, allow_unused=True))
        return (None, None, *(next(grads) if wanted else None for wanted in ctx.wanted))


class AttentionAsOneOp(TorchFunctionMode):
    """Catches every ``scaled_dot_product_attention`` call and counts it as one operation."""

    def __init__(self, counter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SDPA:
            return self.attend(func, args, kwargs)
        if inspect.isfunction(func) and func.__module__ == "torch.nn.functional":
            # a mode is off while its handler runs, so the SDPA call inside F.multi_head_attention_forward
            # (fairseq's training self-attention) would pass uncaught: run the body with the mode on
            with self:
                return redispatch_function(func, types, args, kwargs)
        return func(*args, **kwargs)

    def attend(self, func, args, kwargs):
        tensors, call = tensor_call(func, args, kwargs)
        if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):  # decoding: no backward
            self.counter.counts[FUSED] += 1
            with self.counter.pause():
                return func(*args, **kwargs)
        return FusedAttention.apply(self.counter, call, *tensors)


def tensor_call(func, args, kwargs):
    """The tensors among *func*'s arguments, and *func* as a function of those tensors alone (the
    other arguments fixed): what an autograd Function around the call takes."""
    leaves, spec = tree_flatten((args, kwargs))
    where = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def call(*inputs):
        new = list(leaves)
        for i, x in zip(where, inputs):
            new[i] = x
        call_args, call_kwargs = tree_unflatten(new, spec)
        return func(*call_args, **call_kwargs)

    return [leaves[i] for i in where], call


class Counting:
    """A region to count: ``step(..., counting=Counting())``; then ``.counts`` and ``.excluded`` by name."""

    def __init__(self):
        self.counter = OpCounter()
        self.counts, self.excluded = self.counter.counts, self.counter.excluded
        self.modes = contextlib.ExitStack()

    def __enter__(self):
        self.modes.enter_context(self.counter)
        self.modes.enter_context(AttentionAsOneOp(self.counter))
        return self

    def __exit__(self, *exc):
        self.modes.close()
        uncaught = [name for name in self.counts if any(s in name for s in UNCAUGHT_ATTENTION)]
        if uncaught and exc[0] is None:
            raise RuntimeError(f"attention ran as ATen operations the count does not know: {', '.join(uncaught)}")


def autocast(precision):
    """Where the plugin's --bf16 computes in bfloat16 (``precision.autocast``), or nothing (fp32)."""
    from fairseq_realformer import precision as bf16

    return bf16.autocast("cpu") if precision == "bf16" else contextlib.nullcontext()


def train_step(model, sample, counting=None, precision="fp32"):
    """Forward, loss and backward as speed.py's Bench.train_steps, without the optimizer step;
    under bf16 the forward and the loss run in the autocast and the backward outside it, as
    fairseq-train's --bf16 runs them with the plugin."""
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(SEED)  # the same dropout masks with and without the counting
    with counting or contextlib.nullcontext():
        with autocast(precision):
            logits, _ = model(**sample["net_input"])
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), sample["target"].view(-1))
        loss.backward()
    return [loss.detach(), *(p.grad for p in model.parameters())]


class KeepsWhatAGpuKernelKeeps(torch.autograd.Function):
    """An attention call that keeps for backward what a fused GPU kernel keeps (``saved (GPU)``):
    *tensors* (the inputs, the bias among them), the output and a float32 log-sum-exp per query
    row. Its forward runs the real call without a graph; it has no backward (it is only measured)."""

    @staticmethod
    def forward(ctx, call, *tensors):
        with torch.no_grad():
            out = call(*tensors)
        log_sum_exp = out.new_empty(out.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(*tensors, out, log_sum_exp)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        raise RuntimeError("KeepsWhatAGpuKernelKeeps is for measuring what is saved, not for backward")


class AttentionSavesAsOnAGpu(AttentionAsOneOp):
    """Catches every ``scaled_dot_product_attention`` call, as ``AttentionAsOneOp``, and keeps what a
    fused GPU kernel would keep for it (``KeepsWhatAGpuKernelKeeps``)."""

    def __init__(self):
        super().__init__(counter=None)

    def attend(self, func, args, kwargs):
        tensors, call = tensor_call(func, args, kwargs)
        return KeepsWhatAGpuKernelKeeps.apply(call, *tensors)


def saved_for_backward_bytes(model, sample, precision="fp32", as_on_a_gpu=False):
    """Bytes of the distinct storages autograd keeps for backward in one training forward; with
    *as_on_a_gpu*, each attention call keeping what a fused GPU kernel keeps."""
    storages = {}

    def keep(t):
        # the storage, alive till the forward ends (a freed one's address would be reused); not
        # the tensor: a saved output packed as itself holds its own node, a cycle no collection frees
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage

    def never_unpacked(_):
        raise RuntimeError("saved_for_backward_bytes' graph is not for backward")

    model.train()
    torch.manual_seed(SEED)
    attention = AttentionSavesAsOnAGpu() if as_on_a_gpu else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(keep, never_unpacked), autocast(precision), attention:
        model(**sample["net_input"])
    return sum(storage.nbytes() for storage in storages.values())


@torch.no_grad()
def decode(generator, sample, length, counting=None, precision="fp32"):
    generator.model.eval()
    torch.manual_seed(SEED)
    with counting or contextlib.nullcontext(), autocast(precision):
        hypos = generator.forward(sample)
    assert all(len(h[0]["tokens"]) == length + 1 for h in hypos)  # fixed work: length + EOS
    return [h[key] for sentence in hypos for h in sentence for key in ("tokens", "score", "positional_scores")]


def assert_equal(plain, counted, what):
    """The counting must not change a number: the same tensors bit for bit."""
    if len(plain) != len(counted) or not all(
        (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
        for a, b in zip(plain, counted)
    ):
        raise AssertionError(f"{what}: the counted run computed other numbers than the plain run")


def count(variant, size, length, check, precision="fp32"):
    """One variant at one size and length: its operations and saved bytes. With *check*, each step
    also runs without the counting first, and must compute the same numbers."""
    from fairseq.sequence_generator import SequenceGenerator

    from fairseq_realformer.modules import admin

    model, dictionary = speed.build(variant, speed.SIZES[size], "cpu", torch.float32)
    sample = speed.batch(dictionary, TRAIN_SENTENCES, length, "cpu")
    admin.initialize(model, sample["net_input"])  # ω profiled here, not in the counted step
    saved = saved_for_backward_bytes(model, sample, precision)
    saved_gpu = saved_for_backward_bytes(model, sample, precision, as_on_a_gpu=True)
    plain = train_step(model, sample, precision=precision) if check else None
    train = Counting()
    counted = train_step(model, sample, train, precision)
    if check:
        assert_equal(plain, counted, f"{variant}, training step")
    del plain, counted
    model.zero_grad(set_to_none=True)
    generator = SequenceGenerator([model], dictionary, beam_size=BEAM, max_len_a=0, max_len_b=length, min_len=length)
    gen_sample = speed.batch(dictionary, DECODE_SENTENCES, length, "cpu", seed=1)
    plain = decode(generator, gen_sample, length, precision=precision) if check else None
    gen = Counting()
    counted = decode(generator, gen_sample, length, gen, precision)
    if check:
        assert_equal(plain, counted, f"{variant}, beam decode")
    return {
        "variant": variant,
        "size": size,
        "length": length,
        "flags": speed.variant_flags(variant),
        "precision": precision,
        "checked": check,
        "train_ops": sum(train.counts.values()),
        "decode_ops": sum(gen.counts.values()),
        "saved_for_backward_bytes": saved,
        "saved_for_backward_bytes_gpu_kernels": saved_gpu,
        "train_ops_by_name": dict(sorted(train.counts.items())),
        "decode_ops_by_name": dict(sorted(gen.counts.items())),
        "excluded_by_name": {
            "train": dict(sorted(train.excluded.items())),
            "decode": dict(sorted(gen.excluded.items())),
        },
    }


def device_name(precision="fp32"):
    return f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads ({precision})"


def report(runs, precision):
    lines = [
        f"Device: {device_name(precision)}; torch {torch.__version__}; training step: forward, cross-entropy and "
        f"backward of {TRAIN_SENTENCES} sentences × LENGTH tokens; decode: beam {BEAM}, {DECODE_SENTENCES} "
        "sentences, LENGTH tokens + EOS each; saved: bytes kept for backward by the training forward; "
        "saved (GPU): the same, each attention call keeping what a fused GPU kernel keeps",
        "",
        "| size | length | variant | train ops | × fairseq | decode ops | × fairseq | saved (MiB) | × fairseq "
        "| saved (GPU) (MiB) | × fairseq |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {(r["size"], r["length"]): r for r in runs if r["variant"] == "fairseq"}
    for r in runs:
        b = base.get((r["size"], r["length"]))
        ratio = lambda key: f"{r[key] / b[key]:.3f}" if b else "—"  # noqa: E731
        lines.append(
            f"| {r['size']} | {r['length']} | {r['variant']} | {r['train_ops']:,} | {ratio('train_ops')} | "
            f"{r['decode_ops']:,} | {ratio('decode_ops')} | {r['saved_for_backward_bytes'] / 2**20:.1f} | "
            f"{ratio('saved_for_backward_bytes')} | {r['saved_for_backward_bytes_gpu_kernels'] / 2**20:.1f} | "
            f"{ratio('saved_for_backward_bytes_gpu_kernels')} |"
        )
    lines += [
        "",
        "ATen operations dispatched, views and metadata-only operations excluded, a fused attention call "
        f"counted once forward and once backward (the rules: {Path(__file__).name}'s docstring).",
    ]
    return "\n".join(lines)


def breakdown(runs, variant, top):
    """*variant*'s operations by name beside fairseq's, the largest differences first."""
    lines = []
    cells = {(r["size"], r["length"], r["variant"]): r for r in runs}
    for size, length in dict.fromkeys((r["size"], r["length"]) for r in runs):
        ours, theirs = cells[size, length, variant], cells[size, length, "fairseq"]
        for step in ("train", "decode"):
            a, b = ours[f"{step}_ops_by_name"], theirs[f"{step}_ops_by_name"]
            names = sorted(set(a) | set(b), key=lambda n: (-abs(a.get(n, 0) - b.get(n, 0)), n))[:top]
            lines += [
                "",
                f"{size}, length {length}, {step}: {variant} against fairseq, the {top} largest differences "
                f"(total {sum(a.values()):,} against {sum(b.values()):,})",
                "",
                f"| operation | {variant} | fairseq | difference |",
                "|---|---|---|---|",
                *(f"| {n} | {a.get(n, 0):,} | {b.get(n, 0):,} | {a.get(n, 0) - b.get(n, 0):+,} |" for n in names),
            ]
    return "\n".join(lines)


def main():
    args = parse_args()
    runs, checked = [], set()
    for size in args.sizes:
        for length in args.lengths:
            for v in args.variants:
                start = time.perf_counter()
                runs.append(count(v, size, length, check=v not in checked, precision=args.precision))
                checked.add(v)
                print(
                    f"[kernel_count] {size}, length {length}, {v}: {time.perf_counter() - start:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
    print(report(runs, args.precision))
    if args.breakdown:
        print(breakdown(runs, args.breakdown, args.top))
    if args.json:
        settings = {
            "variants": args.variants,
            "sizes": args.sizes,
            "lengths": args.lengths,
            "train_sentences": TRAIN_SENTENCES,
            "decode_sentences": DECODE_SENTENCES,
            "beam": BEAM,
            "seed": SEED,
            "dtype": args.precision,
        }
        speed.write_result(
            args.json,
            "kernel_count.py",
            sys.argv[1:],
            device_name(args.precision),
            speed.machine(argparse.Namespace(device="cpu")),
            settings=settings,
            counting_rules=COUNTING_RULES,
            runs=runs,
        )


if __name__ == "__main__":
    main()
