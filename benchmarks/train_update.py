"""fairseq-train's update as users run it: ATen ops and host milliseconds per update by phase,
words/s, the wall time to the last update and peak memory, for fairseq's own ``transformer``
(fairseq alone: no ``--user-dir``) beside RealFormer with fairseq's update (``--fairseq-update``),
with the plugin's fast update (its default, fairseq_realformer/optim/fast_update.py) and with the fast
update and ``--compile-layers``.

Every configuration is one fairseq-train run (``fairseq_cli.train.cli_main``) in a process of its
own, started through this file's ``--child`` runner, which instruments fairseq's ``Trainer`` and
nothing else: fairseq's baseline never imports the plugin. In the updates ``--count`` names
(after warm-up) a ``TorchDispatchMode`` counts every ATen op that ``Trainer.train_step``
dispatches, charged to the phase that runs it; in the updates after ``--skip`` (not counted)
``time.perf_counter`` times the same phases. The phases are what fairseq's ``train_step`` calls:

=============  ==========================================================================
forward        the model's forward (a hook on ``trainer.model``)
loss           the criterion around it: its loss and logging outputs (hooks on the criterion)
backward       ``optimizer.backward`` (``--fp16``: the loss scaled, then ``backward``)
grad norm      ``trainer.clip_grad_norm`` (the norm; with ``--clip-norm``, the clip)
optimizer      ``task.optimizer_step`` (Adam's step; ``--fp16``: the masters' copy back)
rest           everything else in ``train_step``: zeroing, ``multiply_grads`` (``--fp16``: the
               copy of the gradients into the float32 masters), the finite check, the logging
=============  ==========================================================================

A phase's host ms is its wall time on the host: on a CPU its arithmetic and the host work; on a
GPU the time to issue its kernels, plus any wait for the device where fairseq syncs (the finite
check in the gradient norm, the logged statistics). At ``d=16`` arithmetic vanishes and the ms are
host work. words/s is the median of fairseq's logged ``wps`` over the ``--log-interval``
intervals after ``--skip`` updates; ``wall s`` is the whole fairseq-train process (imports, data,
compiling); peak memory is the process's peak RSS on a CPU, ``torch.cuda.max_memory_allocated``
on a GPU.

Configurations (``--configs``): ``fairseq``, ``realformer-fairseq-update``, ``realformer+compiled``
and every variant of fairseq_realformer/variants.py (``realformer``, ``pre-ln``,
``pre-ln-denseformer``, ...); each may end in ``@fp32``, ``@fp16`` (fairseq's ``--fp16``) or ``@bf16``
(the plugin's autocast mixed precision; fairseq's own ``--bf16`` needs a TPU, so the baseline has
none) to override ``--precision``, and in ``/cudnn-off`` to train with PyTorch's cuDNN attention
backend off (``torch.backends.cuda.enable_cudnn_sdp(False)``, set by the runner). ``realformer`` is
the paper's model (variants.py "realformer": residual attention on all paths, running mean, on
ADMIN with ω profiled). Sizes (``--sizes``): ``6L-6L`` or ``18L-18L``, ``:WIDTH`` for a width other
than 512 (FFN 4×, 8 heads at 512, 4 from 128, 2 below), e.g. ``6L-6L:16``. Data: the toy corpus
(scripts/toy_corpus.py) or Multi30k (binarised as examples/multi30k/run.sh --prepare-only does).
A configuration starts only if what it is expected to take fits in ``--budget`` (benchmarks/
budget.py); the JSON is written after every one, so a stopped run keeps what it measured.

    python benchmarks/train_update.py --sizes 6L-6L:16,18L-18L:16,6L-6L:128 --updates 30 --budget 1500 \\
        --json benchmarks/results/cpu-train-update-ops.json          # a 2-core CPU, ~25 minutes
    python benchmarks/train_update.py --sizes 6L-6L --precision fp16 --updates 200 --skip 50 \\
        --configs fairseq,realformer+compiled,fairseq/cudnn-off,fairseq@fp32 --json gpu.json  # a GPU
    python benchmarks/train_update.py --summary benchmarks/results/cpu-train-update-ops.json
"""

