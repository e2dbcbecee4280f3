"""The depth study as Markdown and one figure: studies/quality.py's studies of the same model at
several depths (4+4, 12+12, 18+18 layers), each variant at its best peak learning rate. It trains
nothing; it reads the studies' JSONs and their committed translations.

    python studies/depth_report.py            # the committed studies, the figure into docs/figures/lr-sweep
    python studies/depth_report.py SHALLOW.json DEEP.json [DEEPER.json ...] --figure OUT.png

1. Best against best at each depth: each variant at the rate its study chose on validation BLEU,
   mean ± sample std over seeds, the paired bootstrap seed by seed and the permutation test across
   seeds for each pair of scoring.PAIRS present (quality.py's tables).
2. Depth against depth: each variant's deeper test BLEU against every shallower study's, the
   difference of the means and its permutation p where both have two seeds or more.
3. The figure: test BLEU against layers per stack, a dot per seed and the mean joined by a line;
   with --curves, every run of the deepest depth's validation loss.

Studies of the same depth (their settings' layers) are one depth, their variants side by side. A
study not there yet, or seeds not in yet, are said in a line. The references are the JSON's
paths, or the file of that name in --data.
"""

if __name__ == "__main__" and not __package__:  # run by its path, from any folder: as `python -m` its module
    import by_path  # noqa: F401  (common/by_path.py, linked beside this file)

import argparse
import re
import statistics
import textwrap
from dataclasses import replace
from pathlib import Path

from common.presets import PRESETS
from common.repo import MULTI30K, REPO, repo_relative
from studies import scoring, tables
from studies.figures import VALID_LOSS, frame, name_axes, save, variant_colours
from studies.study import DEFINING, StudyRecord

RESULTS = REPO / "studies" / "results"
FIGURE = REPO / "docs" / "figures" / "lr-sweep" / "cpu-quality-depth-multi30k-en-de.bleu-vs-depth.png"
BEHIND_BLEU = 2.0  # a seed this far below its variant's best seed is named (an unlucky or unstable one)
FAILED_BLEU = 10.0  # below this mean test BLEU a variant did not train at that depth (those that did: 34 and up)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "studies",
        nargs="*",
        metavar="JSON",
        help="studies/quality.py JSONs (default: the depth study's among the committed ones, depth_studies)",
    )
    p.add_argument("--data", default=MULTI30K, help="where the references are, when not at the JSON's paths")
    p.add_argument("--figure", default=FIGURE, help="the PNG to write (default: %(default)s)")
    p.add_argument("--curves", metavar="PNG", help="also draw every run of the deepest depth's validation loss here")
    return p.parse_args(argv)


def depth_studies(results=RESULTS, data=MULTI30K):
    """The committed studies of the depth study (``cpu-quality-*.json`` of preset cpu and its epochs,
    float32, every run scored on validation): the recipe's warm-up first (the first of a depth names
    the rest), sweeps first, then by name."""
    recipe = PRESETS["cpu"]
    records = [StudyRecord.load(path, data) for path in sorted(Path(results).glob("cpu-quality-*.json"))]
    found = [
        r
        for r in records
        if (r.settings.preset, r.settings.epochs, r.settings.bf16) == ("cpu", recipe.epochs, None)
        and all(run.val is not None for run in r.runs)
    ]
    return sorted(found, key=lambda r: (r.settings.warmup != recipe.warmup, not r.sweep))


def one_study_each(parts):
    """Studies of one depth with each variant from one of them: of those that trained it the same
    way (DEFINING), the one with the most rates, else the newer."""

    def key(part, variant):
        return (variant, *(getattr(part.settings, k) for k in DEFINING))

    def rank(part, variant):
        return len({r.lr for r in part.runs if r.variant == variant}), part.date

    owner = {}
    for part in parts:
        for variant in part.settings.variants:
            held = owner.get(key(part, variant))
            if held is None or rank(part, variant) > rank(held, variant):
                owner[key(part, variant)] = part
    kept = []
    for part in parts:
        variants = [v for v in part.settings.variants if owner[key(part, v)] is part]
        if variants:
            runs = [r for r in part.runs if r.variant in variants]
            kept.append(replace(part, settings=replace(part.settings, variants=variants), runs=runs))
    return kept


