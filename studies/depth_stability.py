"""Depth stability: do deep, narrow models train at an aggressive learning rate?

Every variant of fairseq_realformer/variants.py is trained by ``fairseq-train --user-dir
fairseq_realformer`` with the same seed, data, budget and learning rate on a few thousand Multi30k
En→De pairs (read from a local folder). For each: the first layers' gradient norms at
initialisation (one batch, dropout on), the final train and valid losses, and whether it diverged
by studies/divergence.py's rule, the quality studies' too: a loss that is not finite (fairseq
stopped on NaN/Inf gradients), or a training loss that fell below its first epoch's mean and climbed
back above it. (Rows committed before 2026-11-28 were judged by "the last logged loss at or above
the first"; every one ended well below its first, and their logs were not kept to judge again.)

    python studies/depth_stability.py --data ../shared/data/multi30k    # ~25 min on 2 CPU cores

Results are kept in --out, and a re-run skips finished variants. ``--add-to TABLE`` merges new
variants into a committed table (studies/results/cpu-depth-stability-*.json): a variant the table
lacks becomes a row; one it has is re-run as a control, kept beside the rows with whether it
measured the same as its row. A merge the table records already is not trained again.

    python studies/depth_stability.py --variants post-ln-realformer,post-ln \\
        --add-to studies/results/cpu-depth-stability-lr3e-3.json
"""

if __name__ == "__main__" and not __package__:  # run by its path, from any folder: as `python -m` its module
    import by_path  # noqa: F401  (common/by_path.py, linked beside this file)

import argparse
import math
import os
import sys
import warnings
from pathlib import Path

from common import allocator, commands, fairseq_log, multi30k_args
from common.host import host
from common.presets import TRAINING
from common.repo import REPO, RUNS, USER_DIR, VARIANTS, commit, import_fairseq_quietly, work_folder
from common.results import header, read_result, write_json, write_result
from studies.checkpoints import training_task
from studies.divergence import divergence

BIN = Path(sys.executable).parent
# options that say where results go, not what is measured: a folder or table of other values still compares
RECORD_ONLY = ("variants", "json", "out", "add_to", "machine")
# what a control re-run must reproduce, exactly, for new rows to compare with a table's old ones
MEASURED = ("first_train_loss", "final_train_loss", "valid_loss", "diverged")
MEASURED += ("grad_norm_encoder_layer0", "grad_norm_decoder_layer0")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="work folder (default: runs/depth_stability; runs/ is REALFORMER_RUNS when set)")
    p.add_argument("--pairs", type=int, default=4000, help="training sentence pairs (default: %(default)s)")
    p.add_argument("--valid-pairs", type=int, default=500)
    p.add_argument("--vocab", type=int, default=2000, help="joint sentencepiece vocabulary")
    p.add_argument("--layers", default="18-18", help="encoder-decoder layers (default: %(default)s)")
    p.add_argument("--dim", type=int, default=64, help="model width (default: %(default)s)")
    p.add_argument("--ffn", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=50, help="warmup updates (default: %(default)s)")
    p.add_argument("--max-update", type=int, default=150, help="updates per variant (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--seed", type=int, default=1)
    multi30k_args.add(p, ",".join(VARIANTS))
    p.add_argument(
        "--add-to", metavar="TABLE", help="merge the runs into this table (an earlier --json of these settings)"
    )
    p.add_argument("--machine", default=host(), help="the machine, recorded with --add-to (default: %(default)s)")
    args = p.parse_args(argv)
    multi30k_args.check(p, args)
    if args.add_to and not Path(args.add_to).is_file():
        p.error(f"--add-to {args.add_to}: no such table (an earlier run's --json)")
    return args


def log(message):
    print(f"[depth-stability] {message}", flush=True)


def prepare(args, out: Path) -> Path:
    """First --pairs training and --valid-pairs validation pairs, joint sentencepiece,
    fairseq-preprocess (scripts/binarize.py; skipped when done)."""
    bin_dir, data = out / "bin", Path(args.data)
    log(f"data: {args.pairs} train / {args.valid_pairs} valid pairs from {args.data} -> {bin_dir}")
    binarize = [
        sys.executable, str(REPO / "scripts" / "binarize.py"), "--source-lang", "en", "--target-lang", "de",
        "--trainpref", str(data / "train"), "--validpref", str(data / "val"),
        "--max-lines", f"train={args.pairs},valid={args.valid_pairs}",
        "--spm-vocab", str(args.vocab), "--spm-dir", str(out / "spm"), "--destdir", str(bin_dir),
    ]  # fmt: skip
    commands.run(binarize, out / "binarize.log")
    return bin_dir