if __name__ == "__main__" and not __package__:  # run by its path, from any folder: as `python -m` its module
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # this checkout: its packages, first
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    safe = ["-P"] if sys.version_info >= (3, 11) else []  # -P: no package of the folder it runs in (another checkout)
    os.execve(sys.executable, [sys.executable, *safe, "-m", "benchmarks.train_update", *sys.argv[1:]], env)

import argparse
import collections
import contextlib
import json
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks.bench import run_logged, say, train_log, write_json
from benchmarks.budget import MARGIN, Budget, Cell, Expected
from common.host import host
from common.repo import USER_DIR, VARIANTS

PHASES = ("forward", "loss", "backward", "grad_norm", "optimizer", "rest")
PHASE_NAMES = {"grad_norm": "grad norm / clip", "rest": "rest (logging, zeroing, ...)"}
BASELINE = "fairseq"
CONFIGS = {
    "fairseq": ["--arch", "transformer_wmt_en_de"],  # fairseq as its users have it: no --user-dir
    "realformer-fairseq-update": ["--arch", "realformer_wmt_en_de", *VARIANTS["realformer"], "--fairseq-update"],
    **{name: ["--arch", "realformer_wmt_en_de", *flags] for name, flags in VARIANTS.items()},  # "realformer", ...
    "realformer+compiled": ["--arch", "realformer_wmt_en_de", *VARIANTS["realformer"], "--compile-layers"],
}
PRECISIONS = {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"]}
CUDNN_OFF = "/cudnn-off"
DEFAULT_CONFIGS = "fairseq,realformer-fairseq-update,realformer,realformer+compiled"
# --max-tokens for ~N target tokens an update: fairseq's --max-tokens caps the padded source or
# target of a batch (the longer), and what it holds of target tokens (fairseq's logged wpb) is less
MAX_TOKENS_PER_TARGET = {"toy": 1.04, "multi30k": 1.2}  # toy: 4,260 max tokens held 4,100 (wpb)
COMPILE_GUESS_S = 120  # the first compiled run's compiling, before any was seen (budget.py)
SETUP_GUESS_S = 60  # the first run's imports, data and updates, before any was seen
FAST_LINE = re.compile(r"fast update: (.*)$", re.M)


# ---------------------------------------------------------------------------------------------
# Counting and timing inside fairseq-train (the runner; also imported by tests/test_update_ops.py)


class Phases:
    """Which phase of one ``train_step`` runs now, and what each phase cost: ATen ops counted
    into the phase on top of the stack, host seconds charged to it exclusively (a phase inside
    another, the forward inside the loss, pauses the outer one's clock). The root is ``rest``."""

    def __init__(self):
        self.stack = ["rest"]
        self.ops = collections.Counter()  # ops that compute: no views, no profiler marks
        self.all_ops = collections.Counter()  # every op dispatched
        self.op_names = collections.defaultdict(collections.Counter)
        self.seconds = collections.defaultdict(float)
        self.mark = time.perf_counter()

    def _charge(self):
        now = time.perf_counter()
        self.seconds[self.stack[-1]] += now - self.mark
        self.mark = now

    def enter(self, phase):
        self._charge()
        self.stack.append(phase)

    def leave(self):
        self._charge()
        if len(self.stack) > 1:
            self.stack.pop()

    def finish(self):
        self._charge()
        return self


def computes(func) -> bool:
    """Whether ATen op *func* is one that does work: not a view (``view``, ``t``, ``detach``: what
    ``p.grad.data`` dispatches), not the profiler's ``record_function`` marks around fairseq's
    phases. ``Phases.all_ops`` counts those too."""
    return not (func.is_view or func.overloadpacket.__name__.startswith("_record_function"))


def op_counter(phases):
    """A TorchDispatchMode that counts every ATen op dispatched while it is on into *phases*
    (by phase and by op; ``computes``). Ops a multi-tensor op runs inside itself are not
    dispatched again. A ``torch.compile``d region runs compiled under it (dynamo runs eager
    under a mode that does not ignore compile internals), and what its compiled code dispatches
    (inductor's extern kernels: matrix products, ...) is counted."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounter(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls):  # compiled code runs compiled: its own dispatches counted
            return True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            phase = phases.stack[-1]
            phases.all_ops[phase] += 1
            if computes(func):
                phases.ops[phase] += 1
                phases.op_names[phase][str(func.overloadpacket.__name__)] += 1
            return func(*args, **(kwargs or {}))

    return OpCounter()


class Instrument:
    """fairseq's ``Trainer.train_step`` wrapped (``with Instrument(...)``): the
    updates in *count* run under ``op_counter``, those in *time* are timed by phase, and every
    update's own wall time is kept. An update is numbered from 1, as fairseq's log numbers it."""

    def __init__(self, count=(), time=()):
        self.count, self.time = set(count), set(time)
        self.counted = {}  # update -> {"ops": {phase: n}, "op_names": {phase: {op: n}}}
        self.timed = {}  # update -> {phase: ms, "total": ms}
        self.update_ms = {}  # update -> ms of its train_step, every update
        self.first_step_start = self.last_step_end = None
        self.tensors = None  # the optimizer's parameter tensors
        self._current = None
        self._original = None

    # the phases' wrappers, installed on the trainer's own objects at its first update
    def _wrap(self, owner, name, phase):
        function = getattr(owner, name)

        def wrapped(*args, **kwargs):
            if self._current is None:
                return function(*args, **kwargs)
            self._current.enter(phase)
            try:
                return function(*args, **kwargs)
            finally:
                self._current.leave()

        setattr(owner, name, wrapped)

    def _hooks(self, module, phase):
        module.register_forward_pre_hook(lambda *_: self._current and self._current.enter(phase))
        module.register_forward_hook(lambda *_: self._current and self._current.leave())

    def _instrument(self, trainer):
        if getattr(trainer, "_train_update_instrumented", False):
            return
        trainer._train_update_instrumented = True
        optimizer = trainer.optimizer  # built now if not yet, as train_step would
        self.tensors = len(list(optimizer.params))
        self._hooks(trainer.criterion, "loss")
        self._hooks(trainer.model, "forward")
        self._wrap(optimizer, "backward", "backward")
        self._wrap(trainer, "clip_grad_norm", "grad_norm")
        self._wrap(trainer.task, "optimizer_step", "optimizer")

    def __enter__(self):
        import fairseq.trainer

        original = self._original = fairseq.trainer.Trainer.train_step
        instrument = self

        def train_step(trainer, samples, raise_oom=False):
            instrument._instrument(trainer)
            update = trainer.get_num_updates() + 1
            counting, timing = update in instrument.count, update in instrument.time
            phases = Phases() if counting or timing else None
            start = time.perf_counter()
            if instrument.first_step_start is None:
                instrument.first_step_start = start
            instrument._current = phases
            try:
                with op_counter(phases) if counting else contextlib.nullcontext():
                    return original(trainer, samples, raise_oom)
            finally:
                instrument._current = None
                end = instrument.last_step_end = time.perf_counter()
                instrument.update_ms[update] = 1e3 * (end - start)
                if counting:
                    instrument.counted[update] = {
                        "ops": {p: phases.ops.get(p, 0) for p in PHASES},
                        "all_ops": {p: phases.all_ops.get(p, 0) for p in PHASES},
                        "op_names": {p: dict(phases.op_names[p].most_common(8)) for p in PHASES if phases.ops.get(p)},
                    }
                elif timing:
                    phases.finish()
                    instrument.timed[update] = {p: 1e3 * phases.seconds.get(p, 0.0) for p in PHASES}
                    instrument.timed[update]["total"] = 1e3 * (end - start)

        fairseq.trainer.Trainer.train_step = train_step
        return self

    def __exit__(self, *exc):
        import fairseq.trainer

        fairseq.trainer.Trainer.train_step = self._original

    def summary(self):
        """Ops per update by phase (mean over the counted updates) with their total, host ms per
        phase (median over the timed updates), the median update's ms."""
        result = {"tensors": self.tensors}
        if self.counted:
            for kind in ("ops", "all_ops"):
                ops = {p: statistics.mean(c[kind][p] for c in self.counted.values()) for p in PHASES}
                result[kind] = {**ops, "total": sum(ops.values())}
            result["op_names"] = self.counted[max(self.counted)]["op_names"]
        if self.timed:
            result["ms"] = {p: statistics.median(t[p] for t in self.timed.values()) for p in (*PHASES, "total")}
        result["counted_updates"] = sorted(self.counted)
        result["timed_updates"] = sorted(self.timed)
        result["update_ms"] = {str(u): round(ms, 3) for u, ms in sorted(self.update_ms.items())}
        if self.first_step_start is not None:
            result["train_s"] = self.last_step_end - self.first_step_start
        return result


def fairseq_train_in_process(argv, instrument):
    """fairseq-train *argv* in this process (``fairseq_cli.train.cli_main``), under *instrument*."""
    from fairseq_cli import train

    saved = sys.argv
    sys.argv = ["fairseq-train", *map(str, argv)]
    try:
        with instrument:
            train.cli_main()
    finally:
        sys.argv = saved
    return instrument.summary()


def child(spec_path):
    """The runner: one fairseq-train run as the spec (JSON) says; its measurements into the spec's
    ``out``. fairseq's baseline (no --user-dir) never imports the plugin."""
    import resource

    spec = json.loads(Path(spec_path).read_text())
    if spec.get("cudnn_off"):
        torch.backends.cuda.enable_cudnn_sdp(False)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    instrument = Instrument(count=spec["count"], time=spec["time"])
    summary = fairseq_train_in_process(spec["argv"], instrument)
    summary["plugin_imported"] = "fairseq_realformer" in sys.modules
    compiled = sys.modules.get("fairseq_realformer.modules.compiled")
    if compiled is not None:
        summary["compile_s"] = compiled.COMPILE_TIME.seconds
        summary["graphs"] = compiled.COMPILE_TIME.graphs
    summary["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        summary["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        summary["cudnn_sdp_enabled"] = torch.backends.cuda.cudnn_sdp_enabled()
    summary["threads"] = torch.get_num_threads()
    Path(spec["out"]).write_text(json.dumps(summary))


# ---------------------------------------------------------------------------------------------
# The benchmark: the configurations one after the other, each in its own fairseq-train


def parse_size(text):
    """``6L-6L`` or ``18L-18L:128``: (name, layers, width)."""
    match = re.fullmatch(r"(\d+)L-(\d+)L(?::(\d+))?", text.strip())
    if not match or match.group(1) != match.group(2):
        raise ValueError(f"--sizes: {text!r} is not LAYERSL-LAYERSL[:WIDTH], e.g. 6L-6L or 18L-18L:16")
    layers, width = int(match.group(1)), int(match.group(3) or 512)
    return text.strip(), layers, width


def size_flags(layers, width):
    heads = 8 if width >= 512 else 4 if width >= 128 else 2
    flags = []
    for side in ("encoder", "decoder"):
        flags += [f"--{side}-layers", layers, f"--{side}-embed-dim", width]
        flags += [f"--{side}-ffn-embed-dim", 4 * width, f"--{side}-attention-heads", heads]
    return [str(f) for f in flags]


def parse_config(text):
    """``NAME[@PRECISION][/cudnn-off]``: (name, base, precision or None, cudnn_off)."""
    name = text.strip()
    rest, cudnn_off = (name[: -len(CUDNN_OFF)], True) if name.endswith(CUDNN_OFF) else (name, False)
    base, _, precision = rest.partition("@")
    if base not in CONFIGS:
        raise ValueError(
            f"--configs: unknown {base!r}; choose from {', '.join(CONFIGS)} (@fp32/@fp16/@bf16, /cudnn-off)"
        )
    if precision and precision not in PRECISIONS:
        raise ValueError(f"--configs: {name!r}: unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}")
    return name, base, precision or None, cudnn_off


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help="comma list, in order (default: %(default)s)")
    p.add_argument("--sizes", default="6L-6L:16,6L-6L:128", help="comma list (default: %(default)s)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help="(default: %(default)s)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="(default: cuda if available)")
    p.add_argument("--data", choices=("toy", "multi30k"), default="toy", help="(default: %(default)s)")
    p.add_argument("--tokens", type=int, default=4096, help="target tokens an update, about (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, help="fairseq's --max-tokens (default: from --tokens)")
    p.add_argument("--updates", type=int, default=40, help="updates a run (default: %(default)s)")
    p.add_argument("--skip", type=int, default=10, help="updates left out of words/s and ms (default: %(default)s)")
    p.add_argument("--count", default="4,5", help="updates whose ATen ops are counted (default: %(default)s)")
    p.add_argument("--log-interval", type=int, default=5, help="(default: %(default)s)")
    p.add_argument("--clip-norm", default="1.0", help="fairseq's --clip-norm (default: %(default)s)")
    p.add_argument("--budget", type=float, metavar="SECONDS", help="seconds this run may use (default: no limit)")
    p.add_argument(
        "--always", type=int, default=2, help="configurations that run whatever the budget says (default: %(default)s)"
    )
    p.add_argument("--compile-guess", type=float, default=COMPILE_GUESS_S, metavar="SECONDS")
    p.add_argument("--work", help="folder for the data and the runs' logs (default: a temporary one)")
    p.add_argument("--json", help="write the result here, after every configuration")
    p.add_argument("--summary", metavar="JSON", help="print the tables of this JSON, and nothing else")
    p.add_argument("--child", metavar="SPEC", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child or args.summary:
        return args
    try:
        args.sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
        args.configs = [parse_config(c) for c in args.configs.split(",") if c.strip()]
        args.count = [int(u) for u in args.count.split(",") if u.strip()]
    except ValueError as e:
        p.error(str(e))
    if not args.configs or not args.sizes:
        p.error("--configs and --sizes need at least one each")
    if args.count and max(args.count) > args.skip:
        p.error(
            f"--count {max(args.count)} is past --skip {args.skip}: a counted update is slow, keep it out of words/s"
        )
    if args.skip >= args.updates:
        p.error(f"--skip {args.skip} leaves nothing of --updates {args.updates}")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    for name, _base, precision, _ in args.configs:
        precision = precision or args.precision
        if args.device == "cpu" and precision == "fp16":
            p.error(f"{name}: --fp16 needs a GPU (--device cuda)")
    return args


def prepare(args, work):
    """The binarised data (compiled_train.py's: the toy corpus of 20,000 pairs, or Multi30k)."""
    from benchmarks.compiled_train import prepare as prepare_data

    return prepare_data(SimpleNamespace(data=args.data, tiny=False), work)


def precision_of(args, config):
    _, _, precision, _ = config
    return precision or args.precision


def skipped_by_design(args, config):
    """Why *config* cannot run, or None."""
    _, base, _, cudnn_off = config
    if base == BASELINE and precision_of(args, config) == "bf16":
        return "fairseq's own --bf16 needs a TPU; bf16 on a GPU is the plugin's (--user-dir)"
    if cudnn_off and args.device != "cuda":
        return "cuDNN attention is a GPU's"
    return None


def train_argv(args, data, config, layers, width):
    _, base, _, _ = config
    argv = [str(data)]
    if base != BASELINE:
        argv += ["--user-dir", str(USER_DIR)]
    argv += CONFIGS[base] + size_flags(layers, width)
    source, target = ("en", "de") if args.data == "multi30k" else ("src", "tgt")
    argv += ["--share-all-embeddings", "--source-lang", source, "--target-lang", target]
    argv += "--optimizer adam --adam-betas (0.9,0.98) --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 50".split()
    argv += "--criterion label_smoothed_cross_entropy --label-smoothing 0.1 --num-workers 0 --no-save".split()
    argv += ["--disable-validation", "--max-update", str(args.updates), "--clip-norm", str(args.clip_norm)]
    argv += ["--max-tokens", str(args.max_tokens or round(args.tokens * MAX_TOKENS_PER_TARGET[args.data]))]
    argv += ["--log-format", "json", "--log-interval", str(args.log_interval), "--seed", "1"]
    argv += PRECISIONS[precision_of(args, config)]
    if args.device == "cpu":
        argv.append("--cpu")
    return argv


def measure(args, data, work, config, size):
    """One configuration at one size: fairseq-train in a process of its own (this file's runner)."""
    name, base, _, cudnn_off = config
    size_name, layers, width = size
    tag = re.sub(r"[^A-Za-z0-9.+-]", "_", f"{size_name}-{name}")
    spec_path, out_path = work / f"{tag}.spec.json", work / f"{tag}.out.json"
    argv = train_argv(args, data, config, layers, width)
    spec = {
        "argv": argv,
        "count": args.count,
        "time": [u for u in range(args.skip + 1, args.updates + 1) if u not in args.count],
        "cudnn_off": cudnn_off,
        "out": str(out_path),
    }
    spec_path.write_text(json.dumps(spec))
    out_path.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONWARNINGS": "ignore"}
    if base != BASELINE:
        env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    # compiling included: the run's first compiled configuration compiles cold, later ones reuse
    # what it compiled where their graphs are the same (a width and precision seen), unless the
    # caller names a cache of its own
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(work / "inductor-cache"))
    say("train-update", f"{size_name} {name}: fairseq-train {shlex.join(argv)}")
    start = time.time()
    log = run_logged([sys.executable, Path(__file__).resolve(), "--child", spec_path], work, tag, env=env)
    wall_s = time.time() - start
    if not out_path.exists():
        raise RuntimeError(f"fairseq-train wrote no measurements; see {work / f'{tag}.log'}")
    inside = json.loads(out_path.read_text())
    timed, logged = train_log(log, args.skip + args.log_interval)
    record = {
        "config": name,
        "size": size_name,
        "layers": layers,
        "width": width,
        "precision": precision_of(args, config),
        "cudnn_attention": not cudnn_off,
        "wall_s": round(wall_s, 1),
        **logged,
        "wpb": statistics.median(r["wpb"] for r in timed) if timed else None,
        "fast_update_log": FAST_LINE.findall(log),
        **inside,
    }
    if record["updates"] and "update_ms" in inside:
        later = [ms for u, ms in inside["update_ms"].items() if int(u) > args.skip and int(u) not in args.count]
        record["update_ms_median"] = statistics.median(later) if later else None
    if base == BASELINE and record["plugin_imported"]:
        raise RuntimeError("fairseq's baseline imported the plugin")
    return record


def cell_of(size, args):
    size_name, layers, width = size

    class Sized(Cell):  # what a run's time grows with: depth, batch and (on a CPU, roughly) width
        def work(self):
            return self.layers * self.tokens * (width + 16)

    return Sized(size=size_name, layers=layers, length=0, tokens=args.tokens)


def write_results(args, argv, records, skipped, budget):
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    names = {"configs": [c[0] for c in args.configs], "sizes": [s[0] for s in args.sizes]}
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "work", "summary", "child")}
    spent = {"seconds": args.budget, "used_s": round(budget.used(), 1)}
    settings = {**settings, **names}
    write_json(args, __file__, argv, device, host(), settings=settings, runs=records, skipped=skipped, budget=spent)


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        return child(args.child)
    if args.summary:
        result = json.loads(Path(args.summary).read_text())
        print(f"{result['command']}\n{result['device']}, {result['machine']}; {result['date']}, {result['commit']}")
        print(report(result["runs"], result.get("skipped", [])))
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="train-update-"))
    work.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)
    data = prepare(args, work)
    expected = Expected(args.compile_guess, SETUP_GUESS_S, BASELINE)
    records, skipped = [], []
    compiled = {}  # configuration -> its latest run's compiling seconds

    def skip(config, size, reason):
        skipped.append({"config": config[0], "size": size[0], "reason": reason})
        say("train-update", f"skipped {size[0]} {config[0]}: {reason}")
        write_results(args, argv, records, skipped, budget)

    for size in args.sizes:
        cell = cell_of(size, args)
        for config in args.configs:
            why_not = skipped_by_design(args, config)
            if why_not:
                skip(config, size, why_not)
                continue
            name, base, _, _ = config
            # every run is a process of its own and compiles again: as long as it last did (a
            # warm cache makes that shorter), before that the longest seen, before any the guess
            expected_s, why = expected.timing(base, cell, False)
            if base.endswith("+compiled"):
                compile_s = compiled.get(base, max(compiled.values(), default=args.compile_guess))
                expected_s += MARGIN * compile_s
                why = f"compiling {compile_s:.0f} s; {why}"
            if len(records) >= args.always and not budget.fits(expected_s):
                skip(
                    config,
                    size,
                    f"expected {expected_s:.0f} s ({why}), {budget.left():.0f} s of {budget.seconds:.0f} left",
                )
                continue
            start = budget.clock()
            try:
                record = measure(args, data, work, config, size)
            except RuntimeError as e:
                skip(config, size, f"failed: {e}")
                continue
            seconds = budget.clock() - start
            # the updates' time without compiling (a compiled run compiles at its first updates)
            steps_s = (record.get("train_s") or 0) - record.get("compile_s", 0.0)
            expected.saw_timing(base, cell, seconds, record.get("compile_s", 0.0), max(steps_s, 0.0))
            if "compile_s" in record and base.endswith("+compiled"):
                compiled[base] = record["compile_s"]
            records.append(record)
            write_results(args, argv, records, skipped, budget)
            print(line(record), flush=True)
    print(report(records, skipped))
    if args.budget is not None:
        print(f"budget: {budget.used():.0f} s used of {args.budget:.0f} s; {len(skipped)} skipped")


