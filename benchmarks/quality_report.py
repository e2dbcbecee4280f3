"""What a finished quality run measured, and the study's report: the table (mean ± sample std over
seeds), paired bootstrap comparisons seed by seed, a permutation test across seeds, the JSON and
the figures. benchmarks/quality.py runs the trainings; this module only reads what they left in
their run folders:

- RUN/train.log: fairseq-train's log (every attempt appended): per epoch the training line
  (num_updates, wpb, train_wall) and the validation line (loss);
- RUN/score/TEST_SET/scores.json and the detokenised hypotheses beside it (scripts/score.py); for
  a run of the published recipe also the tokenised hypotheses, scored by the literature's BLEU
  (multi-bleu's, on the tokenised lowercased text) against the tokenised reference it names;
- RUN/attempts.jsonl: one line per attempt of the recipe that ended, with its wall time (an
  attempt killed with its machine or session writes none: its time is read from train.log);
- RUN/machines.jsonl: one line per attempt, written as it starts: its processor (a run that spans
  sessions may have trained on different VMs);
- RUN/diverged.json: where a run diverged (benchmarks/quality.py stops it there; see divergence()).
"""

import datetime
import gzip
import itertools
import json
import math
import re
import statistics
import textwrap
from pathlib import Path

import fairseq_log
from repo import quiet_logging

# Who is compared with whom, seed by seed: (system, baseline).
COMPARISONS = (
    ("realformer", "admin"),
    ("realformer", "post-ln"),
    ("admin", "post-ln"),
    ("post-ln-realformer", "post-ln"),
    ("post-ln-realformer", "admin"),  # does residual attention do for Post-LN what ADMIN does?
    ("post-ln-realformer", "fairseq"),  # residual attention on fairseq's own Transformer (Post-LN)
    ("admin", "fairseq"),
)
# The published recipe's reference: Wu et al. 2021 ("Good for Misconceived Reasons", ACL 2021; code
# LividWo/Revisit-MMT, README-baseline.md), a text-only fairseq Transformer of 4+4 layers, d=128.
PUBLISHED_BLEU = {"test_2016_flickr": 41.02}
BOOTSTRAP_SAMPLES = 1000  # sacrebleu --paired-bs-n's default
quiet_logging()  # sacrebleu's line for every resampling, matplotlib's for every font lookup

_TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \|")
_TRAIN_START = "| fairseq_cli.train | {'_name'"  # fairseq-train's config dump: one per invocation
_NAN_CRASH = "FloatingPointError: gradients are Nan/Inf"  # fairseq's trainer, on a non-finite gradient norm


