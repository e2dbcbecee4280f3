"""A study's figures: validation loss against updates, test BLEU per seed, and a sweep's test BLEU
against the learning rate; and what every study's figure shares (depth_report.py's, source_use.py's):
its frame and saving, and each variant's colour."""

import statistics
import textwrap
from pathlib import Path

from common.repo import quiet_logging
from studies.scoring import primary

quiet_logging()  # matplotlib's line for every font lookup

# the learning-rate sweep's variants in the order its figures coloured them, then DeepNorm (issue 69)
COLOUR_ORDER = (
    "post-ln",
    "pre-ln",
    "admin",
    "realformer",
    "post-ln-realformer",
    "deepnorm",
    "pre-ln-realformer",
    "deepnorm, warm-up 1600",  # StudyRecord.merged's name for stage 7 of lr_depth_study.sh (issue 86)
)


def variant_colours(variants):
    """Each variant's colour, the same whatever else a figure draws (tab10 in COLOUR_ORDER, then the
    rest): figures set side by side agree."""
    from matplotlib import colormaps

    palette = colormaps["tab10"].colors
    ordered = list(dict.fromkeys([*COLOUR_ORDER, *variants]))
    return {variant: palette[ordered.index(variant) % len(palette)] for variant in variants}


def frame(figsize, columns=1, **subplots):
    """A figure of *columns* axes side by side, drawn off-screen: (figure, axes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, columns, figsize=figsize, **subplots)


VALID_LOSS = "validation loss (label-smoothed cross-entropy, base 2)"  # the y axis of every validation curve


def name_axes(ax, xlabel, ylabel, title):
    """Name *ax*'s axes and title it, with a light grid: every study figure's look."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)


def save(fig, path):
    """*fig*, laid out, into the PNG *path* (its folder made); its path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def figures(record, folder, stem):
    """Validation loss against updates (seeds as a band) and test sacreBLEU per variant, of the runs compared."""
    what = textwrap.fill(record.what, 85)  # the title's second line: what was measured on which data and machine
    runs = record.scored
    present = list(dict.fromkeys(r.label for r in runs))
    variant_of = {r.label: r.variant for r in runs}  # a sweep's label: its variant at its best rate
    by_variant = variant_colours(list(dict.fromkeys(variant_of.values())))
    colours = {label: by_variant[variant_of[label]] for label in present}
    fig, ax = frame((8, 5))
    tail = []
    for label in present:
        curves = [r.valid_curve for r in runs if r.label == label and r.valid_curve]
        length = min(len(c) for c in curves)
        updates = [statistics.mean(c[i][0] for c in curves) for i in range(length)]
        losses = [[c[i][1] for c in curves] for i in range(length)]
        seeds = f"{len(curves)} seed{'s' if len(curves) > 1 else ''}"
        ax.plot(updates, [statistics.mean(v) for v in losses], color=colours[label], label=f"{label} ({seeds})")
        if len(curves) > 1:
            ax.fill_between(
                updates, [min(v) for v in losses], [max(v) for v in losses], color=colours[label], alpha=0.25
            )
        tail += [loss for v in losses[length // 4 :] for loss in v]
    if tail:  # the first epochs' losses are far above the rest: show where the variants differ
        ax.set_ylim(min(tail) - 0.05, max(tail) + 0.05)
    name_axes(ax, "updates", VALID_LOSS, f"Validation loss during training, mean over seeds (band: min–max)\n{what}")
    ax.legend()
    paths = [save(fig, folder / f"{stem}.valid-loss.png")]

    names = list(runs[0].test_sets)
    fig, axes = frame((max(8, 1.5 * len(present)) * len(names), 4.8), len(names), squeeze=False)
    for ax, name in zip(axes[0], names):
        for i, label in enumerate(present):
            scores = [primary(r.test_sets[name]) for r in runs if r.label == label]
            ax.scatter([i] * len(scores), scores, color=colours[label], zorder=3, label="seeds" if i == 0 else None)
            ax.hlines(statistics.mean(scores), i - 0.3, i + 0.3, color="black", label="mean" if i == 0 else None)
        # a sweep's labels carry their rate ("post-ln-realformer lr=0.004"): on two lines they do not collide
        ax.set_xticks(range(len(present)), [label.replace(" lr=", "\nlr=") for label in present])
        metric = "BLEU (tokenised, lowercased)" if "bleu_tok" in runs[0].test_sets[name] else "sacreBLEU"
        ax.set_ylabel(metric)
        ax.set_title(f"Test {metric} on {name}, each seed and the mean\n{what}", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend()
    return [*paths, save(fig, folder / f"{stem}.bleu.png")]


def sweep_lines(records, test_name):
    """Per sweep of *records* (the first solid, the others dashed) and the first's variants: the
    first seed's test sacreBLEU at every rate it finished, and where it diverged."""
    lines = []
    for index, record in enumerate(records):
        seed = min((r.seed for r in record.runs), default=1)
        for variant in records[0].settings.variants:
            mine = sorted((r for r in record.runs if r.variant == variant and r.seed == seed), key=lambda r: r.lr)
            scored = [r for r in mine if not r.diverged and test_name in r.test_sets]
            lines.append(
                {
                    "variant": variant,
                    "label": f"{variant} ({record.layers}+{record.layers} layers)" if len(records) > 1 else variant,
                    "style": "--" if index else "-",
                    "lr": [r.lr for r in scored],
                    "bleu": [r.test_sets[test_name]["sacrebleu"] for r in scored],
                    "diverged": [(r.lr, r.diverged["update"]) for r in mine if r.diverged],
                }
            )
    return lines


def sweep_figure(record, folder, stem, beside=None):
    """Test sacreBLEU against the peak learning rate, a line per variant (the first seed), diverged
    runs marked on the axis; with *beside* (another sweep's record), its lines dashed."""
    test_name = record.test_names[0] if record.test_names else None
    variants = record.settings.variants
    colours = variant_colours(variants)
    fig, ax = frame((8, 5.2))
    marked = False
    records = [record] + ([beside] if beside else [])
    for line in sweep_lines(records, test_name):
        colour = colours[line["variant"]]
        if line["lr"]:
            ax.plot(line["lr"], line["bleu"], line["style"], marker="o", color=colour, label=line["label"])
        for lr, update in line["diverged"]:
            mark = None if marked else "diverged (stopped)"
            ax.scatter([lr], [0], marker="x", s=80, color=colour, zorder=3, label=mark)
            above = (4, 6 + 10 * variants.index(line["variant"]))
            label = f"{line['label']}: update {update}"
            ax.annotate(label, (lr, 0), textcoords="offset points", xytext=above, fontsize=7, color=colour)
            marked = True
    ax.set_xscale("log")
    ticks = sorted({*record.settings.lrs, *(r.lr for study in records for r in study.runs)})
    ax.set_xticks(ticks, [f"{lr:g}" for lr in ticks])
    ax.minorticks_off()
    ax.set_ylim(-1, ax.get_ylim()[1] + 2)  # room above the best point, and the diverged marks at 0
    title = f"Test BLEU against peak learning rate, seed 1 (x: diverged)\n{textwrap.fill(record.what, 85)}"
    name_axes(ax, "peak learning rate (log scale)", f"test sacreBLEU ({test_name})", title)
    ax.legend(fontsize=8)
    return save(fig, folder / f"{stem}.bleu-vs-lr.png")