# ---------------------------------------------------------------------------------------------
# Tables


def _fmt(x, digits=0):
    return "—" if x is None else f"{x:,.{digits}f}"


def line(r):
    ops = r.get("ops", {}).get("total")
    return (
        f"[train-update] {r['size']} {r['config']} ({r['precision']}): {_fmt(ops)} ops/update, "
        f"{_fmt(r.get('update_ms_median'), 1)} ms/update, {_fmt(r['wps'])} words/s, wall {r['wall_s']:.0f} s"
    )


def base_config(r):
    """A record's configuration without its ``@PRECISION`` and ``/cudnn-off``."""
    return r["config"].split("@")[0].split("/")[0]


def baseline_of(records, r):
    """The fairseq run *r* is compared with at its size: the one in r's precision with cuDNN
    attention as it comes, else fairseq's fastest there."""
    same = [b for b in records if base_config(b) == BASELINE and b["size"] == r["size"]]
    exact = [b for b in same if b["precision"] == r["precision"] and b["cudnn_attention"]]
    return (exact or [best_fairseq(records, r["size"])])[0]


def best_fairseq(records, size):
    """fairseq's fastest run at *size* (words/s after warm-up), or None."""
    timed = [b for b in records if base_config(b) == BASELINE and b["size"] == size and b["wps"]]
    return max(timed, key=lambda b: b["wps"], default=None)