def scores(study, variant, test_name):
    """The test sacreBLEU of *variant*'s scored seeds at its best rate."""
    return [r.test_sets[test_name]["sacrebleu"] for r in study.scored if r.variant == variant]


def rate_chosen(study):
    """How the study chose each variant's peak lr."""
    settings = study.settings
    if not study.sweep:
        return f"{settings.lr:g}, the only rate trained"
    rates = ", ".join(f"{v} {lr:g}" for v, lr in study.best.items()) or "none chosen yet"
    seeds = ", ".join(map(str, settings.seeds))
    tried = ", ".join(f"{lr:g}" for lr in sorted({*settings.lrs, *(r.lr for r in study.runs)}))
    beyond = " and the rate beyond an edge (--widen)" if settings.widen else ""
    return f"the best of {tried}{beyond} on validation BLEU (seed {seeds}): {rates}"


def per_seed_lines(runs, test_name):
    """Each variant's best validation loss seed by seed, and its seeds more than BEHIND_BLEU below
    its best seed's test BLEU."""
    lines = []
    for variant in dict.fromkeys(r.variant for r in runs):
        mine = sorted((r for r in runs if r.variant == variant), key=lambda r: r.seed)
        losses = " / ".join(f"{r.best_valid_loss:.3f}" for r in mine if r.best_valid_loss is not None)
        bleu = [r.test_sets[test_name]["sacrebleu"] for r in mine]
        behind = [f"seed {r.seed} {b:.2f}" for r, b in zip(mine, bleu) if b < max(bleu) - BEHIND_BLEU]
        lines.append(
            f"- {variant}: best valid loss by seed {losses}; {len(behind)} of {len(mine)} seeds more than "
            f"{BEHIND_BLEU:g} BLEU below its best ({max(bleu):.2f}){': ' + ', '.join(behind) if behind else ''}"
        )
    return lines


def depth_section(study):
    """One depth (StudyRecord.merged): the table of each variant at its best rate, and its seeds."""
    layers, runs = study.layers, study.scored
    chosen = "; ".join(f"`{repo_relative(part.path)}`; peak lr {rate_chosen(part)}" for part in study.parts)
    title = f"### {layers}+{layers} layers, each variant at its best rate\n\n{chosen}."
    references = sorted({s["reference"] for r in runs for s in r.test_sets.values()})
    absent = [ref for ref in references if not Path(ref).exists()]
    found = [] if absent else scoring.comparisons(runs)
    across = scoring.seed_comparisons(runs)
    lines = [tables.table(study, title, found, across), ""]
    if absent:
        lines.append(f"Paired bootstrap not run: no reference {', '.join(absent)} (--data).")
    variants, tested = {r.variant for r in runs}, {(c["a"], c["b"]) for c in across}
    one_seed = [f"{a} − {b}" for a, b in scoring.PAIRS if {a, b} <= variants and (a, b) not in tested]
    if one_seed:
        lines.append(f"Across seeds: not yet for {', '.join(one_seed)} (the permutation test needs 2 seeds of each).")
    if any(len([r for r in runs if r.variant == v]) > 1 for v in study.settings.variants):
        lines += ["Seed by seed:", *per_seed_lines(runs, study.test_names[0]), ""]
    waiting = {v: rates for part in study.parts for v, rates in part.undecided().items()}
    missing = {v: seeds for part in study.parts for v, seeds in part.missing_seeds().items()}
    said = {  # what is not in yet, or went wrong
        "Best rate not chosen yet (seed 1 not in at every rate, or the rate beyond an edge still trains)": [
            f"{v} (in: {', '.join(f'{lr:g}' for lr in rates)})" for v, rates in waiting.items()
        ],
        "Seeds not in yet": [f"{v} {', '.join(map(str, s))}" for v, s in missing.items()],
        "Diverged": [f"{r.label} seed {r.seed} at update {r.diverged['update']}" for r in study.compared if r.diverged],
    }
    lines += [f"{head}: {'; '.join(items)}." for head, items in said.items() if items]
    return "\n".join(lines).rstrip()