def variant_flags(args, variant: str):
    """The variant's flags (fairseq_realformer/variants.py), last so that they win. A variant
    without warm-up (``--warmup-updates 0``, which fairseq's inverse_sqrt cannot take) keeps the
    learning rate at its peak for the --warmup updates the others warm up in, then decays like
    theirs."""
    flags = list(VARIANTS[variant])
    if ("--warmup-updates", "0") in zip(flags, flags[1:]):
        at = flags.index("--warmup-updates")
        flags[at : at + 2] = ["--warmup-init-lr", str(args.lr)]
    return flags


def train_flags(args, bin_dir: Path, variant: str):
    enc, dec = args.layers.split("-")
    return [
        str(bin_dir), "--user-dir", str(USER_DIR), "--arch", "realformer_iwslt_de_en", *TRAINING,
        "--encoder-layers", enc, "--decoder-layers", dec, "--encoder-embed-dim", str(args.dim),
        "--decoder-embed-dim", str(args.dim), "--encoder-ffn-embed-dim", str(args.ffn),
        "--decoder-ffn-embed-dim", str(args.ffn), "--encoder-attention-heads", str(args.heads),
        "--decoder-attention-heads", str(args.heads), "--dropout", "0.1", "--lr", str(args.lr),
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(args.warmup), "--warmup-init-lr", "1e-7",
        "--max-tokens", str(args.max_tokens), "--max-update", str(args.max_update), "--seed", str(args.seed),
        "--log-interval", "10", "--no-save", *variant_flags(args, variant),
    ]  # fmt: skip


def first_layer_grad_norms(flags):
    """Gradient norms of the first encoder and decoder layers at initialisation, on the first
    training batch (dropout on), the same way fairseq-train builds model, data and loss."""
    from fairseq import utils

    from fairseq_realformer.modules import admin

    import_fairseq_quietly()  # fairseq-train's own run logs all this; here it would bury this probe's line
    cfg, task = training_task(flags)
    utils.set_torch_seed(cfg.common.seed)
    model, criterion = task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    batches = task.get_batch_iterator(task.dataset("train"), max_tokens=cfg.dataset.max_tokens, seed=cfg.common.seed)
    sample = next(batches.next_epoch_itr(shuffle=False))
    admin.initialize(model, sample["net_input"])  # fairseq-train does it at this point too
    model.train()
    loss, sample_size, _ = criterion(model, sample)
    (loss / sample_size).backward()  # fairseq-train's normalisation: per target token
    return tuple(
        math.sqrt(sum(float(p.grad.norm()) ** 2 for p in stack.layers[0].parameters() if p.grad is not None))
        for stack in (model.encoder, model.decoder)
    )


def run_variant(args, bin_dir: Path, out: Path, variant: str):
    """*variant* trained and measured, into its result.json (read back where a run before wrote it)."""
    result_file = out / variant / "result.json"
    if result_file.exists():
        log(f"{variant}: reusing {result_file}")
        return read_result(result_file)
    flags, at = train_flags(args, bin_dir, variant), commit()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # hydra's and torch's notices: fairseq-train's log below has them
        norms = first_layer_grad_norms(flags)
    log(f"{variant}: first-layer gradient norms at init: encoder {norms[0]:.3g}, decoder {norms[1]:.3g}; training")
    train_log = out / variant / "train.log"
    run = commands.run([BIN / "fairseq-train", *flags], train_log, env=allocator.environment(), check=False)
    lines = run.output.splitlines()
    stats = list(fairseq_log.records(lines, "train_inner", "valid"))
    train = [fields["loss"] for kind, fields in stats if kind == "train_inner"] or [None]
    valid = next((fields["loss"] for kind, fields in reversed(stats) if kind == "valid"), None)
    # fairseq stops on NaN/Inf gradients with a FloatingPointError: diverged, not failed
    error = commands.last_error(run.output)
    stopped_on_nan = run.returncode != 0 and ("FloatingPointError" in error or "nan" in error.lower())
    if run.returncode != 0 and not stopped_on_nan:
        raise SystemExit(f"depth_stability.py: error: {variant}: {run.failure()}")
    diverged = stopped_on_nan or divergence(lines) is not None
    measured = dict(zip(MEASURED, (train[0], train[-1], valid, diverged, *norms)))
    result = {"variant": variant, **measured, "wall_s": round(run.seconds, 1), "commit": at}
    write_json(result_file, result)
    log(f"{variant}: train loss {train[0]} -> {train[-1]}, valid {valid}, diverged {diverged} ({result['wall_s']} s)")
    return result


