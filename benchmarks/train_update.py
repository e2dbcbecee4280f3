"""fairseq-train's update as users run it: ATen ops and host milliseconds per update by phase,
words/s, the wall time and peak memory, for fairseq's own ``transformer`` (no ``--user-dir``)
beside RealFormer with fairseq's update (``--fairseq-update``), with the plugin's fast update (its
default, fairseq_realformer/optim/fast_update.py) and with the fast update and ``--compile-layers``.

Every configuration is one fairseq-train run (``fairseq_cli.train.cli_main``) in a process of its
own, this file's ``--child``, which instruments fairseq's ``Trainer`` and nothing else (fairseq's
baseline never imports the plugin; benchmarks/update_ops.py). In the updates ``--count`` names a
``TorchDispatchMode`` counts every ATen op that ``Trainer.train_step`` dispatches; in the updates
after ``--skip`` ``time.perf_counter`` times the same phases, which are what ``train_step`` calls:

=============  ==========================================================================
forward        the model's forward (a hook on ``trainer.model``)
loss           the criterion around it: its loss and logging outputs (hooks on the criterion)
backward       ``optimizer.backward`` (``--fp16``: the loss scaled, then ``backward``)
grad norm      ``trainer.clip_grad_norm`` (the norm; with ``--clip-norm``, the clip)
optimizer      ``task.optimizer_step`` (Adam's step; ``--fp16``: the masters' copy back)
rest           everything else in ``train_step``: zeroing, ``multiply_grads`` (``--fp16``: the
               copy of the gradients into the float32 masters), the finite check, the logging
=============  ==========================================================================

A phase's host ms is its wall time on the host: on a CPU its arithmetic and host work; on a GPU
the time to issue its kernels, plus any wait where fairseq syncs (at ``d=16`` arithmetic vanishes
and the ms are host work). words/s: the median of fairseq's logged ``wps`` after ``--skip``;
``wall s``: the whole process (imports, data, compiling); peak memory: the peak RSS on a CPU,
``torch.cuda.max_memory_allocated`` on a GPU.

Configurations (``--configs``): ``fairseq``, ``realformer-fairseq-update``, ``realformer+compiled``
and every variant of fairseq_realformer/variants.py; each may end in ``@fp32``, ``@fp16`` (fairseq's
``--fp16``) or ``@bf16`` (the plugin's autocast; fairseq's own ``--bf16`` needs a TPU) to override
``--precision``, and in ``/cudnn-off`` to train with PyTorch's cuDNN attention off. Sizes
(``--sizes``): ``6L-6L`` or ``18L-18L``, ``:WIDTH`` for a width other than 512 (FFN 4×, 8 heads at
512, 4 from 128, 2 below). Data: the toy corpus (scripts/toy_corpus.py) or Multi30k. A run starts
only if it is expected to fit in ``--budget`` (budget.py); the JSON is written after each.

    python benchmarks/train_update.py --sizes 6L-6L:16,18L-18L:16,6L-6L:128 --updates 30 --budget 1500 \\
        --json benchmarks/results/cpu-train-update-ops.json          # a 2-core CPU, ~25 minutes
    python benchmarks/train_update.py --sizes 6L-6L --precision fp16 --updates 200 --skip 50 \\
        --configs fairseq,realformer+compiled,fairseq/cudnn-off,fairseq@fp32 --json gpu.json  # a GPU
    python benchmarks/train_update.py --summary benchmarks/results/cpu-train-update-ops.json
"""

if __name__ == "__main__" and not __package__:  # run by its path, from any folder: as `python -m` its module
    import by_path  # noqa: F401  (common/by_path.py, linked beside this file)

import argparse
import json
import os
import re
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch

from benchmarks.bench import BASELINE, prepare_data, say, train_log, write_json
from benchmarks.budget import MARGIN, Budget, Cell, Expected
from benchmarks.budget import add_arguments as add_budget_arguments
from benchmarks.update_ops import child
from benchmarks.update_report import from_json, line, report
from common import commands
from common.host import host
from common.presets import TRAINING
from common.repo import USER_DIR, VARIANTS

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
SETUP_GUESS_S = 60  # the first run's imports, data and updates, before any was seen
FAST_LINE = re.compile(r"fast update: (.*)$", re.M)