def across_depths(studies, test_name):
    """Each variant of each deeper study against every shallower one: test BLEU means, their
    difference, and the permutation test."""

    def with_seeds(study, variant):
        found, rate = scores(study, variant, test_name), next(r.lr for r in study.compared if r.variant == variant)
        return f"{tables.cell(found)} (lr {rate:g}, {len(found)} seed{'s' * (len(found) > 1)})"

    lines = [f"### Depth against depth: test BLEU ({test_name}), each variant at its best rate at each depth"]
    for index, base in enumerate(studies[:-1]):
        name, rows = f"{base.layers}+{base.layers}", []
        for study in studies[index + 1 :]:
            for variant in base.settings.variants:
                deep, shallow = scores(study, variant, test_name), scores(base, variant, test_name)
                if not deep or not shallow:
                    continue
                delta, p_value, splits = scoring.permutation_test(deep, shallow)
                p_cell = f"{p_value:.3f} ({splits} splits)" if min(len(deep), len(shallow)) >= 2 else "1 seed"
                means = [with_seeds(study, variant), with_seeds(base, variant)]
                rows.append([variant, f"{study.layers}+{study.layers}", *means, f"{delta:+.2f}", p_cell])
        minus = f"Deeper minus {name}: the difference of the means over seeds, and its exact permutation p"
        headings = ["variant", "layers", "test BLEU", f"{name} test BLEU", "Δ mean BLEU", "permutation p"]
        lines += ["", f"{minus} where both depths have 2 seeds or more.", "", *tables.markdown(headings, rows)]
    return "\n".join(lines)


def figure_lines(studies, test_name):
    """Per variant: (variant, [(depth, its trained seeds' test sacreBLEU, whether every seed trained)],
    its legend label). A seed below FAILED_BLEU did not train: the label names it (drawn, it would
    squash the other dots), and a depth's mean is drawn only where every seed trained."""
    lines = []
    for variant in dict.fromkeys(v for study in studies for v in study.settings.variants):
        trained, failed, partly = [], [], []
        for study in studies:
            found = scores(study, variant, test_name)
            if not found:
                continue
            depth, kept = f"{study.layers}+{study.layers}", [s for s in found if s >= FAILED_BLEU]
            if not kept:
                failed.append(f"{depth}: {statistics.mean(found):.1f}")
                continue
            trained.append((study.layers, kept, len(kept) == len(found)))
            if len(kept) < len(found):
                lost = " and ".join(f"{s:.1f}" for s in found if s < FAILED_BLEU)
                partly.append(
                    f"at {depth}, {len(found) - len(kept)} of {len(found)} seeds did not train: {lost} BLEU, not"
                    f" drawn; mean of all {len(found)}: {statistics.mean(found):.1f}"
                )
        notes = ([f"not drawn at {'; '.join(failed)} BLEU: it did not train"] if failed else []) + partly
        if trained or failed:
            lines.append((variant, trained, variant + (f" ({'; '.join(notes)})" if notes else "")))
    return lines


def one_rate(studies):
    """ "VARIANT at N+N (LR)" for each variant a study ran at one peak lr only (its dot is not a best
    rate; issue 69), not a sweep's variant whose rate is undecided."""
    found = []
    for merged in studies:
        for study in merged.parts or [merged]:  # a depth's studies, each with its own runs
            for variant in (v for v in study.settings.variants if v not in study.undecided()):
                rates = {r.lr for r in study.runs if r.variant == variant}
                if len(rates) == 1:
                    found.append(f"{variant} at {study.layers}+{study.layers} ({rates.pop():g})")
    return found