def table(args, results):
    fmt = lambda x: "—" if x is None else f"{x:.3f}"  # noqa: E731
    lines = [
        f"{args.layers} layers, d={args.dim}, FFN {args.ffn}, {args.heads} heads; {args.pairs} Multi30k pairs; "
        f"Adam lr {args.lr} (inverse sqrt, {args.warmup} warmup; admin-radam: RAdam, no warmup: the peak lr "
        f"from the first update), {args.max_update} updates of ≤{args.max_tokens} tokens, seed {args.seed}",
        "",
        "| variant | grad norm enc. layer 1 | grad norm dec. layer 1 | train loss start → end | valid loss | diverged |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['variant']} | {r['grad_norm_encoder_layer0']:.3g} | {r['grad_norm_decoder_layer0']:.3g} | "
            f"{fmt(r['first_train_loss'])} → {fmt(r['final_train_loss'])} | {fmt(r['valid_loss'])} | "
            f"{'**yes**' if r['diverged'] else 'no'} |"
        )
    return "\n".join(lines)


def _differing(table, settings):
    """The settings, but the data folder, in which *table*'s runs differ from these."""
    return [k for k in settings if k != "data" and table["settings"].get(k) != settings[k]]


def _controls(table):
    return [c["run"] for added in table.get("additions", ()) for c in added.get("controls", ())]


def added_already(table, settings, variants):
    """Whether --add-to has merged these *variants* into *table* before, perhaps on another machine
    whose run folders are gone: each is a row added by a merge or a row with a recorded control."""
    done = {v for added in table.get("additions", ()) for v in added["variants"]}
    done |= {run["variant"] for run in _controls(table)}
    return not _differing(table, settings) and all(v in done for v in variants)


def add_to_table(table, settings, results, record):
    """*table* with *results* merged in, or None when it holds them all already. A variant new to it
    becomes a row; one it has is a control, kept in the merge's record with whether its MEASURED
    values equal its row's. The merge is recorded under "additions" with *record* (date, commit,
    command, machine)."""
    differ = _differing(table, settings)
    if differ:
        shown = ", ".join(f"{k} {table['settings'].get(k)} there, {settings[k]} here" for k in differ)
        raise ValueError(f"its runs used other settings ({shown})")
    rows = {run["variant"]: run for run in table["runs"]}
    new = [r for r in results if r["variant"] not in rows]
    controls = [r for r in results if r["variant"] in rows and r != rows[r["variant"]] and r not in _controls(table)]
    if not new and not controls:
        return None
    addition = {"variants": [r["variant"] for r in new], **record}
    if controls:
        addition["controls"] = [
            {"run": r, "same_as_row": all(r[k] == rows[r["variant"]][k] for k in MEASURED)} for r in controls
        ]
    merged = dict(table, runs=table["runs"] + new, additions=[*table.get("additions", ()), addition])
    merged["settings"] = dict(table["settings"], variants=[*table["settings"]["variants"], *addition["variants"]])
    return merged


def merge(args, settings, results, argv):
    table_file = Path(args.add_to)
    measured_at = ", ".join(dict.fromkeys(r["commit"] for r in results if r.get("commit")))  # runs reused too
    record = {**header(__file__, argv, args.machine), "commit": measured_at or commit()}
    try:
        merged = add_to_table(read_result(table_file), settings, results, record)
    except ValueError as e:
        raise SystemExit(f"depth_stability.py: error: --add-to {table_file}: {e}") from None
    if merged is None:
        log(f"{table_file} holds these runs already")
        return
    for control in merged["additions"][-1].get("controls", ()):
        variant = control["run"]["variant"]
        if control["same_as_row"]:
            log(f"{variant}: the control measured what its row says, so the new rows compare with the old")
        else:
            log(f"{variant}: WARNING the control differs from its row: the new rows do not compare with the old")
    write_json(table_file, merged)
    log(f"added {', '.join(merged['additions'][-1]['variants']) or 'controls'} to {table_file}")


def main(argv=None):
    args = parse_args(argv)
    settings = {k: v for k, v in vars(args).items() if k not in RECORD_ONLY}
    if args.add_to and added_already(read_result(args.add_to), settings, args.variants):
        log(f"{args.add_to} holds these runs already: nothing to train")
        return
    out = work_folder(args.out or RUNS / "depth_stability")
    out.mkdir(parents=True, exist_ok=True)
    settings_file = out / "settings.json"
    if settings_file.exists() and read_result(settings_file) != settings:
        raise SystemExit(
            f"depth_stability.py: error: --out {out} holds results of other settings ({settings_file}); choose another --out"
        )
    write_json(settings_file, settings)
    bin_dir = prepare(args, out)
    results = [run_variant(args, bin_dir, out, v) for v in args.variants]
    print(table(args, results))
    if args.json:
        write_result(args.json, __file__, argv, args.machine, settings=vars(args), runs=results)
    if args.add_to:
        merge(args, settings, results, argv)


if __name__ == "__main__":
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # the plugin loads checkpoints safely
    with commands.exit_on_failure("depth_stability.py"):
        main()
