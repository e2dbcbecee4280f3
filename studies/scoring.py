"""How a study compares its variants: sacrebleu's paired bootstrap seed by seed, the exact
permutation test across seeds, and the mean and sample standard deviation over seeds."""

import itertools
import statistics

from common.repo import quiet_logging
from studies.runs import read_lines

# Who is compared with whom, by every study and report: (system, baseline).
PAIRS = (
    ("realformer", "admin"),
    ("realformer", "post-ln"),
    ("admin", "post-ln"),
    ("post-ln-realformer", "post-ln"),
    ("post-ln-realformer", "admin"),  # does residual attention do for Post-LN what ADMIN does?
    ("post-ln-realformer", "fairseq"),  # residual attention on fairseq's own Transformer (Post-LN)
    ("admin", "fairseq"),
    ("realformer", "pre-ln"),  # what a user picks for a deep model instead
    ("realformer", "deepnorm"),  # the method built for depth
    ("admin", "pre-ln"),
    ("pre-ln-realformer", "pre-ln"),  # residual attention on the backbone a user picks
    ("pre-ln-realformer", "realformer"),  # on Pre-LN or on ADMIN
    ("pre-ln-hyper-connections", "pre-ln"),  # the residual-stream methods against their backbone
    ("pre-ln-mhc", "pre-ln"),
    ("pre-ln-mhc", "pre-ln-hyper-connections"),  # what the doubly stochastic mix changes
    ("pre-ln-denseformer", "pre-ln"),
)
BOOTSTRAP_SAMPLES = 1000  # sacrebleu --paired-bs-n's default
quiet_logging()  # sacrebleu's line for every resampling


def primary(score):
    """The score a study compares on: the literature's BLEU for the published recipe, else sacreBLEU."""
    return score["bleu_tok"] if "bleu_tok" in score else score["sacrebleu"]


def paired_bootstrap(system, baseline, references, metric=None):
    """sacrebleu's paired bootstrap (--paired-bs, its fixed seed): system - baseline and its p-value."""
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


def comparisons(runs, pairs=PAIRS):
    """Each pair of *pairs*, on each test set, for each seed both variants finished."""
    from sacrebleu.metrics import BLEU

    by_key = {(r.variant, r.seed): r for r in runs}
    found = []
    for a, b in pairs:
        for seed in sorted({r.seed for r in runs}):
            if (a, seed) not in by_key or (b, seed) not in by_key:
                continue
            for name, score_a in by_key[a, seed].test_sets.items():
                score_b = by_key[b, seed].test_sets[name]
                form = "_tok" if "bleu_tok" in score_a else ""  # the published recipe's: the tokenised text
                texts = (score_a[f"hypotheses{form}"], score_b[f"hypotheses{form}"], score_a[f"reference{form}"])
                metric = BLEU(tokenize="none", force=True) if form else None  # on its own metric
                system, baseline, references = (read_lines(text) for text in texts)
                # --quick (the recipe's --tiny) translates a test set's first lines only
                delta, p_value = paired_bootstrap(system, baseline, references[: len(system)], metric)
                found.append(dict(a=a, b=b, test_set=name, seed=seed, delta=round(delta, 2), p_value=round(p_value, 4)))
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


def seed_comparisons(runs, pairs=PAIRS):
    """Each pair of *pairs* with two seeds or more each, on each test set: the permutation test."""
    found = []
    for a, b in pairs:
        mine = {variant: [r for r in runs if r.variant == variant] for variant in (a, b)}
        if len(mine[a]) < 2 or len(mine[b]) < 2:
            continue
        for name in mine[a][0].test_sets:
            delta, p_value, splits = permutation_test(*([primary(r.test_sets[name]) for r in mine[v]] for v in (a, b)))
            seeds = dict(seeds_a=[r.seed for r in mine[a]], seeds_b=[r.seed for r in mine[b]])
            result = dict(delta_mean=round(delta, 2), p_value=round(p_value, 4), splits=splits)
            found.append(dict(a=a, b=b, test_set=name, **seeds, **result))
    return found


def mean_std(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None


def summary(runs, labels):
    """Per variant (label): the mean and sample standard deviation over its seeds."""

    def spread(values):
        return dict(zip(("mean", "std"), mean_std(values)))

    out = {}
    for label in labels:
        mine = [r for r in runs if r.label == label and not r.diverged]
        if not mine:
            continue
        numbers = ("updates", "wall_s", "tokens_per_s", "best_valid_loss")
        entry = {"seeds": [r.seed for r in mine], **{key: spread([getattr(r, key) for r in mine]) for key in numbers}}
        for name, first in mine[0].test_sets.items():
            metrics = [m for m in ("bleu_tok", "sacrebleu", "chrf", "bleu_lc") if m in first]
            entry[name] = {m: spread([r.test_sets[name][m] for r in mine]) for m in metrics}
        if all(r.val is not None for r in mine):
            metrics = [m for m in ("bleu_tok", "sacrebleu") if m in mine[0].val]
            entry["val"] = {m: spread([r.val[m] for r in mine]) for m in metrics}
        out[label] = entry
    return out