class Config(NamedTuple):
    name: str  # as given: NAME[@PRECISION][/cudnn-off]
    base: str  # its CONFIGS key
    precision: str  # its own @PRECISION, else --precision
    cudnn_off: bool


def parse_size(text, tokens):
    """``6L-6L`` or ``18L-18L:128``: the Cell of *tokens* an update it trains at (no one length)."""
    match = re.fullmatch(r"(\d+)L-(\d+)L(?::(\d+))?", text.strip())
    if not match or match.group(1) != match.group(2):
        raise ValueError(f"--sizes: {text!r} is not LAYERSL-LAYERSL[:WIDTH], e.g. 6L-6L or 18L-18L:16")
    return Cell(text.strip(), int(match.group(1)), 0, tokens, width=int(match.group(3) or 512))


def size_flags(layers, width):
    heads = 8 if width >= 512 else 4 if width >= 128 else 2
    flags = []
    for side in ("encoder", "decoder"):
        flags += [f"--{side}-layers", layers, f"--{side}-embed-dim", width]
        flags += [f"--{side}-ffn-embed-dim", 4 * width, f"--{side}-attention-heads", heads]
    return [str(f) for f in flags]


def parse_config(text, precision_default):
    """``NAME[@PRECISION][/cudnn-off]``: its Config."""
    name = text.strip()
    rest, cudnn_off = (name[: -len(CUDNN_OFF)], True) if name.endswith(CUDNN_OFF) else (name, False)
    base, _, precision = rest.partition("@")
    if base not in CONFIGS:
        raise ValueError(
            f"--configs: unknown {base!r}; choose from {', '.join(CONFIGS)} (@fp32/@fp16/@bf16, /cudnn-off)"
        )
    if precision and precision not in PRECISIONS:
        raise ValueError(f"--configs: {name!r}: unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}")
    return Config(name, base, precision or precision_default, cudnn_off)


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
    p.add_argument(
        "--always", type=int, default=2, help="configurations that run whatever the budget says (default: %(default)s)"
    )
    add_budget_arguments(p)
    p.add_argument("--work", help="folder for the data and the runs' logs (default: a temporary one)")
    p.add_argument("--json", help="write the result here, after every configuration")
    p.add_argument("--summary", metavar="JSON", help="print the tables of this JSON, and nothing else")
    p.add_argument("--child", metavar="SPEC", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child or args.summary:
        return args
    try:
        args.sizes = [parse_size(s, args.tokens) for s in args.sizes.split(",") if s.strip()]
        args.configs = [parse_config(c, args.precision) for c in args.configs.split(",") if c.strip()]
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
    for config in args.configs:
        if args.device == "cpu" and config.precision == "fp16":
            p.error(f"{config.name}: --fp16 needs a GPU (--device cuda)")
    return args


def skipped_by_design(args, config):
    """Why *config* cannot run, or None."""
    if config.base == BASELINE and config.precision == "bf16":
        return "fairseq's own --bf16 needs a TPU; bf16 on a GPU is the plugin's (--user-dir)"
    if config.cudnn_off and args.device != "cuda":
        return "cuDNN attention is a GPU's"
    return None


def train_argv(args, data, config, cell):
    argv = [str(data), *(["--user-dir", str(USER_DIR)] if config.base != BASELINE else [])]
    argv += CONFIGS[config.base] + size_flags(cell.layers, cell.width)
    source, target = ("en", "de") if args.data == "multi30k" else ("src", "tgt")
    argv += [*TRAINING, "--source-lang", source, "--target-lang", target]
    argv += "--lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 50 --no-save --disable-validation --seed 1".split()
    max_tokens = args.max_tokens or round(args.tokens * MAX_TOKENS_PER_TARGET[args.data])
    argv += ["--max-update", str(args.updates), "--max-tokens", str(max_tokens), "--clip-norm", str(args.clip_norm)]
    argv += ["--log-interval", str(args.log_interval), *PRECISIONS[config.precision]]
    return argv + (["--cpu"] if args.device == "cpu" else [])


def measure(args, data, work, config, cell):
    """One configuration at one size: fairseq-train in a process of its own (this file's runner)."""
    tag = re.sub(r"[^A-Za-z0-9.+-]", "_", f"{cell.size}-{config.name}")
    spec_path, out_path = work / f"{tag}.spec.json", work / f"{tag}.out.json"
    argv = train_argv(args, data, config, cell)
    spec = {
        "argv": argv,
        "count": args.count,
        "time": [u for u in range(args.skip + 1, args.updates + 1) if u not in args.count],
        "cudnn_off": config.cudnn_off,
        "out": str(out_path),
    }
    spec_path.write_text(json.dumps(spec))
    out_path.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONWARNINGS": "ignore"}
    if config.base != BASELINE:
        env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    # compiling included: the run's first compiled configuration compiles cold, later ones reuse
    # what it compiled where their graphs are the same (a width and precision seen), unless the
    # caller names a cache of its own
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(work / "inductor-cache"))
    say("train-update", f"{cell.size} {config.name}: fairseq-train {shlex.join(argv)}")
    child_run = commands.run(
        [sys.executable, Path(__file__).resolve(), "--child", spec_path], work / f"{tag}.log", cwd=work, env=env
    )
    log, wall_s = child_run.output, child_run.seconds
    if not out_path.exists():
        raise RuntimeError(f"fairseq-train wrote no measurements; see {work / f'{tag}.log'}")
    inside = json.loads(out_path.read_text())
    timed, logged = train_log(log, args.skip + args.log_interval)
    record = {
        "config": config.name,
        "size": cell.size,
        "layers": cell.layers,
        "width": cell.width,
        "precision": config.precision,
        "cudnn_attention": not config.cudnn_off,
        "wall_s": round(wall_s, 1),
        **logged,
        "wpb": statistics.median(r["wpb"] for r in timed) if timed else None,
        "fast_update_log": FAST_LINE.findall(log),
        **inside,
    }
    if record["updates"] and "update_ms" in inside:
        later = [ms for u, ms in inside["update_ms"].items() if int(u) > args.skip and int(u) not in args.count]
        record["update_ms_median"] = statistics.median(later) if later else None
    if config.base == BASELINE and record["plugin_imported"]:
        raise RuntimeError("fairseq's baseline imported the plugin")
    return record


