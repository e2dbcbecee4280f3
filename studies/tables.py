"""A study's tables, in Markdown: each variant's scores over seeds with the comparisons, and a
learning-rate sweep's runs rate by rate."""

from studies.scoring import BOOTSTRAP_SAMPLES, mean_std, primary

# The published recipe's reference: Wu et al. 2021 ("Good for Misconceived Reasons", ACL 2021; code
# LividWo/Revisit-MMT, README-baseline.md), a text-only fairseq Transformer of 4+4 layers, d=128.
PUBLISHED_BLEU = {"test_2016_flickr": 41.02}
SIGNATURES = {  # the line under a test set's table, by whether the study is the published recipe's
    False: (("sacreBLEU", "signature"), ("chrF", "chrf_signature"), ("lowercased BLEU", "bleu_lc_signature")),
    True: (("the literature's BLEU", "bleu_tok_signature"), ("sacreBLEU", "signature"), ("chrF", "chrf_signature")),
}


def cell(values, digits=2, scale=1.0):
    """A table cell: the mean ± sample std of *values* (None ignored), or "—" without any."""
    mean, std = mean_std([v * scale if v is not None else None for v in values])
    if mean is None:
        return "—"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")


def markdown(headings, rows):
    """A Markdown table's lines: its headings, its rule, a line per row of cells."""
    lines = ["| " + " | ".join(map(str, cells)) + " |" for cells in [headings, *rows]]
    return [lines[0], "|" + "---|" * len(headings), *lines[1:]]


def score_columns(name, published):
    """The score columns for test set *name*: (heading, a score's number); the published recipe's
    put the literature's BLEU first, and its distance to the published number."""
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


def table(record, title, found, across_seeds=()):
    """A study's runs compared (StudyRecord.scored): per test set the mean ± std over seeds, then the
    comparisons seed by seed and across seeds (the published recipe's on the literature's BLEU)."""
    lines = [title, ""]
    runs = record.scored  # the diverged: listed by sweep_table
    labels = dict.fromkeys(r.label for r in runs)
    with_val = any(r.val is not None for r in runs)  # validation sacreBLEU: runs since the recipe scores it
    published = any("bleu_tok" in score for r in runs for score in r.test_sets.values())
    metric = "the literature's BLEU" if published else "sacreBLEU"
    for name in runs[0].test_sets if runs else []:
        columns = score_columns(name, published)
        headings = [heading for heading, _ in columns] + ["best valid loss", "updates"]
        headings += ["epochs", "stopped by"] if published else []
        headings += ["wall (min)", "tokens/s"] + (["val BLEU"] if with_val else [])
        rows = []
        for label in labels:
            mine = [r for r in runs if r.label == label]
            cells = [cell([number(r.test_sets[name]) for r in mine]) for _, number in columns]
            cells += [cell([r.best_valid_loss for r in mine], 3), cell([r.updates for r in mine], 0)]
            if published:
                cells += [cell([r.epochs for r in mine], 0), ", ".join(r.stopped_by or "—" for r in mine)]
            cells += [cell([r.wall_s for r in mine], 1, 1 / 60), cell([r.tokens_per_s for r in mine], 0)]
            if with_val:
                cells.append(cell([primary(r.val) if r.val is not None else None for r in mine]))
            rows.append([label, ",".join(str(r.seed) for r in mine), *cells])
        lines += [f"**{name}** (mean ± sample std over seeds)", "", *markdown(["variant", "seeds", *headings], rows)]
        first = mine[0].test_sets[name]
        lines += ["", "; ".join(f"{score}: {first[key]}" for score, key in SIGNATURES[published]), ""]
    if found:
        rows = [[c["a"], c["b"], c["test_set"], c["seed"], f"{c['delta']:+.2f}", f"{c['p_value']:.3f}"] for c in found]
        bootstrap = f"Paired bootstrap resampling (sacrebleu, {BOOTSTRAP_SAMPLES} samples), {metric} of a minus b"
        lines += [f"{bootstrap}, seed by seed:", ""]
        lines += markdown(["a", "b", "test set", "seed", "Δ BLEU", "p-value"], rows)
    if across_seeds:
        across = f"Across seeds: difference of the {metric} means, a minus b, and its exact permutation test"
        lines += ["", f"{across} (every split of the seeds' scores into the two groups):", ""]
        rows = [
            [c["a"], c["b"], c["test_set"], " / ".join(",".join(map(str, c[k])) for k in ("seeds_a", "seeds_b"))]
            + [f"{c['delta_mean']:+.2f}", f"{c['p_value']:.3f}", c["splits"]]
            for c in across_seeds
        ]
        lines += markdown(["a", "b", "test set", "seeds", "Δ mean BLEU", "p-value", "splits"], rows)
    return "\n".join(lines)


def last_gap(run):
    """The last checkpoint its dropout-gap record scored (the average, if made): "off / on (checkpoint)", or "—"."""
    rows = (run.dropout_gap or {}).get("rows") if run else None
    if not rows:
        return "—"
    epoch = rows[-1]["checkpoint"].removeprefix("checkpoint").removesuffix(".pt")
    name = "averaged" if epoch == "_avg" else f"epoch {epoch}"
    return f"{rows[-1]['dropout_off']:.3f} / {rows[-1]['dropout_on']:.3f} ({name})"


def sweep_table(record):
    """A learning-rate sweep: per variant and rate, the first seed's validation and test sacreBLEU and
    best validation loss, or where it diverged; each variant's best rate marked."""
    runs, best, test_names = record.runs, record.best, record.test_names
    seed = min(r.seed for r in runs)
    gaps = any(r.dropout_gap for r in runs)  # studies/quality.py --dropout-gap
    headings = ["variant", "peak lr", "val BLEU", *(f"{name} BLEU" for name in test_names), "best valid loss"]
    headings += ["updates"] + (["last checkpoint: valid loss, dropout off / on"] if gaps else [])
    rows = []
    for variant in record.settings.variants:
        for lr in sorted({*record.settings.lrs, *(r.lr for r in runs if r.variant == variant)}):  # and --widen's
            r = record.run(variant, lr, seed)
            if r is None:
                cells = ["not finished yet"] + ["—"] * len(test_names) + ["—", "—"]
            elif r.diverged:
                update = r.diverged["update"]
                cells = [f"diverged at update {update}"] + ["—"] * len(test_names) + ["—", str(update)]
            else:
                cells = (
                    [f"{r.val['sacrebleu']:.2f}" if r.val is not None else "—"]
                    + [f"{r.test_sets[name]['sacrebleu']:.2f}" for name in test_names]
                    + [f"{r.best_valid_loss:.3f}" if r.best_valid_loss is not None else "—", str(r.updates)]
                )
            star = " ★" if best.get(variant) == lr else ""
            rows.append([f"{variant}{star}", f"{lr:g}", *cells, *([last_gap(r)] if gaps else [])])
    intro = f"Seed {seed} at each peak learning rate (★: the variant's best on validation BLEU):"
    lines = [record.what, "", intro, "", *markdown(headings, rows)]
    diverged = [
        f"{r.variant} lr={r.lr:g} seed {r.seed} at update {r.diverged['update']} ({r.diverged['reason']})"
        for r in runs
        if r.diverged
    ]
    if diverged:
        lines += ["", f"Diverged (stopped there, not retried): {'; '.join(diverged)}"]
    return "\n".join(lines)