def _row(label, cells):
    return f"| {label} | " + " | ".join(cells) + " |"


def _phase_rows(rows, key, digits):
    """A row a phase and the total: each run's *key* (ops or ms) for it."""
    phases = (*PHASES, "total")
    return [_row(PHASE_NAMES.get(p, p), [_fmt(r.get(key, {}).get(p), digits) for r in rows]) for p in phases]


def _ops_share(r, b):
    """*r*'s ATen ops per update over fairseq's run *b*'s, or None."""
    return r["ops"]["total"] / b["ops"]["total"] if b and r.get("ops") and b.get("ops") else None


def _speed_over(r, b):
    return _fmt(r["wps"] / b["wps"], 3) if b and b["wps"] and r["wps"] else "—"


def _memory_mib(r):
    peak = r.get("cuda_max_allocated_bytes") or r.get("peak_rss_bytes")
    return _fmt(peak / 2**20) if r.get("peak_rss_bytes") else "—"


def report(records, skipped=()):
    """Per size: ops per update by phase, host ms per phase, words/s and memory, each side by side
    with fairseq's; then the fast path's ops against the targets."""
    lines = []
    for size in dict.fromkeys(r["size"] for r in records):
        rows = [r for r in records if r["size"] == size]
        names = [f"{r['config']}" + (f" ({r['precision']})" if "@" not in r["config"] else "") for r in rows]
        head = [_row("phase", names), "|---" * (len(rows) + 1) + "|"]
        counted = ", ".join(map(str, rows[0].get("counted_updates", [])))
        lines += ["", f"{size}: ATen ops per update (updates {counted})", *head, *_phase_rows(rows, "ops", 0)]
        base = baseline_of(records, rows[0])
        shares = [_ops_share(r, base) for r in rows]
        lines.append(_row("× fairseq's total", ["—" if x is None else _fmt(x, 2) + "×" for x in shares]))
        lines.append(_row("parameter tensors", [_fmt(r.get("tensors")) for r in rows]))
        lines += ["", f"{size}: host ms per phase (median of the timed updates)", *head, *_phase_rows(rows, "ms", 2)]
        train = {"words/s": [_fmt(r["wps"]) for r in rows]}
        train["× fairseq"] = [_speed_over(r, baseline_of(records, r)) for r in rows]
        best = best_fairseq(records, size)
        if best is not None:
            train[f"× fairseq's best ({best['config']}, {best['precision']})"] = [_speed_over(r, best) for r in rows]
        train["target tokens an update (wpb)"] = [_fmt(r["wpb"]) for r in rows]
        train["ms an update (median)"] = [_fmt(r.get("update_ms_median"), 1) for r in rows]
        train["first update s"] = [_fmt(r.get("update_ms", {}).get("1", 0) / 1e3, 1) for r in rows]
        train["compiling s"] = [_fmt(r.get("compile_s"), 1) for r in rows]
        train[f"wall s ({rows[0]['updates']} updates)"] = [_fmt(r["wall_s"]) for r in rows]
        train["loss at the end"] = [_fmt(r["loss_at_end"], 3) for r in rows]
        train["peak memory MiB"] = [_memory_mib(r) for r in rows]
        lines += ["", f"{size}: fairseq-train", *head, *(_row(label, cells) for label, cells in train.items())]
    targets = {"realformer": 0.50, "realformer+compiled": 0.30}
    checks = []
    for r in records:
        share, target = _ops_share(r, baseline_of(records, r)), targets.get(base_config(r))
        if target is not None and share is not None:
            verdict = "met" if share <= target else "NOT met"
            checks.append(
                f"- {r['size']} {r['config']} ({r['precision']}): {share:.3f}× fairseq's ops per update "
                f"(target ≤ {target:.2f}×: {verdict})"
            )
    if checks:
        lines += ["", "The fast path's ops per update against fairseq's:", *checks]
    lines += [f"skipped: {s['size']} {s['config']}: {s['reason']}" for s in skipped]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