def read_lines(path):
    with (gzip.open if str(path).endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def training_log(path):
    """Per epoch, fairseq-train's end-of-epoch training and validation fields, from its log.

    An epoch logged twice (an attempt killed after logging it but before saving its checkpoint,
    then run again) counts once: the last attempt's lines win."""
    epochs = {"train": {}, "valid": {}}
    for kind, fields in fairseq_log.records(read_lines(path) if Path(path).exists() else [], "train", "valid"):
        epochs[kind][fields["epoch"]] = fields
    return epochs["train"], epochs["valid"]


def divergence(run_dir):
    """Where a training diverged, from its log; None while it has not. A run diverges when its loss
    is NaN or infinite (fairseq-train then stops with FloatingPointError: gradients are Nan/Inf
    before it logs the loss, and saves checkpoints/crash.pt), or when its training loss, having
    fallen below the first epoch's mean training loss, climbs back above it: in a logged interval
    (fairseq's train_inner line, every 50 updates) or in an epoch. (A loss that never fell, as in
    the tests' two-epoch tiny runs, has not climbed back.) Returns the update and why."""
    first, fell, last_update = None, False, 0  # fell: the loss has been below the first epoch's since
    train_log = Path(run_dir) / "train.log"
    for line in read_lines(train_log) if train_log.exists() else []:
        kind, fields = fairseq_log.parse(line) or (None, None)
        if kind in ("train_inner", "train"):
            epoch, loss, update = fields["epoch"], fields["loss"], int(fields.get("num_updates", last_update))
        elif _NAN_CRASH in line:
            return {
                "update": crashed_at(Path(run_dir) / "checkpoints" / "crash.pt", last_update),
                "reason": "the gradients are NaN or infinite (fairseq-train stopped)",
            }
        else:
            continue
        last_update = update
        if not math.isfinite(loss):
            return {"update": update, "epoch": epoch, "loss": str(loss), "reason": "the training loss is not finite"}
        if first is not None and epoch > 1:
            if loss > first and fell:
                return {
                    "update": update,
                    "epoch": epoch,
                    "loss": loss,
                    "first_epoch_loss": first,
                    "reason": "the training loss climbed back above the first epoch's",
                }
            fell = fell or loss < first
        if kind == "train" and epoch == 1:
            first = loss
    return None


def crashed_at(crash_checkpoint, last_logged_update):
    """The update whose gradients were not finite: one after those crash.pt (fairseq's trainer
    saves it then) finished; without it, one after the last update the log names."""
    try:
        import torch

        state = torch.load(crash_checkpoint, map_location="cpu", weights_only=False)  # written by this run
        return int(state["optimizer_history"][-1]["num_updates"]) + 1
    except (OSError, KeyError, IndexError, RuntimeError):
        return last_logged_update + 1


def unrecorded_attempts(train_log, attempts):
    """Seconds of each fairseq-train invocation in *train_log* that no attempt of *attempts*
    covers: an attempt killed with its session (SIGKILL) leaves its log lines but no attempt
    record. Each is counted from its first to its last logged line, a lower bound (the recipe's
    few seconds before fairseq-train starts, and what it did after its last line, are missed)."""
    return [seconds for _, seconds in _unrecorded_spans(train_log, attempts)]


def _unrecorded_spans(train_log, attempts):
    """(first logged line, seconds) of each invocation unrecorded_attempts counts."""
    invocations = []  # [first, last] timestamp of each fairseq-train in the log
    for line in read_lines(train_log) if Path(train_log).exists() else []:
        match = _TIMESTAMP.match(line)
        if not match or not (invocations or _TRAIN_START in line):
            continue
        stamp = datetime.datetime.fromisoformat(match.group(1))
        if _TRAIN_START in line:
            invocations.append([stamp, stamp])
        invocations[-1][1] = stamp
    spans = _recorded_spans(attempts)
    return [
        (first, round((last - first).total_seconds(), 1))
        for first, last in invocations
        if not any(start <= first <= start + datetime.timedelta(seconds=wall) for start, wall in spans)
    ]


def _recorded_spans(attempts):
    """(start, seconds) of each recorded attempt that says when it started."""
    return [(datetime.datetime.fromisoformat(a["started"]), a["wall_s"]) for a in attempts if "started" in a]


def wall_s_by_cpu(attempts, killed, machines):
    """Wall seconds per processor model: each attempt (recorded in *attempts*, or killed: *killed*'s
    (first logged line, seconds)) trained on the processor of the last *machines* record written
    after the attempt before it started and not after it started; "not recorded" where there is
    none (attempts from before quality.py wrote machines.jsonl)."""
    spans = sorted(_recorded_spans(attempts) + killed)
    records = sorted((datetime.datetime.fromisoformat(m["started"]), m["cpu"]) for m in machines)
    seconds = {}
    unplaced = sum(a["wall_s"] for a in attempts if "started" not in a)
    if unplaced:
        seconds["not recorded"] = unplaced
    previous = datetime.datetime.min
    for start, wall in spans:
        cpus = [cpu for stamp, cpu in records if previous < stamp <= start]
        cpu = cpus[-1] if cpus else "not recorded"
        seconds[cpu] = round(seconds.get(cpu, 0.0) + wall, 1)
        previous = start
    return seconds


_STOPPED = {  # fairseq-train's own words for why it stopped, in its log
    "patience": "early stop since valid performance hasn't improved",
    "max-update": "Stopping training due to num_updates",
}


def stopped_by(train_log):
    """Why fairseq-train stopped (the last reason its log gives: "patience" or "max-update"); None
    for a run that reached its epoch limit, or has not stopped."""
    reasons = [
        name
        for line in (read_lines(train_log) if Path(train_log).exists() else [])
        for name, words in _STOPPED.items()
        if words in line
    ]
    return reasons[-1] if reasons else None


def run_summary(run_dir):
    """Updates, tokens/s, the validation curve, why it stopped and wall time of one run."""
    train, valid = training_log(run_dir / "train.log")
    epochs = sorted(train)
    updates = int(train[epochs[-1]]["num_updates"]) if epochs else 0
    tokens, seconds, previous = 0.0, 0.0, 0
    for epoch in epochs:  # target tokens per second of training, from fairseq's per-epoch wps
        fields = train[epoch]  # (not train_wall: whole seconds, 0 for the tests' sub-second epochs)
        epoch_tokens = fields["wpb"] * (fields["num_updates"] - previous)
        tokens += epoch_tokens
        seconds += epoch_tokens / fields["wps"] if fields["wps"] else 0.0
        previous = fields["num_updates"]
    curve = [(int(valid[e]["num_updates"]), valid[e]["loss"]) for e in sorted(valid)]
    attempts, machines = (
        [json.loads(line) for line in read_lines(run_dir / name)] if (run_dir / name).exists() else []
        for name in ("attempts.jsonl", "machines.jsonl")
    )
    killed = _unrecorded_spans(run_dir / "train.log", attempts)
    return {
        "updates": updates,
        "epochs": len(epochs),
        "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
        "best_valid_loss": min(loss for _, loss in curve) if curve else None,
        "valid_curve": curve,
        "wall_s": round(sum(a["wall_s"] for a in attempts) + sum(seconds for _, seconds in killed), 1),
        "wall_s_by_cpu": wall_s_by_cpu(attempts, killed, machines),
        "attempts": len(attempts) + len(killed),
        **({"stopped_by": stop} if (stop := stopped_by(run_dir / "train.log")) else {}),
    }


def test_set_scores(run_dir, name, subset, target_lang):
    """sacreBLEU (the recipe's, with signature), chrF and lowercased 13a BLEU of one test set; for
    a run of the published recipe, the literature's BLEU, sacreBLEU and chrF (case-insensitive)."""
    from sacrebleu.metrics import BLEU, CHRF

    scored = json.loads((run_dir / "score" / name / "scores.json").read_text())
    hypotheses = read_lines(run_dir / "score" / name / f"{subset}.hyp.{target_lang}")
    references = read_lines(scored["reference"])
    if "tokenized_bleu" in scored:
        return published_scores(run_dir, name, subset, target_lang, scored, hypotheses, references)
    chrf, lowercase = CHRF(), BLEU(lowercase=True)
    return {
        "sacrebleu": scored["sacrebleu"],
        "signature": scored["sacrebleu_signature"],
        "chrf": chrf.corpus_score(hypotheses, [references]).score,
        "chrf_signature": str(chrf.get_signature()),
        "bleu_lc": lowercase.corpus_score(hypotheses, [references]).score,
        "bleu_lc_signature": str(lowercase.get_signature()),
        "hypotheses": f"{run_dir / 'score' / name / f'{subset}.hyp.{target_lang}'}",
        "reference": scored["reference"],
    }


def published_scores(run_dir, name, subset, target_lang, scored, hypotheses, references):
    """A run of the published recipe: the literature's BLEU (tokenised, lowercased text; what the
    recipe's score.py computed), sacreBLEU and chrF case-insensitive on the detokenised output, each
    signature naming its metric; both forms of the hypotheses, as scored."""
    from sacrebleu.metrics import CHRF

    chrf = CHRF(lowercase=True)
    folder = run_dir / "score" / name
    return {
        "bleu_tok": scored["tokenized_bleu"],
        "bleu_tok_signature": f"BLEU|{scored['tokenized_signature']}|tokenised lowercased text (multi-bleu)",
        "sacrebleu": scored["sacrebleu"],
        "signature": f"BLEU|{scored['sacrebleu_signature']}",
        "chrf": chrf.corpus_score(hypotheses, [references]).score,
        "chrf_signature": f"chrF2|{chrf.get_signature()}",
        "hypotheses": str(folder / f"{subset}.hyp.{target_lang}"),
        "hypotheses_tok": str(folder / f"{subset}.hyp.tok.{target_lang}"),
        "reference": scored["reference"],
        "reference_tok": scored["tokenized_reference"],
    }


def primary(score):
    """The score a study compares on: the literature's BLEU for the published recipe, else sacreBLEU."""
    return score["bleu_tok"] if "bleu_tok" in score else score["sacrebleu"]


def paired_bootstrap(system, baseline, references, metric=None):
    """sacrebleu's paired bootstrap resampling (--paired-bs, 1,000 samples, its fixed seed): the
    BLEU difference system - baseline and its p-value (sacreBLEU's default BLEU, or *metric*)."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    test = PairedTest(
        [("baseline", baseline), ("system", system)],
        {"BLEU": metric or BLEU()},
        [references],
        test_type="bs",
        n_samples=BOOTSTRAP_SAMPLES,
    )
    _, scores = test()
    base, result = scores["BLEU"]
    return result.score - base.score, result.p_value


def comparisons(runs, pairs=COMPARISONS):
    """Each pair (system, baseline) of *pairs*, on each test set, for each seed that both variants
    finished."""
    from sacrebleu.metrics import BLEU

    by_key = {(r["variant"], r["seed"]): r for r in runs}
    found = []
    for a, b in pairs:
        for seed in sorted({r["seed"] for r in runs}):
            if (a, seed) not in by_key or (b, seed) not in by_key:
                continue
            for name, score_a in by_key[a, seed]["test_sets"].items():
                score_b = by_key[b, seed]["test_sets"][name]
                if "bleu_tok" in score_a:  # the published recipe: on its own metric, the tokenised text
                    delta, p_value = paired_bootstrap(
                        read_lines(score_a["hypotheses_tok"]),
                        read_lines(score_b["hypotheses_tok"]),
                        read_lines(score_a["reference_tok"]),
                        BLEU(tokenize="none", force=True),
                    )
                else:
                    delta, p_value = paired_bootstrap(
                        read_lines(score_a["hypotheses"]),
                        read_lines(score_b["hypotheses"]),
                        read_lines(score_a["reference"]),
                    )
                found.append(
                    {
                        "a": a,
                        "b": b,
                        "test_set": name,
                        "seed": seed,
                        "delta": round(delta, 2),
                        "p_value": round(p_value, 4),
                    }
                )
    return found


def permutation_test(scores_a, scores_b):
    """The difference of means a - b over seeds and its exact two-sided permutation p-value: the
    share of all splits of the pooled scores into groups of the two sizes whose difference of means
    is at least as large. It tests the spread between training runs, which a seed-level bootstrap
    cannot; with three seeds each there are 20 splits, so p is never below 0.1."""
    pooled = list(scores_a) + list(scores_b)
    observed = statistics.mean(scores_a) - statistics.mean(scores_b)
    splits = list(itertools.combinations(range(len(pooled)), len(scores_a)))
    as_large = 0
    for chosen in splits:
        group_a = [pooled[i] for i in chosen]
        group_b = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        as_large += abs(statistics.mean(group_a) - statistics.mean(group_b)) >= abs(observed) - 1e-9  # ties count
    return observed, as_large / len(splits), len(splits)


def seed_comparisons(runs, pairs=COMPARISONS):
    """Each pair (system, baseline) of *pairs*, on each test set, across seeds: sacreBLEU's
    difference of means and the permutation test's p-value (for variants with two seeds or more
    each)."""
    found = []
    for a, b in pairs:
        mine = {variant: [r for r in runs if r["variant"] == variant] for variant in (a, b)}
        if len(mine[a]) < 2 or len(mine[b]) < 2:
            continue
        for name in mine[a][0]["test_sets"]:
            delta, p_value, splits = permutation_test(
                [primary(r["test_sets"][name]) for r in mine[a]],
                [primary(r["test_sets"][name]) for r in mine[b]],
            )
            found.append(
                {
                    "a": a,
                    "b": b,
                    "test_set": name,
                    "seeds_a": [r["seed"] for r in mine[a]],
                    "seeds_b": [r["seed"] for r in mine[b]],
                    "delta_mean": round(delta, 2),
                    "p_value": round(p_value, 4),
                    "splits": splits,
                }
            )
    return found


def mean_std(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None


def cell(values, digits=2, scale=1.0):
    """A table cell: the mean ± sample std of *values* (None ignored), or "—" without any."""
    mean, std = mean_std([v * scale if v is not None else None for v in values])
    if mean is None:
        return "—"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")


def summary(runs, labels):
    """Per variant (label): the mean and sample standard deviation over its seeds."""
    out = {}
    for label in labels:
        mine = [r for r in runs if r["label"] == label and not r.get("diverged")]
        if not mine:
            continue
        entry = {"seeds": [r["seed"] for r in mine]}
        for key in ("updates", "wall_s", "tokens_per_s", "best_valid_loss"):
            entry[key] = dict(zip(("mean", "std"), mean_std([r[key] for r in mine])))
        for name in mine[0]["test_sets"]:
            entry[name] = {
                metric: dict(zip(("mean", "std"), mean_std([r["test_sets"][name][metric] for r in mine])))
                for metric in ("bleu_tok", "sacrebleu", "chrf", "bleu_lc")
                if metric in mine[0]["test_sets"][name]
            }
        if all("val" in r for r in mine):
            entry["val"] = {
                metric: dict(zip(("mean", "std"), mean_std([r["val"][metric] for r in mine])))
                for metric in ("bleu_tok", "sacrebleu")
                if metric in mine[0]["val"]
            }
        out[label] = entry
    return out


def score_columns(name, published):
    """The table's score columns for test set *name*: (heading, the cell's number from a score, or
    None); the published recipe's put the literature's BLEU first, and its distance to the
    published number."""
    if not published:
        return [
            ("sacreBLEU", lambda s: s["sacrebleu"]),
            ("chrF", lambda s: s["chrf"]),
            ("BLEU (lowercased, 13a)", lambda s: s["bleu_lc"]),
        ]
    reference = PUBLISHED_BLEU.get(name)
    return [
        ("BLEU (tokenised, lowercased: the literature's)", lambda s: s["bleu_tok"]),
        *([(f"minus the published {reference:.2f}", lambda s: s["bleu_tok"] - reference)] if reference else []),
        ("sacreBLEU (case-insensitive)", lambda s: s["sacrebleu"]),
        ("chrF (case-insensitive)", lambda s: s["chrf"]),
    ]


def table(runs, labels, comparisons_found, title, across_seeds=()):
    """The study as Markdown: one table per test set (mean ± std over seeds), then the comparisons
    seed by seed and across seeds. A study of the published recipe compares on the literature's
    BLEU, and says why each run stopped."""
    lines = [title, ""]
    runs = [r for r in runs if not r.get("diverged")]  # listed by sweep_table
    names = list(runs[0]["test_sets"]) if runs else []
    with_val = any("val" in r for r in runs)  # validation sacreBLEU: runs since the recipe scores it
    published = any("bleu_tok" in score for r in runs for score in r["test_sets"].values())
    metric = "the literature's BLEU" if published else "sacreBLEU"
    for name in names:
        columns = score_columns(name, published)
        headings = [heading for heading, _ in columns] + ["best valid loss", "updates"]
        headings += ["epochs", "stopped by"] if published else []
        headings += ["wall (min)", "tokens/s"] + (["val BLEU"] if with_val else [])
        lines += [
            f"**{name}** (mean ± sample std over seeds)",
            "",
            "| variant | seeds | " + " | ".join(headings) + " |",
            "|---|---|" + "---|" * len(headings),
        ]
        for label in labels:
            mine = [r for r in runs if r["label"] == label]
            if not mine:
                continue
            scores = [r["test_sets"][name] for r in mine]
            cells = [cell([number(s) for s in scores]) for _, number in columns]
            cells += [cell([r["best_valid_loss"] for r in mine], 3), cell([r["updates"] for r in mine], 0)]
            if published:
                cells += [cell([r["epochs"] for r in mine], 0), ", ".join(r.get("stopped_by", "—") for r in mine)]
            cells += [cell([r["wall_s"] for r in mine], 1, 1 / 60), cell([r["tokens_per_s"] for r in mine], 0)]
            if with_val:
                cells.append(cell([primary(r["val"]) if "val" in r else None for r in mine]))
            lines.append(f"| {label} | {','.join(str(r['seed']) for r in mine)} | " + " | ".join(cells) + " |")
        first = scores[0]
        signatures = (
            f"the literature's BLEU: {first['bleu_tok_signature']}; sacreBLEU: {first['signature']}; "
            f"chrF: {first['chrf_signature']}"
            if published
            else f"sacreBLEU: {first['signature']}; chrF: {first['chrf_signature']}; "
            f"lowercased BLEU: {first['bleu_lc_signature']}"
        )
        lines += ["", signatures, ""]
    if comparisons_found:
        lines += [
            f"Paired bootstrap resampling (sacrebleu, {BOOTSTRAP_SAMPLES} samples), {metric} of a minus b, seed by seed:",
            "",
            "| a | b | test set | seed | Δ BLEU | p-value |",
            "|---|---|---|---|---|---|",
        ]
        for c in comparisons_found:
            lines.append(
                f"| {c['a']} | {c['b']} | {c['test_set']} | {c['seed']} | {c['delta']:+.2f} | {c['p_value']:.3f} |"
            )
    if across_seeds:
        lines += [
            "",
            f"Across seeds: difference of the {metric} means, a minus b, and its exact permutation test "
            "(every split of the seeds' scores into the two groups):",
            "",
            "| a | b | test set | seeds | Δ mean BLEU | p-value | splits |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in across_seeds:
            seeds = f"{','.join(map(str, c['seeds_a']))} / {','.join(map(str, c['seeds_b']))}"
            lines.append(
                f"| {c['a']} | {c['b']} | {c['test_set']} | {seeds} | {c['delta_mean']:+.2f} "
                f"| {c['p_value']:.3f} | {c['splits']} |"
            )
    return "\n".join(lines)


def scored_sets(run):
    """A run's scores by set name: its test sets, and "val" when it scored the validation set."""
    return {**run["test_sets"], **({"val": run["val"]} if "val" in run else {})}