def write_results(args, argv, records, skipped, budget):
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "work", "summary", "child")}
    settings.update(configs=[c.name for c in args.configs], sizes=[s.size for s in args.sizes])  # their names
    write_json(
        args, __file__, argv, device, host(), settings=settings, runs=records, skipped=skipped, budget=budget.spent()
    )


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        return child(args.child)
    if args.summary:
        print(from_json(json.loads(Path(args.summary).read_text())))
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="train-update-"))
    budget = Budget(args.budget)
    data = prepare_data(args.data, work, "train-update")
    expected = Expected(args.compile_guess, SETUP_GUESS_S, BASELINE)
    records, skipped = [], []
    compiled = {}  # configuration -> its latest run's compiling seconds

    def skip(config, cell, reason):
        skipped.append({"config": config.name, "size": cell.size, "reason": reason})
        say("train-update", f"skipped {cell.size} {config.name}: {reason}")
        write_results(args, argv, records, skipped, budget)

    for cell in args.sizes:
        for config in args.configs:
            why_not = skipped_by_design(args, config)
            if why_not:
                skip(config, cell, why_not)
                continue
            base = config.base
            # every run is a process of its own and compiles again: as long as it last did (a
            # warm cache makes that shorter), before that the longest seen, before any the guess
            expected_s, why = expected.timing(base, cell, False)
            if base.endswith("+compiled"):
                compile_s = compiled.get(base, max(compiled.values(), default=args.compile_guess))
                expected_s += MARGIN * compile_s
                why = f"compiling {compile_s:.0f} s; {why}"
            if len(records) >= args.always and not budget.fits(expected_s):
                skip(config, cell, budget.unaffordable(expected_s, why))
                continue
            start = budget.clock()
            try:
                record = measure(args, data, work, config, cell)
            except RuntimeError as e:
                skip(config, cell, f"failed: {e}")
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


if __name__ == "__main__":
    main()
