"""Translation quality on real data: Multi30k, every variant with several seeds, one table of test
scores (mean ± sample std over seeds), paired bootstrap significance seed by seed, a permutation
test across seeds, learning curves.

Post-LN, Pre-LN, ADMIN (profiled ω) and RealFormer on ADMIN (sum, and mean: "realformer") are
trained with the same data, settings and budget by the Multi30k recipe (examples/multi30k/run.sh:
joint sentencepiece, fairseq-train, average of the last 5 epoch checkpoints, beam 5, sacreBLEU on
each test set); the variants are those of fairseq_realformer/variants.py. Any two of en, de, fr,
cs (default en→de); by default every test set of --data in both languages.

    nice -n 19 python benchmarks/quality.py --preset cpu --seeds 1,2,3 --jobs 2 \\
        --json benchmarks/results/cpu-quality-multi30k-en-de.json --figures benchmarks/results
    python benchmarks/quality.py --seeds 1,2,3                   # --preset gpu: the recipe's size, one GPU
    python benchmarks/quality.py --quick --seeds 1,2             # minutes on a CPU: proves it runs
    python benchmarks/quality.py --preset cpu --report-only --json ...   # report the finished runs only
    python benchmarks/quality.py --preset cpu --bf16 --variants post-ln,realformer --seeds 1,2 \
        --json benchmarks/results/cpu-quality-multi30k-en-de-bf16.json    # in bf16 mixed precision

Presets (the same settings for every variant; --lr, --warmup, --epochs, --layers override them):
  gpu    the recipe's model: 6+6 layers, 512/1024, 4 heads, dropout 0.3, Adam 5e-4 with
         inverse-sqrt warm-up 1000, 12 epochs
  cpu    4+4 layers, d=128, FFN 256, 4 heads, dropout 0.3, label smoothing 0.1, Adam (0.9, 0.98)
         peak lr 2e-3 after 400 warm-up updates, then linear decay to 0 at the end of epoch 20
         (the RealFormer paper's schedule for NMT); 4,096 tokens a batch, ~132 updates an epoch.
         On an idle 2-core CPU an epoch takes ~100 s, so a run ~35-40 min (benchmarks/RESULTS.md:
         how the learning rate was chosen, and the times measured)
  --quick  the recipe's --tiny mode (first 300 lines, width 32) with 2+2 layers, 2 epochs: its
         BLEU says the pipeline works, not which model is better

The study can be stopped at any time (Ctrl-C, or kill its process group) and run again with the
same command: finished runs are skipped and an interrupted run resumes from its last epoch
checkpoint. The runs a --json file of the same settings holds count as finished too, so a
committed study goes on in a fresh checkout. Seed 1 of every variant runs first, then seed 2, ..., so partial results stay
balanced. --jobs N trains N runs side by side with one thread each: on this project's 2-core
machine two one-thread runs made ~5,250 target tokens/s together, one two-thread run ~4,500.

Layout: OUT/data (binarised once, shared), OUT/VARIANT/seedS (one recipe run each; with --lr,
--warmup, --epochs or --layers given, OUT/VARIANT-lr0.002-.../seedS; with --bf16, which trains and
translates in bfloat16 mixed precision, OUT/VARIANT-...-bf16/seedS).
"""
import argparse
import datetime
import fcntl
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import multi30k_args  # noqa: E402
import quality_report  # noqa: E402
from multi30k_args import REPO, VARIANTS  # noqa: E402

RECIPE = REPO / "examples" / "multi30k" / "run.sh"
UPDATES_PER_EPOCH = REPO / "examples" / "wmt14" / "updates_per_epoch.py"
DEFAULT_VARIANTS = "post-ln,pre-ln,admin,realformer-sum,realformer"
RECIPE_ARCH = "realformer_iwslt_de_en"  # run.sh's default ARCH
MAX_TOKENS = "4096"  # run.sh's --max-tokens


@dataclass(frozen=True)
class RunConfig:
    label: str  # the table's and the figures' name: the variant, or "variant lr=X" in a sweep
    variant: str
    lr: float  # None: the recipe's
    suffix: str  # of its folders: OUT/VARIANT+SUFFIX/seedS


