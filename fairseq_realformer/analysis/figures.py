"""Figures in the layout of the RealFormer paper's Figs. 4-6, and a comparison of models.

- ``violin_grid``: one row per layer (or adjacent layer pair, for JSD), in each row one violin
  per head over the sampled tokens, heads ordered by their median within the row, each coloured
  by its median: below the low threshold blue (sharp / alike), between them yellow, above the
  high threshold red (broad / different). The median drawn is the one over all tokens.
- ``comparison``: median entropy per layer and median JSD per adjacent layer pair (pooled over
  heads and tokens), one line per model, one panel per path.

Built on matplotlib's object API (no pyplot), so nothing depends on or changes a global backend.
"""

from typing import Dict, List, Sequence, Tuple

from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ..options import PATHS
from .capture import PATH_TITLES

COLOURS = ("#3b75af", "#f2c14e", "#c8453c")  # blue, yellow, red: the paper's three bands
MEDIAN_COLOUR = "#222222"


def grid_size(rows: int, heads: int) -> Tuple[float, float]:
    """Size in inches of a violin grid: ~0.6 in per head (at least 6 in wide), 1.1 in per row
    plus room for the title and legend."""
    return max(6.0, 1.6 + 0.6 * heads), 1.5 + 1.1 * rows


def band(median: float, thresholds: Sequence[float]) -> int:
    """0, 1 or 2: below the low threshold, between the two, above the high one."""
    low, high = thresholds
    return 0 if median < low else (2 if median > high else 1)


def band_legend(thresholds: Sequence[float], unit: str) -> List[Patch]:
    low, high = thresholds
    labels = (f"median < {low:g} {unit}", f"{low:g}–{high:g} {unit}", f"> {high:g} {unit}")
    return [Patch(facecolor=c, edgecolor=MEDIAN_COLOUR, label=label) for c, label in zip(COLOURS, labels)]


def violin_grid(
    values,
    medians,
    *,
    row_labels: Sequence[str],
    thresholds: Sequence[float],
    quantity: str,
    unit: str,
    title: str,
    y_max: float,
) -> Figure:
    """*values* ``(rows, sampled tokens, heads)`` and *medians* ``(rows, heads)`` as arrays."""
    rows, _, heads = values.shape
    fig = Figure(figsize=grid_size(rows, heads), layout="constrained")
    axes = fig.subplots(rows, 1, sharey=True, squeeze=False)[:, 0]
    for row, ax in enumerate(axes):
        order = sorted(range(heads), key=lambda h: medians[row, h])
        positions = range(1, heads + 1)
        parts = ax.violinplot([values[row, :, h] for h in order], positions, widths=0.8, showextrema=False)
        for body, h in zip(parts["bodies"], order):
            body.set_facecolor(COLOURS[band(medians[row, h], thresholds)])
            body.set_edgecolor(MEDIAN_COLOUR)
            body.set_linewidth(0.5)
            body.set_alpha(0.9)
        ax.hlines(
            [medians[row, h] for h in order],
            [p - 0.3 for p in positions],
            [p + 0.3 for p in positions],
            colors=MEDIAN_COLOUR,
            linewidth=1.2,
        )
        ax.set_xticks(list(positions), [f"h{h + 1}" for h in order], fontsize=8)
        ax.set_xlim(0.4, heads + 0.6)
        ax.set_ylim(0, y_max)
        ax.set_ylabel(row_labels[row], fontsize=9)
        ax.tick_params(axis="y", labelsize=8)
        ax.grid(axis="y", linewidth=0.3, alpha=0.5)
    axes[-1].set_xlabel("head (hN = N-th head of the model; ordered by median within each row)", fontsize=8)
    fig.supylabel(f"{quantity} ({unit})", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.legend(handles=band_legend(thresholds, unit), loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    return fig


def comparison(
    labels: Sequence[str],
    entropy_medians: Sequence[Dict[str, Sequence[float]]],
    jsd_medians: Sequence[Dict[str, Sequence[float]]],
    *,
    unit: str,
    title: str,
) -> Figure:
    """Per model (same order as *labels*) and path: the median entropy of each layer and the
    median JSD of each adjacent layer pair."""
    fig = Figure(figsize=(11.0, 6.0), layout="constrained")
    axes = fig.subplots(2, len(PATHS), squeeze=False)
    for column, path in enumerate(PATHS):
        top, bottom = axes[0, column], axes[1, column]
        for label, entropy, jsd in zip(labels, entropy_medians, jsd_medians):
            layers = range(1, len(entropy[path]) + 1)
            (line,) = top.plot(layers, entropy[path], marker="o", label=label)
            bottom.plot(range(2, len(jsd[path]) + 2), jsd[path], marker="o", color=line.get_color())
        top.set_title(PATH_TITLES[path], fontsize=10)
        top.set_xlabel("layer", fontsize=9)
        top.xaxis.set_major_locator(MaxNLocator(integer=True))
        pairs = range(2, max(len(e[path]) for e in entropy_medians) + 1)
        bottom.set_xticks(list(pairs), [f"{n - 1}-{n}" for n in pairs])
        bottom.set_xlabel("adjacent layers", fontsize=9)
        bottom.set_ylim(0, 1)
        for ax in (top, bottom):
            ax.grid(linewidth=0.3, alpha=0.5)
            ax.tick_params(labelsize=8)
    axes[0, 0].set_ylabel(f"median entropy ({unit})", fontsize=9)
    axes[1, 0].set_ylabel("median JSD (bits)", fontsize=9)
    top_max = max(max(max(e[p], default=0.0) for p in PATHS) for e in entropy_medians)
    for ax in axes[0]:
        ax.set_ylim(0, top_max * 1.1 + 1e-3)
    fig.suptitle(title, fontsize=11)
    fig.legend(
        *axes[0, 0].get_legend_handles_labels(),
        loc="outside lower center",
        ncol=min(len(labels), 4),
        fontsize=9,
        frameon=False,
    )
    return fig


def save(fig: Figure, stem: str, dpi: int) -> List[str]:
    """Write *stem*.png and *stem*.pdf; return their paths."""
    paths = [f"{stem}.png", f"{stem}.pdf"]
    for path in paths:
        fig.savefig(path, dpi=dpi)
    return paths