def is_sweep(study):
    """A study of several learning rates (its settings list them; the first, post-ln-only sweep
    committed did not, and compares nothing across variants either way)."""
    return "lrs" in study["settings"]


def compared_runs(study):
    """The runs a study compares across seeds: all of them; in a sweep, each variant at its best
    rate (none when it chose none)."""
    if not is_sweep(study):
        return study["runs"]
    best = study.get("best", {})
    return [r for r in study["runs"] if r["variant"] in best and r["lr"] == best[r["variant"]]]


def last_gap(run):
    """The last checkpoint the run's dropout-gap record scored (the averaged one, which translates,
    when it has one), as "off / on (checkpoint)"; "—" without a record."""
    rows = (run.get("dropout_gap") or {}).get("rows")
    if not rows:
        return "—"
    row = rows[-1]
    epoch = row["checkpoint"].removeprefix("checkpoint").removesuffix(".pt")
    name = "averaged" if epoch == "_avg" else f"epoch {epoch}"
    return f"{row['dropout_off']:.3f} / {row['dropout_on']:.3f} ({name})"


def sweep_table(runs, variants, lrs, what, best=None):
    """A learning-rate sweep as Markdown: per variant and rate (*lrs*, and any other its runs have),
    the first seed's validation and test sacreBLEU and best validation loss, or where it diverged;
    each variant's best rate marked."""
    test_names = next((list(r["test_sets"]) for r in runs if r["test_sets"]), [])
    seed = min(r["seed"] for r in runs)
    gaps = any(r.get("dropout_gap") for r in runs)  # benchmarks/quality.py --dropout-gap
    lines = [
        f"{what}",
        "",
        f"Seed {seed} at each peak learning rate (★: the variant's best on validation BLEU):",
        "",
        "| variant | peak lr | val BLEU | "
        + " | ".join(f"{name} BLEU" for name in test_names)
        + " | best valid loss | updates |"
        + (" last checkpoint: valid loss, dropout off / on |" if gaps else ""),
        "|---|---|---|" + "---|" * len(test_names) + "---|---|" + ("---|" if gaps else ""),
    ]
    by_key = {(r["variant"], r["lr"], r["seed"]): r for r in runs}
    for variant in variants:
        for lr in sorted({*lrs, *(r["lr"] for r in runs if r["variant"] == variant)}):  # and --widen's
            r = by_key.get((variant, lr, seed))
            star = " ★" if best and best.get(variant) == lr else ""
            if r is None:
                cells = ["not finished yet"] + ["—"] * len(test_names) + ["—", "—"]
            elif r.get("diverged"):
                where = r["diverged"]
                cells = (
                    [f"diverged at update {where['update']}"] + ["—"] * len(test_names) + ["—", str(where["update"])]
                )
            else:
                cells = (
                    [f"{r['val']['sacrebleu']:.2f}" if "val" in r else "—"]
                    + [f"{r['test_sets'][name]['sacrebleu']:.2f}" for name in test_names]
                    + [f"{r['best_valid_loss']:.3f}" if r["best_valid_loss"] is not None else "—", str(r["updates"])]
                )
            if gaps:
                cells.append(last_gap(r) if r else "—")
            lines.append(f"| {variant}{star} | {lr:g} | " + " | ".join(cells) + " |")
    diverged = [r for r in runs if r.get("diverged")]
    if diverged:
        lines += [
            "",
            "Diverged (stopped there, not retried): "
            + "; ".join(
                f"{r['variant']} lr={r['lr']:g} seed {r['seed']} at update {r['diverged']['update']} "
                f"({r['diverged']['reason']})"
                for r in diverged
            ),
        ]
    return "\n".join(lines)