@dataclass(frozen=True)
class Preset:
    epochs: int
    layers: int = None  # None: the recipe's
    lr: float = None  # None: the recipe's Adam 5e-4, inverse-sqrt warm-up 1000
    warmup: int = None
    linear_decay: bool = False  # polynomial_decay to 0 at the end of the last epoch
    model: tuple = ()
    describe: str = ""


PRESETS = {
    "gpu": Preset(epochs=12, describe="6+6 layers, d=512, FFN 1024"),
    "cpu": Preset(
        epochs=20, layers=4, lr=2e-3, warmup=400, linear_decay=True,
        model=("--encoder-embed-dim", "128", "--decoder-embed-dim", "128", "--encoder-ffn-embed-dim", "256",
               "--decoder-ffn-embed-dim", "256", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"),
        describe="4+4 layers, d=128, FFN 256",
    ),  # fmt: skip
    "quick": Preset(epochs=2, layers=2, describe="--quick (recipe --tiny: 300 lines, d=32)"),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="work folder (default: runs/quality-SRC-TGT-PRESET)")
    p.add_argument("--preset", choices=("gpu", "cpu"), default="gpu", help="model size and schedule (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="the recipe's --tiny mode, 2+2 layers: minutes on a CPU")
    p.add_argument("--seeds", default="1", metavar="1,2,3", help="comma list of seeds (default: %(default)s)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="trainings side by side, one thread each (default: 1)")
    p.add_argument("--epochs", type=int, help="training epochs (default: the preset's)")
    p.add_argument("--lr", metavar="LR[,LR...]",
                   help="peak learning rate (default: the preset's); several: a sweep, each its own runs")
    p.add_argument("--warmup", type=int, metavar="UPDATES", help="learning-rate warm-up updates (default: the preset's)")
    p.add_argument("--layers", type=int, metavar="N", help="encoder and decoder layers (default: the preset's)")
    p.add_argument("--bf16", action="store_true",
                   help="train and translate in bfloat16 mixed precision (the recipe's --bf16; folders VARIANT-bf16)")
    p.add_argument("--source-lang", default="en", help="en, de, fr or cs (default: %(default)s)")
    p.add_argument("--target-lang", default="de", help="en, de, fr or cs (default: %(default)s)")
    p.add_argument("--test-sets", metavar="A,B,...",
                   help="test sets of --data to score (default: every test_* set in both languages)")
    p.add_argument("--report-only", action="store_true", help="train nothing: report the runs already finished")
    p.add_argument("--figures", metavar="DIR", help="draw the learning curves and the BLEU per seed into DIR")
    p.add_argument("--machine", default=f"{platform.machine()} CPU, {os.cpu_count()} cores",
                   help="the machine, for the figures' titles and the JSON (default: %(default)s)")
    multi30k_args.add(p, DEFAULT_VARIANTS)
    args = p.parse_args(argv)
    multi30k_args.check(p, args)
    try:
        args.seeds = sorted({int(s) for s in args.seeds.split(",") if s.strip()})
    except ValueError:
        p.error(f"--seeds {args.seeds}: expected a comma list of integers, e.g. 1,2,3")
    if not args.seeds:
        p.error("--seeds: give at least one seed")
    for flag in ("jobs", "epochs", "warmup", "layers"):
        value = getattr(args, flag)
        if value is not None and value < (0 if flag == "warmup" else 1):
            p.error(f"--{flag} {value}: must be at least {0 if flag == 'warmup' else 1}")
    lr_given = args.lr
    if lr_given is not None:
        try:
            args.lrs = [float(lr) for lr in lr_given.split(",")]
        except ValueError:
            p.error(f"--lr {lr_given}: expected a number or a comma list of numbers, e.g. 1e-3,2e-3")
        if any(lr <= 0 for lr in args.lrs) or len(set(args.lrs)) != len(args.lrs):
            p.error(f"--lr {lr_given}: learning rates must be positive and different")
    args.preset_name = "quick" if args.quick else args.preset
    preset = PRESETS[args.preset_name]
    # runs with settings given on the command line get their own folders: OUT/post-ln-lr0.002/seed1
    args.run_suffix = "".join(f"-{name}{getattr(args, name):g}" for name in ("warmup", "epochs", "layers")
                              if getattr(args, name) is not None) + ("-bf16" if args.bf16 else "")  # fmt: skip
    lrs = args.lrs if lr_given is not None else [preset.lr]
    sweep = len(lrs) > 1
    args.configs = [RunConfig(f"{variant} lr={lr:g}" if sweep else variant, variant, lr,
                              (f"-lr{lr:g}" if lr_given is not None else "") + args.run_suffix)
                    for variant in args.variants for lr in lrs]  # fmt: skip
    args.sweep, args.lr = sweep, None if sweep else lrs[0]
    args.epochs = args.epochs or preset.epochs
    args.layers = args.layers or preset.layers
    args.warmup = preset.warmup if args.warmup is None else args.warmup
    args.preset = preset
    args.pair = f"{args.source_lang}-{args.target_lang}"
    args.out = Path(args.out or REPO / "runs" / f"quality-{args.pair}-{args.preset_name}")
    return args


def recipe_language_flags(args):
    return ["--source-lang", args.source_lang, "--target-lang", args.target_lang,
            *(["--test-sets", args.test_sets] if args.test_sets else [])]  # fmt: skip


def recipe_run_flags(args):
    """The recipe's options of one training run (besides the languages)."""
    return [*(["--tiny"] if args.quick else []), *(["--bf16"] if args.bf16 else []), *recipe_language_flags(args)]


def prepare_data(args):
    """Binarise the data once for every run (run.sh --prepare-only; skipped when done)."""
    data_dir = args.out / "data"
    cmd = ["bash", str(RECIPE), *(["--tiny"] if args.quick else []), "--prepare-only", *recipe_language_flags(args),
           args.data, str(data_dir)]  # fmt: skip
    print(f"[quality] data: {' '.join(cmd)}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "prepare.log", "a") as log:
        if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
            raise SystemExit(f"quality.py: error: {recipe_error(args.out / 'prepare.log', 'preparing the data')}")
    return data_dir


def recipe_error(log_path, what):
    errors = [line for line in log_path.read_text().splitlines() if line.startswith("run.sh: error: ")]
    return errors[-1][len("run.sh: error: "):] if errors else f"{what} failed; see {log_path}"


def updates_per_epoch(args, data_dir):
    """How many updates one epoch makes (the linear decay ends with the last epoch); cached."""
    cache = data_dir / "updates_per_epoch"
    if not cache.exists():
        venv = Path(os.environ.get("REALFORMER_VENV", REPO / ".venv"))
        cmd = [str(venv / "bin" / "python"), str(UPDATES_PER_EPOCH), str(data_dir / "bin"), "--user-dir",
               str(REPO / "fairseq_realformer"), "--arch", RECIPE_ARCH, "--source-lang", args.source_lang,
               "--target-lang", args.target_lang, "--max-tokens", MAX_TOKENS, "--seed", "1"]  # fmt: skip
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"quality.py: error: counting the updates per epoch failed: {result.stderr.strip().splitlines()[-1:]}")
        cache.write_text(result.stdout.strip().splitlines()[-1] + "\n")
    return int(cache.read_text())


def training_flags(args, data_dir, lr):
    """The fairseq-train flags every variant shares (after the recipe's own, so they win)."""
    preset, flags = args.preset, list(args.preset.model)
    if args.layers:
        flags += ["--encoder-layers", str(args.layers), "--decoder-layers", str(args.layers)]
    if lr:
        flags += ["--lr", f"{lr:g}"]
    if args.warmup is not None:
        flags += ["--warmup-updates", str(args.warmup)]
    if preset.linear_decay:
        total = args.epochs * updates_per_epoch(args, data_dir)
        flags += ["--lr-scheduler", "polynomial_decay", "--total-num-update", str(total), "--end-learning-rate", "0"]
    return flags


def finished_test_sets(run_dir):
    """The test sets a finished recipe run scored, in its order; None while it is not finished."""
    listed = run_dir / "test-sets"  # written by the recipe
    if not listed.exists():
        return None
    names = listed.read_text().strip().split(",")
    return names if all((run_dir / "score" / name / "scores.json").exists() for name in names) else None


class Runner:
    """Runs the recipe for (variant, seed) pairs, N at a time; stops them all on SIGINT/SIGTERM."""

    def __init__(self, args, data_dir):
        self.args, self.data_dir = args, data_dir
        self.running, self.lock, self.stopping, self.locks = set(), threading.Lock(), False, []

    def command(self, config, seed, run_dir):
        # variant flags after the shared ones: admin-radam's --warmup-updates 0 must win
        return ["bash", str(RECIPE), *recipe_run_flags(self.args), self.args.data, str(run_dir), "--",
                *training_flags(self.args, self.data_dir, config.lr), *VARIANTS[config.variant], "--seed", str(seed)]  # fmt: skip

    def run(self, config, seed):
        run_dir = run_folder(self.args, config, seed)
        variant = config.label
        if finished_test_sets(run_dir) is not None:
            return None
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = open(run_dir / "lock", "w")  # held until this process ends: one trainer per run folder
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return f"{run_dir} is being trained by another process (it holds {run_dir / 'lock'})"
        self.locks.append(lock)
        if not (run_dir / "bin").exists():
            (run_dir / "bin").symlink_to(os.path.relpath(self.data_dir / "bin", run_dir))  # the same data for every run
        cmd = self.command(config, seed, run_dir)
        settings = run_dir / "command"  # a run resumes only with the flags it started with
        if settings.exists() and settings.read_text() != " ".join(cmd[2:]) + "\n":
            return f"{run_dir} was started with other settings ({settings}): choose another --out"
        settings.write_text(" ".join(cmd[2:]) + "\n")
        env = dict(os.environ, EPOCHS=str(self.args.epochs))
        if self.args.jobs > 1:
            env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        print(f"[quality {time.strftime('%H:%M:%S')}] start {variant} seed {seed}: {run_dir}", flush=True)
        start = time.time()
        with open(run_dir / "recipe.log", "a") as log:
            with self.lock:
                if self.stopping:
                    return "stopped"
                process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                self.running.add(process)
            returncode = process.wait()
            with self.lock:
                self.running.discard(process)
        with open(run_dir / "attempts.jsonl", "a") as attempts:
            attempts.write(json.dumps({"started": datetime.datetime.fromtimestamp(start).isoformat(timespec="seconds"),
                                       "wall_s": round(time.time() - start, 1), "returncode": returncode}) + "\n")  # fmt: skip
        if returncode != 0:
            return "stopped" if self.stopping else recipe_error(run_dir / "recipe.log", f"{variant} seed {seed}")
        print(f"[quality {time.strftime('%H:%M:%S')}] done {variant} seed {seed} in {time.time() - start:.0f} s", flush=True)
        return None

    def stop(self, signum, _frame):
        with self.lock:
            self.stopping = True
            for process in self.running:
                os.killpg(process.pid, signal.SIGTERM)  # the recipe and its fairseq-train
        print(f"[quality] stopping ({signal.Signals(signum).name}); run the same command to resume", flush=True)


def run_folder(args, config, seed):
    return args.out / f"{config.variant}{config.suffix}" / f"seed{seed}"


def recorded_runs(args):
    """The finished runs the --json file already holds, with their committed translations: a
    study goes on in a fresh checkout (no run folders) without training them again. Only a file
    made with the same settings counts."""
    path = Path(args.json) if args.json else None
    if path is None or not path.exists():
        return {}
    study = json.loads(path.read_text())
    defining = ("preset", "epochs", "layers", "lr", "warmup", "bf16")  # what the runs were trained with
    if any(study.get("settings", {}).get(key) != settings(args).get(key) for key in defining):
        return {}
    recorded = {}
    for run in study["runs"]:
        for name, score in run["test_sets"].items():  # what comparisons() reads: the committed copies
            score["hypotheses"] = str(REPO / score["translations"])
            reference = Path(args.data) / f"{name}.{args.target_lang}.gz"
            if args.quick:  # --tiny scores the first lines only, as many as it translated
                lines = quality_report.read_lines(reference)[: len(quality_report.read_lines(score["hypotheses"]))]
                reference = args.out / f"{name}.{args.target_lang}"
                args.out.mkdir(parents=True, exist_ok=True)
                reference.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
            score["reference"] = str(reference)
        recorded[run["label"], run["seed"]] = run
    return recorded


def settings(args):
    # a float32 study's settings have no "bf16" (the studies committed before it existed)
    return {"preset": args.preset_name, "epochs": args.epochs, "layers": args.layers, "lr": args.lr,
            "warmup": args.warmup, "seeds": args.seeds, "variants": args.variants, "jobs": args.jobs,
            **({"bf16": True} if args.bf16 else {})}  # fmt: skip


def run_all(args, data_dir, recorded):
    runner = Runner(args, data_dir)
    signal.signal(signal.SIGINT, runner.stop)
    signal.signal(signal.SIGTERM, runner.stop)
    order = [(config, seed) for seed in args.seeds for config in args.configs  # seed 1 of every variant first
             if (config.label, seed) not in recorded]  # fmt: skip
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        errors = [e for e in pool.map(lambda pair: runner.run(*pair), order) if e]
    if runner.stopping:
        raise SystemExit(130)
    if errors:
        raise SystemExit(f"quality.py: error: {errors[0]}")


def collect(args, recorded):
    """Every finished run: its training summary and its scores on each test set."""
    runs = []
    for seed in args.seeds:
        for config in args.configs:
            run_dir = run_folder(args, config, seed)
            names = finished_test_sets(run_dir)
            if names is None:
                if (config.label, seed) in recorded:
                    runs.append(recorded[config.label, seed])
                continue
            scores = {name: quality_report.test_set_scores(run_dir, name, f"test{i or ''}", args.target_lang)
                      for i, name in enumerate(names)}  # fairseq's names for the test splits
            runs.append({"variant": config.variant, "lr": config.lr, "label": config.label, "seed": seed,
                         "folder": f"{run_dir.parent.name}/{run_dir.name}",
                         **quality_report.run_summary(run_dir), "test_sets": scores})  # fmt: skip
    labels = [config.label for config in args.configs]
    return sorted(runs, key=lambda r: (labels.index(r["label"]), r["seed"]))


def describe(args):
    size = args.preset.describe if not args.layers or args.layers == args.preset.layers else \
        f"{args.preset.describe} but {args.layers}+{args.layers} layers"
    lr = f", peak lr {args.lr:g}" if args.lr else ""
    lr += f", warm-up {args.warmup}" if args.warmup is not None else ""
    lr += "; bf16 mixed precision" if args.bf16 else ""
    return (f"Multi30k {args.source_lang}→{args.target_lang}, {size}, {args.epochs} epochs{lr}; "
            f"average of the last epoch checkpoints, beam 5; {args.machine}")


def main(argv=None):
    args = parse_args(argv)
    recorded = recorded_runs(args)
    if args.report_only:
        if not (args.out / "data" / "bin").exists() and not recorded:
            raise SystemExit(f"quality.py: error: --report-only: {args.out} holds no study (no {args.out / 'data' / 'bin'})")
    else:
        data_dir = prepare_data(args)
        run_all(args, data_dir, recorded)
    runs = collect(args, recorded)
    if not runs:
        raise SystemExit(f"quality.py: error: no finished run in {args.out} yet")
    labels = [config.label for config in args.configs]
    found = [] if args.sweep else quality_report.comparisons(runs)
    across_seeds = [] if args.sweep else quality_report.seed_comparisons(runs)
    print(quality_report.table(runs, labels, found, describe(args), across_seeds), flush=True)
    if args.figures:
        stem = Path(args.json).stem if args.json else f"quality-{args.pair}-{args.preset_name}"
        for path in quality_report.figures(runs, labels, Path(args.figures), stem, describe(args)):
            print(f"[quality] figure: {path}")
    if args.json:
        json_path = Path(args.json)
        quality_report.write_translations(runs, json_path.parent / json_path.stem, REPO, args.target_lang)
        for run in runs:
            for score in run["test_sets"].values():
                del score["hypotheses"]  # local paths; `translations` is the committed copy
        result = {
            "what": describe(args),
            "command": "python benchmarks/quality.py " + shlex.join(sys.argv[1:] if argv is None else argv),
            "machine": args.machine, "date": datetime.date.today().isoformat(),
            "settings": settings(args),
            "runs": runs, "comparisons": found, "seed_comparisons": across_seeds,
            "summary": quality_report.summary(runs, labels),
        }  # fmt: skip
        json_path.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
        print(f"[quality] wrote {json_path}")


if __name__ == "__main__":
    main()