def depth_figure(studies, path):
    """Test sacreBLEU against layers per stack: per variant a dot per seed, their mean joined by a line."""
    test_name = studies[0].test_names[0]
    # the shallowest study's description without its depth: "Multi30k en→de test_2016_flickr, d=128, ..."
    what = re.sub(r"^(Multi30k [^,]+), \d+\+\d+ layers,", rf"\1 {test_name},", studies[0].what)
    what = machines(what + ("" if studies[0].settings.bf16 else "; float32"), studies)  # quality.py names bf16 only
    variants = list(dict.fromkeys(v for study in studies for v in study.settings.variants))
    colours = variant_colours(variants)
    single = one_rate(studies)
    fig, ax = frame((8, 6.5))
    for variant, trained, label in figure_lines(studies, test_name):
        i = variants.index(variant)
        shift = (i - (len(variants) - 1) / 2) * 0.3  # side by side at each depth: the seeds stay apart
        for layers, found, _ in trained:
            ax.scatter([layers + shift] * len(found), found, color=colours[variant], s=18, alpha=0.7, zorder=3)
        means = [(layers + shift, statistics.mean(found)) for layers, found, every_seed in trained if every_seed]
        # a variant that trained nowhere plots nothing here, but still gets its legend entry
        line = dict(marker="_", markersize=14, color=colours[variant], label=textwrap.fill(label, 60))
        ax.plot([depth for depth, _ in means], [mean for _, mean in means], "-", **line)
    ticks = [study.layers for study in studies]
    ax.set_xticks(ticks, [f"{n}\n({n}+{n})" for n in ticks])
    title = "Test BLEU against depth, each variant at its best peak lr (dots: seeds; line: their mean)\n"
    title += textwrap.fill(f"one peak lr only: {', '.join(single)}", 85) + "\n" if single else ""
    title += textwrap.fill(what, 85)
    name_axes(ax, "layers in each of the encoder and the decoder", f"test sacreBLEU ({test_name})", title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.24), ncol=2)  # below: off the seeds' dots
    return save(fig, path)


def machines(what, studies):
    """*what*, which ends in its machine, naming each depth's where the studies ran on several."""
    named = list(dict.fromkeys(study.machine for study in studies if study.machine))
    if len(named) < 2:
        return what
    what = what.replace(f"; {named[0]}", "")
    return what + "; " + "; ".join(f"{s.layers}+{s.layers}: {s.machine}" for s in studies if s.machine)


def curves_figure(study, path):
    """Every run's validation loss against updates at one depth, coloured by variant."""
    variants = list(dict.fromkeys(r.variant for r in study.compared))
    colours = variant_colours(variants)  # the depth figure's: the two are read side by side
    fig, ax = frame((8, 5.5))
    for variant in variants:
        for i, run in enumerate(r for r in study.compared if r.variant == variant and r.valid_curve):
            updates, losses = zip(*run.valid_curve)
            label = f"{variant} (lr {run.lr:g})" if i == 0 else None
            ax.plot(updates, losses, "-", color=colours[variant], alpha=0.75, linewidth=1.2, label=label)
    layers = study.layers
    title = f"Validation loss of every {layers}+{layers} run, one line a seed, at each variant's best rate"
    name_axes(ax, "updates", VALID_LOSS, f"{title}\n{textwrap.fill(study.what, 85)}")
    ax.legend(fontsize=8)
    return save(fig, path)


def main(argv=None):
    args = parse_args(argv)
    if args.studies:
        loaded = [(StudyRecord.load(path, args.data) if Path(path).exists() else None, path) for path in args.studies]
    else:
        loaded = [(record, record.path) for record in depth_studies(data=args.data)]
    found = sorted((s for s, _ in loaded if s is not None), key=lambda s: s.layers)
    blocks = ["## Depth: each variant at its best rate"]
    blocks += [f"Not there yet: `{repo_relative(p)}` (not reported)." for s, p in loaded if s is None]
    if not found:
        raise SystemExit("depth_report.py: error: none of the studies is there")
    depths = dict.fromkeys(s.layers for s in found)
    studies = [StudyRecord.merged(one_study_each([s for s in found if s.layers == layers])) for layers in depths]
    blocks += [depth_section(study) for study in studies]
    if len(studies) > 1:
        blocks.append(across_depths(studies, studies[0].test_names[0]))
    blocks.append(f"Figure: `{repo_relative(depth_figure(studies, args.figure))}`.")
    if args.curves:
        blocks.append(f"Validation curves: `{repo_relative(curves_figure(studies[-1], args.curves))}`.")
    print("\n\n".join(blocks))


if __name__ == "__main__":
    main()