def write_translations(runs, folder, repo, target_lang):
    """Each run's hypotheses, gzipped (reproducibly: no name or time in the header), into folder;
    the runs' `translations` become those paths, relative to the repository when inside it."""
    folder.mkdir(parents=True, exist_ok=True)
    for run in runs:
        for name, score in scored_sets(run).items():
            run_name = run["folder"].replace("/", ".")  # e.g. post-ln.seed1, post-ln-lr0.002.seed1
            # the published recipe's are scored in two forms: detokenised, and tokenised (.tok)
            for key, form in (("hypotheses", ""), ("hypotheses_tok", ".tok")):
                if key not in score:
                    continue
                target = folder / f"{run_name}.{name}{form}.{target_lang}.gz"
                data = "".join(f"{line}\n" for line in read_lines(score[key])).encode("utf-8")  # also a committed .gz
                with open(target, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
                    f.write(data)
                resolved = target.resolve()
                score[key.replace("hypotheses", "translations")] = str(
                    resolved.relative_to(repo) if resolved.is_relative_to(repo) else resolved
                )


def figures(runs, labels, folder, stem, what):
    """Two PNGs: validation loss against updates (seeds as a band), and test sacreBLEU per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    what = textwrap.fill(what, 85)  # the title's second line: what was measured on which data and machine
    present = [label for label in labels if any(r["label"] == label for r in runs)]
    colours = dict(zip(present, plt.get_cmap("tab10").colors))
    fig, ax = plt.subplots(figsize=(8, 5))
    tail = []
    for variant in present:
        curves = [r["valid_curve"] for r in runs if r["label"] == variant and r["valid_curve"]]
        length = min(len(c) for c in curves)
        updates = [statistics.mean(c[i][0] for c in curves) for i in range(length)]
        losses = [[c[i][1] for c in curves] for i in range(length)]
        ax.plot(
            updates,
            [statistics.mean(v) for v in losses],
            color=colours[variant],
            label=f"{variant} ({len(curves)} seed{'s' if len(curves) > 1 else ''})",
        )
        if len(curves) > 1:
            ax.fill_between(
                updates, [min(v) for v in losses], [max(v) for v in losses], color=colours[variant], alpha=0.25
            )
        tail += [loss for v in losses[length // 4 :] for loss in v]
    if tail:  # the first epochs' losses are far above the rest: show where the variants differ
        ax.set_ylim(min(tail) - 0.05, max(tail) + 0.05)
    ax.set_xlabel("updates")
    ax.set_ylabel("validation loss (label-smoothed cross-entropy, base 2)")
    ax.set_title(f"Validation loss during training, mean over seeds (band: min–max)\n{what}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths = [folder / f"{stem}.valid-loss.png"]
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)

    names = list(runs[0]["test_sets"]) if runs else []
    fig, axes = plt.subplots(1, len(names), figsize=(max(8, 1.5 * len(present)) * len(names), 4.8), squeeze=False)
    for ax, name in zip(axes[0], names):
        for i, variant in enumerate(present):
            scores = [primary(r["test_sets"][name]) for r in runs if r["label"] == variant]
            ax.scatter([i] * len(scores), scores, color=colours[variant], zorder=3, label="seeds" if i == 0 else None)
            ax.hlines(statistics.mean(scores), i - 0.3, i + 0.3, color="black", label="mean" if i == 0 else None)
        # a sweep's labels carry their rate ("post-ln-realformer lr=0.004"): on two lines they do not collide
        ax.set_xticks(range(len(present)), [label.replace(" lr=", "\nlr=") for label in present])
        metric = "BLEU (tokenised, lowercased)" if "bleu_tok" in runs[0]["test_sets"][name] else "sacreBLEU"
        ax.set_ylabel(metric)
        ax.set_title(f"Test {metric} on {name}, each seed and the mean\n{what}", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    paths.append(folder / f"{stem}.bleu.png")
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)
    return paths


def sweep_lines(studies, variants, test_name):
    """The sweep figure's lines: for each study (its runs, line style, name) and each variant, the
    first seed's test sacreBLEU at every rate it finished, and the rates where it diverged."""
    lines = []
    for study_runs, style, name in studies:
        seed = min((r["seed"] for r in study_runs), default=1)
        for variant in variants:
            mine = sorted(
                (r for r in study_runs if r["variant"] == variant and r["seed"] == seed), key=lambda r: r["lr"]
            )
            scored = [r for r in mine if not r.get("diverged") and test_name in r["test_sets"]]
            lines.append(
                {
                    "variant": variant,
                    "label": f"{variant} ({name})" if name else variant,
                    "style": style,
                    "lr": [r["lr"] for r in scored],
                    "bleu": [r["test_sets"][test_name]["sacrebleu"] for r in scored],
                    "diverged": [(r["lr"], r["diverged"]["update"]) for r in mine if r.get("diverged")],
                }
            )
    return lines


def sweep_figure(runs, variants, lrs, folder, stem, what, beside=None, name=""):
    """Test sacreBLEU against the peak learning rate, one line per variant (the first seed), diverged
    runs marked on the axis; with *beside* (another sweep's runs and its name), its lines dashed and
    this sweep's named *name*."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    test_name = next((list(r["test_sets"])[0] for r in runs if r["test_sets"]), None)
    colours = dict(zip(variants, plt.get_cmap("tab10").colors))
    fig, ax = plt.subplots(figsize=(8, 5.2))
    marked = False
    studies = [(runs, "-", name if beside else "")] + ([(beside[0], "--", beside[1])] if beside else [])
    for line in sweep_lines(studies, variants, test_name):
        colour = colours[line["variant"]]
        if line["lr"]:
            ax.plot(line["lr"], line["bleu"], line["style"], marker="o", color=colour, label=line["label"])
        for lr, update in line["diverged"]:
            ax.scatter(
                [lr], [0], marker="x", s=80, color=colour, zorder=3, label=None if marked else "diverged (stopped)"
            )
            ax.annotate(
                f"{line['label']}: update {update}",
                (lr, 0),
                textcoords="offset points",
                xytext=(4, 6 + 10 * variants.index(line["variant"])),
                fontsize=7,
                color=colour,
            )
            marked = True
    ax.set_xscale("log")
    ticks = sorted({*lrs, *(r["lr"] for r in runs), *(r["lr"] for r in (beside[0] if beside else ()))})
    ax.set_xticks(ticks, [f"{lr:g}" for lr in ticks])
    ax.minorticks_off()
    ax.set_ylim(-1, ax.get_ylim()[1] + 2)  # room above the best point, and the diverged marks at 0
    ax.set_xlabel("peak learning rate (log scale)")
    ax.set_ylabel(f"test sacreBLEU ({test_name})")
    ax.set_title(f"Test BLEU against peak learning rate, seed 1 (x: diverged)\n{textwrap.fill(what, 85)}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = folder / f"{stem}.bleu-vs-lr.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
