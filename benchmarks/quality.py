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
    python benchmarks/quality.py --preset cpu --bf16 --variants post-ln,realformer --seeds 1,2 \\
        --json benchmarks/results/cpu-quality-multi30k-en-de-bf16.json    # in bf16 mixed precision

Presets (the same settings for every variant; --lr, --warmup, --epochs, --layers override them):
  gpu    the recipe's model: 6+6 layers, 512/1024, 4 heads, dropout 0.3, Adam 5e-4 with
         inverse-sqrt warm-up 1000, 12 epochs
  cpu    4+4 layers, d=128, FFN 256, 4 heads, dropout 0.3, label smoothing 0.1, Adam (0.9, 0.98)
         peak lr 2e-3 after 400 warm-up updates, then linear decay to 0 at the end of epoch 20
         (the RealFormer paper's schedule for NMT); 4,096 tokens a batch, ~132 updates an epoch.
         On an idle 2-core CPU an epoch takes ~100 s, so a run ~35-40 min (benchmarks/RESULTS.md:
         how the learning rate was chosen, and the times measured)
  published  the literature's text-only recipe, as Wu et al. 2021 published it for 41.02 BLEU on
         test_2016_flickr (the recipe's --published): lowercased, Moses-tokenised text with joint
         BPE (10,000 merges), 4+4 layers, d=128, FFN 256, 4 heads, dropout 0.3; Adam 5e-3 after
         2,000 warm-up updates from 1e-7, 8,192 tokens an update, clip-norm 25; at most 8,000
         updates, stopped after 10 epochs without a better validation loss; average of the last
         10 epoch checkpoints. Scored as the literature scores it: BLEU on the tokenised,
         lowercased text (multi-bleu's number), and sacreBLEU and chrF case-insensitive on the
         Moses-detokenised output. The variant "fairseq" is fairseq's own `transformer`.

    nice -n 19 python benchmarks/quality.py --preset published --seeds 1 --jobs 2 \\
        --variants fairseq,post-ln-realformer,admin,realformer \\
        --json benchmarks/results/cpu-quality-multi30k-en-de-published.json
  --quick  the recipe's --tiny mode (first 300 lines, width 32) with 2+2 layers, 2 epochs: its
         BLEU says the pipeline works, not which model is better

The study can be stopped at any time (Ctrl-C, or kill its process group) and run again with the
same command: finished runs are skipped and an interrupted run resumes from its last epoch
checkpoint. The runs a --json file of the same settings holds count as finished too, so a
committed study goes on in a fresh checkout. Seed 1 of every variant runs first, then seed 2,
..., so partial results stay balanced. --jobs N trains N runs side by side with one thread each:
on this project's 2-core machine two one-thread runs made ~5,250 target tokens/s together, one
two-thread run ~4,500.

Learning rates: --lr 2e-3,4e-3,8e-3 is a sweep, every variant at every rate. Each run also scores
the validation set; --best-seeds 2,3 then trains those seeds for each variant at the rate where its
--seeds runs scored the best validation BLEU (never a test set), as soon as that variant's sweep is
in. With --widen, a variant whose best rate is the lowest or the highest of --lr also trains its
--seeds at half that rate or twice it, and its best is chosen among the three. The report is the
sweep's table and figure (test BLEU against the rate), then each variant at its best against the
others, with the comparisons above.

    nice -n 19 python benchmarks/quality.py --preset cpu --bf16 --lr 2e-3,4e-3,8e-3 --seeds 1 \\
        --best-seeds 2,3 --variants post-ln,pre-ln,admin,realformer,post-ln-realformer --jobs 2 \\
        --json benchmarks/results/cpu-quality-lr-sweep-multi30k-en-de-bf16.json --figures docs/figures/lr-sweep

Divergence: a run whose loss becomes NaN or infinite, or whose training loss climbs back above its
first epoch's mean (in any 50-update interval fairseq logs, or any epoch), is stopped at once. It is
recorded, in OUT/.../diverged.json and the JSON, with the update where it happened; it is shown in
the table and the figure, and never retried or chosen as a best.

Dropout gap: with --dropout-gap, every finished run's kept epoch checkpoints and its averaged one
are scored on the validation set with dropout off (fairseq's validation loss) and on (as it
trains), by benchmarks/dropout_gap.py, into OUT/.../dropout_gap.json and the JSON; the sweep's
table shows the last checkpoint's pair (the averaged one). A deep Post-LN run can learn with
dropout on and break with it off; the logged validation loss alone cannot tell that from a run
that learned nothing.

Layout: OUT/data (binarised once, shared), OUT/VARIANT/seedS (one recipe run each; with --lr,
--warmup, --epochs or --layers given, OUT/VARIANT-lr0.002-.../seedS; with --bf16, which trains and
translates in bfloat16 mixed precision, OUT/VARIANT-...-bf16/seedS).
"""

import argparse
import contextlib
import datetime
import fcntl
import io
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dropout_gap as gap_script  # noqa: E402
import multi30k_args  # noqa: E402
import quality_report  # noqa: E402
from host import cpu_model, host  # noqa: E402
from presets import PRESETS  # noqa: E402
from repo import REPO, STOCK, USER_DIR, VARIANTS, VENV, repo_relative  # noqa: E402

RECIPE = REPO / "examples" / "multi30k" / "run.sh"
UPDATES_PER_EPOCH = REPO / "examples" / "wmt14" / "updates_per_epoch.py"
DEFAULT_VARIANTS = "post-ln,pre-ln,admin,realformer-sum,realformer"
RECIPE_ARCH = "realformer_iwslt_de_en"  # run.sh's default ARCH
MAX_TOKENS = "4096"  # run.sh's --max-tokens
WATCH_S = 10  # how often a training's log is read for a divergence


def keep_niceness(pid: int) -> None:
    """Give the new session of *pid* this process's niceness. With Linux's autogroup scheduling
    (``/proc/sys/kernel/sched_autogroup_enabled``) nice ranks processes only inside their session;
    each session competes with the others as a group at its own autogroup nice (0), so a run
    started in a new session under ``nice -n 19`` would take an equal share of the cores from
    everything else instead of yielding. Where there are no autogroups, nothing to do."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{os.nice(0)}\n")
    except OSError:
        pass


@dataclass(frozen=True)
class RunConfig:
    label: str  # the table's and the figures' name: the variant, or "variant lr=X" in a sweep
    variant: str
    lr: float  # None: the recipe's
    suffix: str  # of its folders: OUT/VARIANT+SUFFIX/seedS


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="work folder (default: runs/quality-SRC-TGT-PRESET)")
    p.add_argument(
        "--preset",
        choices=("gpu", "cpu", "published"),
        default="gpu",
        help="model size and schedule (default: %(default)s)",
    )
    p.add_argument("--quick", action="store_true", help="the recipe's --tiny mode, 2+2 layers: minutes on a CPU")
    p.add_argument("--seeds", default="1", metavar="1,2,3", help="comma list of seeds (default: %(default)s)")
    p.add_argument(
        "--jobs", type=int, default=1, metavar="N", help="trainings side by side, one thread each (default: 1)"
    )
    p.add_argument("--epochs", type=int, help="training epochs (default: the preset's)")
    p.add_argument(
        "--lr",
        metavar="LR[,LR...]",
        help="peak learning rate (default: the preset's); several: a sweep, each its own runs",
    )
    p.add_argument(
        "--best-seeds",
        metavar="2,3",
        dest="best_seeds_given",
        help="with several --lr: then train these seeds too, for each variant at the rate whose "
        "--seeds runs scored the best validation BLEU",
    )
    p.add_argument(
        "--widen",
        action="store_true",
        help="with several --lr: where a variant's best rate is the lowest or the highest of them, also "
        "train its --seeds at half the lowest or twice the highest, and choose among the three (no "
        "variant loses for want of its rate)",
    )
    p.add_argument(
        "--best-variants",
        metavar="A,B,...",
        help="with --best-seeds: only these of --variants get the further seeds (default: all; e.g. not "
        "the ones that do not train at this depth)",
    )
    p.add_argument(
        "--warmup", type=int, metavar="UPDATES", help="learning-rate warm-up updates (default: the preset's)"
    )
    p.add_argument("--layers", type=int, metavar="N", help="encoder and decoder layers (default: the preset's)")
    p.add_argument(
        "--bf16",
        action="store_true",
        help="train and translate in bfloat16 mixed precision (the recipe's --bf16; folders VARIANT-bf16)",
    )
    p.add_argument("--source-lang", default="en", help="en, de, fr or cs (default: %(default)s)")
    p.add_argument("--target-lang", default="de", help="en, de, fr or cs (default: %(default)s)")
    p.add_argument(
        "--test-sets",
        metavar="A,B,...",
        help="test sets of --data to score (default: every test_* set in both languages)",
    )
    p.add_argument("--report-only", action="store_true", help="train nothing: report the runs already finished")
    p.add_argument(
        "--dropout-gap",
        action="store_true",
        help="score every finished run's kept checkpoints with dropout off and on (benchmarks/dropout_gap.py)",
    )
    p.add_argument("--figures", metavar="DIR", help="draw the learning curves and the BLEU per seed into DIR")
    p.add_argument(
        "--beside",
        metavar="JSON",
        help="a sweep's figure also draws this other sweep's lines, dashed (e.g. 4+4 beside 12+12 layers)",
    )
    p.add_argument(
        "--machine",
        default=host(),
        help="the machine, for the figures' titles and the JSON (default: %(default)s)",
    )
    multi30k_args.add(p, DEFAULT_VARIANTS, also=STOCK)
    return p


def comma_ints(p, flag, given, example):
    try:
        return sorted({int(s) for s in given.split(",") if s.strip()})
    except ValueError:
        p.error(f"--{flag} {given}: expected a comma list of integers, e.g. {example}")


def check_best_seeds(p, args):
    """--best-seeds and --best-variants: the further seeds of a sweep, and for which variants."""
    args.best_seeds = []
    if args.best_variants is not None and args.best_seeds_given is None:
        p.error("--best-variants: only with --best-seeds")
    if args.best_seeds_given is None:
        return
    args.best_seeds = comma_ints(p, "best-seeds", args.best_seeds_given, "2,3")
    if not args.sweep:
        p.error("--best-seeds: needs several --lr to choose from")
    if args.best_variants is not None:
        args.best_variants = [v.strip() for v in args.best_variants.split(",") if v.strip()]
        unknown = [v for v in args.best_variants if v not in args.variants]
        if unknown or not args.best_variants:
            p.error(f"--best-variants {','.join(unknown)}: give some of --variants ({','.join(args.variants)})")
    if set(args.best_seeds) & set(args.seeds):
        p.error(
            f"--best-seeds {args.best_seeds_given}: the sweep's --seeds already train {','.join(map(str, args.seeds))}"
        )


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    multi30k_args.check(p, args, also=STOCK)
    args.seeds = comma_ints(p, "seeds", args.seeds, "1,2,3")
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
    if args.quick and args.preset == "published":  # run.sh: --tiny and --published exclude each other
        p.error("--quick: the published recipe has no tiny form; drop --quick, or use --preset cpu")
    args.preset_name = "quick" if args.quick else args.preset
    preset = PRESETS[args.preset_name]
    # runs with settings given on the command line get their own folders: OUT/post-ln-lr0.002/seed1
    args.run_suffix = "".join(
        f"-{name}{getattr(args, name):g}" for name in ("warmup", "epochs", "layers") if getattr(args, name) is not None
    ) + ("-bf16" if args.bf16 else "")
    lrs = args.lrs if lr_given is not None else [preset.lr]
    sweep = len(lrs) > 1
    args.configs = [
        RunConfig(
            f"{variant} lr={lr:g}" if sweep else variant,
            variant,
            lr,
            (f"-lr{lr:g}" if lr_given is not None else "") + args.run_suffix,
        )
        for variant in args.variants
        for lr in lrs
    ]
    args.sweep, args.lr, args.lrs = sweep, None if sweep else lrs[0], lrs
    if args.widen and not sweep:
        p.error("--widen: needs several --lr to widen")
    # --widen: the rate beyond each edge, trained for a variant whose best is at that edge
    args.beyond = [
        RunConfig(f"{variant} lr={lr:g}", variant, lr, f"-lr{lr:g}{args.run_suffix}")
        for variant in (args.variants if args.widen else ())
        for lr in (min(lrs) / 2, max(lrs) * 2)
    ]
    check_best_seeds(p, args)
    args.epochs = args.epochs or preset.epochs
    args.layers = args.layers or preset.layers
    args.warmup = preset.warmup if args.warmup is None else args.warmup
    args.preset = preset
    args.pair = f"{args.source_lang}-{args.target_lang}"
    args.out = Path(args.out or REPO / "runs" / f"quality-{args.pair}-{args.preset_name}")
    return args


def recipe_language_flags(args):
    return [
        "--source-lang",
        args.source_lang,
        "--target-lang",
        args.target_lang,
        *(["--test-sets", args.test_sets] if args.test_sets else []),
    ]


def recipe_run_flags(args):
    """The recipe's options of one training run (besides the languages)."""
    return [*recipe_data_flags(args), *(["--bf16"] if args.bf16 else []), *recipe_language_flags(args)]


def recipe_data_flags(args):
    """The recipe's options that decide how the data are prepared."""
    return [*(["--tiny"] if args.quick else []), *args.preset.recipe]


def prepare_data(args):
    """Binarise the data once for every run (run.sh --prepare-only; skipped when done)."""
    data_dir = args.out / "data"
    cmd = [
        "bash",
        str(RECIPE),
        *recipe_data_flags(args),
        "--prepare-only",
        *recipe_language_flags(args),
        args.data,
        str(data_dir),
    ]
    print(f"[quality] data: {' '.join(cmd)}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "prepare.log", "a") as log:
        if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
            raise SystemExit(f"quality.py: error: {recipe_error(args.out / 'prepare.log', 'preparing the data')}")
    return data_dir


def recipe_error(log_path, what):
    errors = [line for line in log_path.read_text().splitlines() if line.startswith("run.sh: error: ")]
    return errors[-1][len("run.sh: error: ") :] if errors else f"{what} failed; see {log_path}"


def updates_per_epoch(args, data_dir):
    """How many updates one epoch makes (the linear decay ends with the last epoch); cached."""
    cache = data_dir / "updates_per_epoch"
    if not cache.exists():
        cmd = [
            str(VENV / "bin" / "python"),
            str(UPDATES_PER_EPOCH),
            str(data_dir / "bin"),
            "--user-dir",
            str(USER_DIR),
            "--arch",
            RECIPE_ARCH,
            "--source-lang",
            args.source_lang,
            "--target-lang",
            args.target_lang,
            "--max-tokens",
            MAX_TOKENS,
            "--seed",
            "1",
        ]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(
                f"quality.py: error: counting the updates per epoch failed: {result.stderr.strip().splitlines()[-1:]}"
            )
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


def diverged(run_dir):
    """Where the run diverged (the record quality.py wrote when it stopped it); None if it did not."""
    record = run_dir / "diverged.json"
    return json.loads(record.read_text()) if record.exists() else None


def record_dropout_gap(args, run_dir):
    """The validation loss of a finished run's kept checkpoints with dropout off and on, into
    RUN/dropout_gap.json (once: a record that exists is whole). A run with no checkpoint left (a
    diverged run stopped before its first epoch ended) has none."""
    record = run_dir / "dropout_gap.json"
    if record.exists():
        return
    try:
        gap_script.checkpoints_of(run_dir, None)  # what dropout_gap.py scores, if anything
    except gap_script.InputError:
        return
    print(f"[quality {time.strftime('%H:%M:%S')}] dropout gap: {run_dir}", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1") if args.jobs > 1 else None
    cmd = [str(VENV / "bin" / "python"), gap_script.__file__, str(run_dir), "--json", str(record)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise SystemExit(f"quality.py: error: --dropout-gap on {run_dir}: {last}")


def gap_record(run_dir):
    """The run's dropout-gap record with checkpoint names, not local paths; None if it has none."""
    record = run_dir / "dropout_gap.json"
    if not record.exists():
        return None
    gap = json.loads(record.read_text())
    for row in gap["rows"]:
        row["checkpoint"] = Path(row["checkpoint"]).name
    return gap


def finished(run_dir):
    """Nothing left to do: the run diverged, or it scored its test sets and the validation set (a
    run finished before the recipe scored validation sets runs again to score it, and only that)."""
    return diverged(run_dir) is not None or (
        finished_test_sets(run_dir) is not None and (run_dir / "score" / "val" / "scores.json").exists()
    )


class Runner:
    """Runs the recipe for (variant, seed) pairs, N at a time; stops them all on SIGINT/SIGTERM."""

    def __init__(self, args, data_dir):
        self.args, self.data_dir = args, data_dir
        self.running, self.lock, self.stopping, self.locks = set(), threading.Lock(), False, []

    def command(self, config, seed, run_dir):
        # variant flags after the shared ones: admin-radam's --warmup-updates 0 must win
        return [
            "bash",
            str(RECIPE),
            *recipe_run_flags(self.args),
            self.args.data,
            str(run_dir),
            "--",
            *training_flags(self.args, self.data_dir, config.lr),
            *VARIANTS.get(config.variant, ()),  # a STOCK variant is its --arch (ARCH), no plugin flags
            "--seed",
            str(seed),
        ]

    def run(self, config, seed):
        run_dir = run_folder(self.args, config, seed)
        variant = config.label
        if finished(run_dir):
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
        if config.variant in STOCK:
            env["ARCH"] = STOCK[config.variant]
        if self.args.jobs > 1:
            env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        start = time.time()
        # written before it starts: an attempt killed with its session writes nothing after
        with open(run_dir / "machines.jsonl", "a") as machines:
            started = datetime.datetime.fromtimestamp(start).isoformat(timespec="seconds")
            machines.write(json.dumps({"started": started, "cpu": cpu_model()}) + "\n")
        with open(run_dir / "recipe.log", "a") as log:
            with self.lock:
                if self.stopping:  # a stop came while this run was queued: nothing starts, nothing said
                    return "stopped"
                print(f"[quality {time.strftime('%H:%M:%S')}] start {variant} seed {seed}: {run_dir}", flush=True)
                process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                keep_niceness(process.pid)
                self.running.add(process)
            returncode, where = self.wait_watching(process, run_dir)
            with self.lock:
                self.running.discard(process)
        with open(run_dir / "attempts.jsonl", "a") as attempts:
            attempts.write(
                json.dumps(
                    {
                        "started": started,
                        "wall_s": round(time.time() - start, 1),
                        "returncode": returncode,
                    }
                )
                + "\n"
            )
        if where is not None:  # stopped there, recorded, not retried
            (run_dir / "diverged.json").write_text(json.dumps(where) + "\n")
            print(
                f"[quality {time.strftime('%H:%M:%S')}] {variant} seed {seed} diverged at update {where['update']}: "
                f"{where['reason']}; stopped",
                flush=True,
            )
            return None
        if returncode != 0:
            return "stopped" if self.stopping else recipe_error(run_dir / "recipe.log", f"{variant} seed {seed}")
        print(
            f"[quality {time.strftime('%H:%M:%S')}] done {variant} seed {seed} in {time.time() - start:.0f} s",
            flush=True,
        )
        return None

    def wait_watching(self, process, run_dir):
        """Wait for the recipe, reading its training log every WATCH_S seconds: a run that diverges
        is stopped at once (its process group). Returns the exit status and where it diverged."""
        while True:
            try:
                returncode = process.wait(timeout=WATCH_S)
                break
            except subprocess.TimeoutExpired:
                if quality_report.divergence(run_dir) is not None and not self.stopping:
                    os.killpg(process.pid, signal.SIGTERM)
        return returncode, None if self.stopping else quality_report.divergence(run_dir)

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
    study goes on in a fresh checkout (no run folders) without training them again. Only runs
    trained with the same settings count, each under this study's label for its variant and rate:
    a sweep takes the runs of a single-rate study of the same settings as its own at that rate."""
    path = Path(args.json) if args.json else None
    if path is None or not path.exists():
        return {}
    study = json.loads(path.read_text())
    defining = ("preset", "epochs", "layers", "warmup", "bf16")  # what the runs were trained with, but the rate
    if any(study.get("settings", {}).get(key) != settings(args).get(key) for key in defining):
        return {}
    labels = {(config.variant, config.lr): config.label for config in args.configs + args.beyond}
    recorded = {}
    for run in study["runs"]:
        label = labels.get((run["variant"], run["lr"]))
        if label is None:  # a rate or variant this study does not train
            continue
        for name, score in quality_report.scored_sets(run).items():  # what comparisons() reads: the committed copies
            score["hypotheses"] = str(REPO / score["translations"])
            reference = Path(args.data) / f"{name}.{args.target_lang}.gz"
            if args.quick:  # --tiny scores the first lines only, as many as it translated
                lines = quality_report.read_lines(reference)[: len(quality_report.read_lines(score["hypotheses"]))]
                reference = args.out / f"{name}.{args.target_lang}"
                args.out.mkdir(parents=True, exist_ok=True)
                reference.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
            score["reference"] = str(reference)
            if "translations_tok" in score:  # the published recipe's: against the prepared tokenised reference
                score["hypotheses_tok"] = str(REPO / score["translations_tok"])
                score["reference_tok"] = str(REPO / score["reference_tok"])
        recorded[label, run["seed"]] = {**run, "label": label}
    return recorded


def settings(args):
    # a float32 study's settings have no "bf16" (the studies committed before it existed)
    return {
        "preset": args.preset_name,
        "epochs": args.epochs,
        "layers": args.layers,
        "lr": args.lr,
        "warmup": args.warmup,
        "seeds": args.seeds,
        "variants": args.variants,
        "jobs": args.jobs,
        **({"lrs": args.lrs} if args.sweep else {}),
        **({"best_seeds": args.best_seeds} if args.best_seeds else {}),
        **({"best_variants": args.best_variants} if args.best_variants else {}),
        **({"widen": True} if args.widen else {}),
        **({"bf16": True} if args.bf16 else {}),
    }


def run_all(args, data_dir, recorded, on_finished=None):
    """Every (config, seed) of the study, --jobs at a time, seed 1 of every config first; with
    --best-seeds, a variant's further seeds are queued at its best rate as soon as its sweep is in.
    *on_finished*() is called each time runs finish (or diverge) while the study goes on."""
    runner = Runner(args, data_dir)
    signal.signal(signal.SIGINT, runner.stop)
    signal.signal(signal.SIGTERM, runner.stop)
    queued, errors = set(), []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:

        def submit(config, seed):
            if (config.label, seed) not in recorded and (config.label, seed) not in queued:
                queued.add((config.label, seed))
                pending.add(pool.submit(runner.run, config, seed))

        pending = set()
        for seed in args.seeds:
            for config in args.configs:
                submit(config, seed)
        while True:
            for config in widening(args, recorded):  # a variant's best at an edge: the rate beyond it
                for seed in args.seeds:
                    submit(config, seed)
            best = best_configs(args, recorded)
            for seed in args.best_seeds:  # seed 2 of every variant before seed 3: partial results stay balanced
                for variant, config in best.items():
                    if variant in (args.best_variants or args.variants):
                        submit(config, seed)
            if not pending:
                break
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            errors += [future.result() for future in done if future.result()]
            if on_finished is not None and not runner.stopping and any(not f.result() for f in done):
                on_finished()
    if runner.stopping:
        raise SystemExit(130)
    if errors:
        raise SystemExit(f"quality.py: error: {errors[0]}")


def best_configs(args, recorded):
    """Per variant whose --seeds runs have all finished at every rate: the config (rate) with the
    best mean validation sacreBLEU over those seeds; diverged runs are never best. With --widen, a
    variant whose best is at an edge of --lr is decided only once the rate beyond it is in too."""
    runs = {(r["label"], r["seed"]): r for r in collect(args, recorded, seeds=args.seeds)}
    best = {}
    for variant in args.variants:
        mine = [c for c in args.configs if c.variant == variant]
        beyond = _beyond(args, _best_of(mine, runs, args.seeds))
        chosen = _best_of(mine + ([beyond] if beyond else []), runs, args.seeds)
        if chosen is not None:
            best[variant] = chosen
    return best


def widening(args, recorded):
    """--widen: the configs beyond an edge that a variant's best rate on the sweep's rates is at."""
    runs = {(r["label"], r["seed"]): r for r in collect(args, recorded, seeds=args.seeds)}
    mine = ([c for c in args.configs if c.variant == variant] for variant in args.variants)
    return [beyond for beyond in (_beyond(args, _best_of(m, runs, args.seeds)) for m in mine) if beyond]


def _beyond(args, chosen):
    """The --widen config beyond *chosen*'s rate, if that rate is an edge of --lr; else None."""
    if chosen is None or not args.beyond:
        return None
    edges = {min(args.lrs): min(args.lrs) / 2, max(args.lrs): max(args.lrs) * 2}
    return next((c for c in args.beyond if c.variant == chosen.variant and c.lr == edges.get(chosen.lr)), None)


def _best_of(configs, runs, seeds):
    """The config of *configs* with the best mean validation sacreBLEU over *seeds*, once every one
    has finished them (None before); diverged runs are never best."""
    if not all((c.label, seed) in runs for c in configs for seed in seeds):
        return None
    scored = {c: [runs[c.label, seed] for seed in seeds] for c in configs}
    scored = {c: rs for c, rs in scored.items() if all(not r.get("diverged") and r.get("val") for r in rs)}
    if not scored:
        return None
    return max(scored, key=lambda c: statistics.mean(r["val"]["sacrebleu"] for r in scored[c]))


def collect(args, recorded, seeds=None):
    """Every finished run: its training summary and its scores on each test set and on the
    validation set; a diverged run, where it diverged (and no scores)."""
    runs = []
    for seed in seeds or args.seeds + args.best_seeds:
        for config in args.configs + args.beyond:
            run_dir = run_folder(args, config, seed)
            names, where = finished_test_sets(run_dir), diverged(run_dir)
            if names is None and where is None:
                if (config.label, seed) in recorded:
                    runs.append(recorded[config.label, seed])
                continue
            run = {
                "variant": config.variant,
                "lr": config.lr,
                "label": config.label,
                "seed": seed,
                "folder": f"{run_dir.parent.name}/{run_dir.name}",
                **quality_report.run_summary(run_dir),
            }
            gap = gap_record(run_dir)
            if gap is not None:
                run["dropout_gap"] = gap
            if where is not None:
                runs.append({**run, "diverged": where, "test_sets": {}})
                continue
            run["test_sets"] = {
                name: quality_report.test_set_scores(run_dir, name, f"test{i or ''}", args.target_lang)
                for i, name in enumerate(names)
            }  # fairseq's names for the test splits
            if (run_dir / "score" / "val" / "scores.json").exists():
                run["val"] = quality_report.test_set_scores(run_dir, "val", "valid", args.target_lang)
            runs.append(run)
    labels = [config.label for config in args.configs + args.beyond]
    return sorted(runs, key=lambda r: (labels.index(r["label"]), r["seed"]))


def describe(args):
    size = args.preset.describe
    if args.layers and args.layers != args.preset.layers:
        depth = f"{args.layers}+{args.layers} layers"  # the preset's "N+N layers" says what was trained
        size, found = re.subn(r"^\d+\+\d+ layers", depth, size)
        size = size if found else f"{size}, {depth}"
    lr = f", peak lr {args.lr:g}" if args.lr else ""
    lr += f", warm-up {args.warmup}" if args.warmup is not None else ""
    lr += "; bf16 mixed precision" if args.bf16 else ""
    return (
        f"Multi30k {args.source_lang}→{args.target_lang}, {size}{f', {args.epochs} epochs' if args.epochs else ''}{lr}; "
        f"average of the last epoch checkpoints, beam 5; {args.machine}"
    )


def write_figures(args, runs, compared, compared_labels):
    """The sweep's figure (test BLEU against rate, --beside another depth's) and quality_report's
    figures of each variant at its best rate; their paths."""
    stem = Path(args.json).stem if args.json else f"quality-{args.pair}-{args.preset_name}"
    paths = []
    if args.sweep:
        beside = None
        if args.beside:
            other = json.loads(Path(args.beside).read_text())
            beside = (other["runs"], "{0}+{0} layers".format(other["settings"]["layers"]))
        layers = args.layers or args.preset.layers
        paths.append(
            quality_report.sweep_figure(
                runs,
                args.variants,
                args.lrs,
                Path(args.figures),
                stem,
                describe(args),
                beside,
                f"{layers}+{layers} layers",
            )
        )
    if compared:
        paths += quality_report.figures(
            compared, compared_labels, Path(args.figures), stem + ("-best" if args.sweep else ""), describe(args)
        )
    return paths


def write_json(args, argv, runs, best, found, across_seeds):
    """--json: the study with its translations committed beside it (hypotheses' local paths dropped)."""
    json_path = Path(args.json)
    quality_report.write_translations(runs, json_path.parent / json_path.stem, REPO, args.target_lang)
    for run in runs:
        for score in quality_report.scored_sets(run).values():
            del score["hypotheses"]  # local paths; `translations` is the committed copy
            if "hypotheses_tok" in score:
                del score["hypotheses_tok"]
                score["reference_tok"] = repo_relative(score["reference_tok"])  # made again by the same command
    labels = [config.label for config in args.configs + args.beyond]
    result = {
        "what": describe(args),
        "command": "python benchmarks/quality.py " + shlex.join(sys.argv[1:] if argv is None else argv),
        "machine": args.machine,
        "date": datetime.date.today().isoformat(),
        "settings": settings(args),
        "runs": runs,
        **({"best": best} if args.sweep else {}),
        "comparisons": found,
        "seed_comparisons": across_seeds,
        "summary": quality_report.summary(runs, labels),
    }
    json_path.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(f"[quality] wrote {json_path}")


def main(argv=None):
    args = parse_args(argv)
    recorded = recorded_runs(args)
    if args.report_only:
        if not (args.out / "data" / "bin").exists() and not recorded:
            raise SystemExit(
                f"quality.py: error: --report-only: {args.out} holds no study (no {args.out / 'data' / 'bin'})"
            )
        if args.preset.recipe:  # the published recipe's comparisons read its tokenised references: prepared again
            prepare_data(args)
    else:
        data_dir = prepare_data(args)
        run_all(args, data_dir, recorded, lambda: report_so_far(args, argv, recorded) if args.json else None)
    write_report(args, argv, recorded)


def report_so_far(args, argv, recorded):
    """The report and --json after a run finished, while others train: a study of many sessions
    keeps (and can commit) every run as it finishes. Its failure stops no training."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the tables are printed once, at the end
            write_report(args, argv, recorded)
        print(f"[quality {time.strftime('%H:%M:%S')}] the finished runs so far are in {args.json}", flush=True)
    except (Exception, SystemExit) as e:  # noqa: BLE001
        print(f"[quality {time.strftime('%H:%M:%S')}] the report so far failed ({e}); the runs go on", flush=True)


def write_report(args, argv, recorded):
    """The dropout gap of every finished run (--dropout-gap), the tables, the figures and --json."""
    if args.dropout_gap:
        configs = args.configs + args.beyond
        run_dirs = [run_folder(args, config, seed) for seed in args.seeds + args.best_seeds for config in configs]
        for run_dir in filter(finished, run_dirs):
            record_dropout_gap(args, run_dir)
    runs = collect(args, recorded)
    if not runs:
        raise SystemExit(f"quality.py: error: no finished run in {args.out} yet")
    best = {variant: config.lr for variant, config in best_configs(args, recorded).items()} if args.sweep else {}
    study = {"settings": settings(args), "runs": runs, "best": best}
    compared = quality_report.compared_runs(study)  # each variant once: at its best rate in a sweep
    configs = args.configs + args.beyond
    compared_labels = [config.label for config in configs if any(r["label"] == config.label for r in compared)]
    found, across_seeds = quality_report.comparisons(compared), quality_report.seed_comparisons(compared)
    if args.sweep:
        print(quality_report.sweep_table(runs, args.variants, args.lrs, describe(args), best), flush=True)
    if compared:
        title = (
            "Each variant at its best peak learning rate (chosen on validation BLEU)" if args.sweep else describe(args)
        )
        print(quality_report.table(compared, compared_labels, found, title, across_seeds), flush=True)
    if args.figures:
        for path in write_figures(args, runs, compared, compared_labels):
            print(f"[quality] figure: {path}")
    if args.json:
        write_json(args, argv, runs, best, found, across_seeds)


if __name__ == "__main__":
    main()
