"""The Multi30k recipe (examples/multi30k/run.sh) as a study calls it: the data prepared once, and
each run's command with the fairseq-train flags every variant shares."""

import fcntl
from pathlib import Path

from common import commands
from common.repo import REPO, STOCK, USER_DIR, VARIANTS, VENV

RECIPE = REPO / "examples" / "multi30k" / "run.sh"
UPDATES_PER_EPOCH = REPO / "examples" / "wmt14" / "updates_per_epoch.py"
RECIPE_ARCH = "realformer_iwslt_de_en"  # run.sh's default ARCH
MAX_TOKENS = "4096"  # run.sh's --max-tokens


def run_flags(study, prepare_only=False):
    """The recipe's options: how the data are prepared, then --prepare-only or a run's --bf16, then the languages."""
    middle = ["--prepare-only"] if prepare_only else ["--bf16"] if study.bf16 else []
    languages = ["--source-lang", study.source_lang, "--target-lang", study.target_lang]
    tests = ["--test-sets", study.test_sets] if study.test_sets else []
    return [*(["--tiny"] if study.quick else []), *study.preset.recipe, *middle, *languages, *tests]


def prepare_data(study):
    """Binarise the data once for every run (run.sh --prepare-only; skipped when done), one study at a time."""
    data_dir = study.out / "data"
    cmd = ["bash", str(RECIPE), *run_flags(study, prepare_only=True), study.data, str(data_dir)]
    print(f"[quality] data: {' '.join(cmd)}", flush=True)
    study.out.mkdir(parents=True, exist_ok=True)
    with open(study.out / "prepare.log", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when it is closed
        commands.run(cmd, study.out / "prepare.log", append=True, name="preparing the data")
    return data_dir


def counted_updates_per_epoch(data_dir):
    """The updates per epoch updates_per_epoch() counted on *data_dir*; None before."""
    cache = Path(data_dir) / "updates_per_epoch"
    return int(cache.read_text()) if cache.exists() else None


def updates_per_epoch(study, data_dir):
    """How many updates one epoch makes (the linear decay ends with the last epoch); cached."""
    cache = data_dir / "updates_per_epoch"
    if not cache.exists():
        cmd = [str(VENV / "bin" / "python"), str(UPDATES_PER_EPOCH), str(data_dir / "bin"), "--user-dir", str(USER_DIR)]
        cmd += ["--arch", RECIPE_ARCH, "--source-lang", study.source_lang, "--target-lang", study.target_lang]
        cmd += ["--max-tokens", MAX_TOKENS, "--seed", "1"]
        counted = commands.run(cmd, name="counting the updates per epoch").stdout
        cache.write_text(counted.strip().splitlines()[-1] + "\n")
    return counted_updates_per_epoch(data_dir)


def training_flags(study, data_dir, lr):
    """The fairseq-train flags every variant shares (after the recipe's own, so they win)."""
    flags = list(study.preset.model)
    if study.layers:
        flags += ["--encoder-layers", str(study.layers), "--decoder-layers", str(study.layers)]
    if lr:
        flags += ["--lr", f"{lr:g}"]
    if study.warmup is not None:
        flags += ["--warmup-updates", str(study.warmup)]
    if study.preset.linear_decay:
        total = study.epochs * updates_per_epoch(study, data_dir)
        flags += ["--lr-scheduler", "polynomial_decay", "--total-num-update", str(total), "--end-learning-rate", "0"]
    return flags


def command(study, data_dir, config, seed, run_dir):
    """`bash run.sh RECIPE-FLAGS DATA RUN -- FAIRSEQ-TRAIN-FLAGS` of one run; the variant's flags
    after the shared ones: admin-radam's --warmup-updates 0 must win."""
    flags = training_flags(study, data_dir, config.lr)
    flags += [*VARIANTS.get(config.variant, ()), "--seed", str(seed)]  # a STOCK variant: its ARCH, no flags
    return ["bash", str(RECIPE), *run_flags(study), study.data, str(run_dir), "--", *flags]


def environment(study, variant):
    """The recipe's environment variables for a run of *variant*."""
    env = {"EPOCHS": str(study.epochs)}
    if variant in STOCK:
        env["ARCH"] = STOCK[variant]
    if study.jobs > 1:  # one thread each: N runs side by side make more tokens/s than one of N threads
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env
