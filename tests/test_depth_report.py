"""studies/depth_report.py: the depth study's Markdown and figure from quality.py's JSONs, on the
committed studies and on made-up ones whose means, spreads and permutation p-values are worked out
by hand."""

import json
import statistics
from pathlib import Path

from studies import depth_report
from studies.figures import variant_colours
from studies.study import Settings, StudyRecord

from .helpers import REPO

RESULTS = Path(REPO) / "studies" / "results"
TEST_SET = "test_2016_flickr"


def _report(capsys, *argv):
    depth_report.main([str(a) for a in argv])
    return capsys.readouterr().out


def _study(folder, layers, bleu, **settings):
    """A quality.py JSON of one peak lr (as the 18+18 study): per variant, its seeds' test
    sacreBLEU; every run translates the same two lines, against a reference in *folder*."""
    folder.mkdir(parents=True, exist_ok=True)
    reference = folder / f"{TEST_SET}.de"
    reference.write_text("a dog runs on the grass\nthe man is riding a red bike\n")
    runs = []
    for variant, by_seed in bleu.items():
        for seed, score in by_seed.items():
            hypotheses = folder / f"{layers}.{variant}.seed{seed}.de"
            hypotheses.write_text("a dog runs on grass\nthe man rides a bike\n")
            scored = {"sacrebleu": score, "chrf": score + 20, "bleu_lc": score + 0.5, "reference": str(reference)}
            scored.update(signature="bleu", chrf_signature="chrf", bleu_lc_signature="lc", translations=str(hypotheses))
            run = {"variant": variant, "lr": 2e-3, "label": variant, "seed": seed, "best_valid_loss": 4 + seed / 10}
            run.update(updates=2640, wall_s=60.0, tokens_per_s=1000.0, test_sets={TEST_SET: scored})
            runs.append({**run, "val": {**scored, "sacrebleu": score + 1}})
    study = {"what": f"Multi30k en→de, {layers}+{layers} layers, d=128, FFN 256, 20 epochs; m", "runs": runs}
    study["settings"] = {"layers": layers, "lr": 2e-3, "seeds": [1, 2, 3], "variants": list(bleu), **settings}
    path = folder / f"depth-{layers}.json"
    path.write_text(json.dumps(study))
    return path


def _mean_cell(values):
    """How the report writes a mean over seeds: the value for one seed, else mean ± sample std."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def test_the_committed_studies_print_the_12_12_numbers_of_their_json(tmp_path, capsys):
    """Each variant at its best 12+12 rate: its row has the seeds the JSON holds and their mean
    test BLEU and chrF (seeds land over several sessions: the expectation follows the JSON)."""
    deep = json.loads((RESULTS / "cpu-quality-depth-12-multi30k-en-de.json").read_text())
    figure = tmp_path / "depth.png"
    out = _report(
        capsys,
        RESULTS / "cpu-quality-lr-sweep-multi30k-en-de.json",
        RESULTS / "cpu-quality-depth-12-multi30k-en-de.json",
        tmp_path / "not-yet.json",
        "--figure",
        figure,
    )
    twelve = out[out.index("### 12+12 layers") : out.index("### Depth against depth")]
    for variant, lr in deep["best"].items():
        runs = sorted((r for r in deep["runs"] if r["label"] == f"{variant} lr={lr:g}"), key=lambda r: r["seed"])
        seeds = ",".join(str(r["seed"]) for r in runs)
        bleu = _mean_cell([r["test_sets"][TEST_SET]["sacrebleu"] for r in runs])
        chrf = _mean_cell([r["test_sets"][TEST_SET]["chrf"] for r in runs])
        assert f"| {runs[0]['label']} | {seeds} | {bleu} | {chrf} | " in twelve
        if len(runs) > 1 and variant in ("pre-ln", "admin", "realformer"):
            n = f"{len(runs)} seeds"
            assert f"| {variant} | 12+12 | {bleu} (lr {lr:g}, {n}) | " in out
    assert figure.stat().st_size > 10_000


def test_means_spreads_and_permutation_p_of_three_seeds_are_the_hand_computed_ones(tmp_path, capsys):
    shallow = {variant: {1: 36.0, 2: 37.0, 3: 38.0} for variant in ("pre-ln", "admin", "realformer")}
    deep = {
        "pre-ln": {1: 36.5, 2: 38.5, 3: 39.5},  # mean 38.1667, sample std sqrt(7/3) = 1.5275
        "admin": {1: 35.0, 2: 36.0, 3: 37.0},
        "realformer": {1: 38.0, 2: 39.0, 3: 40.0},
    }
    out = _report(capsys, _study(tmp_path, 4, shallow), _study(tmp_path, 12, deep), "--figure", tmp_path / "depth.png")
    twelve = out[out.index("### 12+12 layers") : out.index("### Depth against depth")]
    assert "| pre-ln | 1,2,3 | 38.17 ± 1.53 | 58.17 ± 1.53 | 38.67 ± 1.53 | 4.200 ± 0.100 |" in twelve
    assert "| realformer | 1,2,3 | 39.00 ± 1.00 | " in twelve and twelve.count("| 40.00 ± 1.00 |") == 1  # val BLEU
    # of the 20 splits of six scores into 3 + 3, only the observed one and its mirror are 3 apart
    assert f"| realformer | admin | {TEST_SET} | 1,2,3 / 1,2,3 | +3.00 | 0.100 | 20 |" in twelve
    # 0.83 apart or more: 12 of the 20 splits (sums of three scores of 117 and above, or 114.5 and below)
    assert f"| realformer | pre-ln | {TEST_SET} | 1,2,3 / 1,2,3 | +0.83 | 0.600 | 20 |" in twelve
    assert f"| admin | pre-ln | {TEST_SET} | 1,2,3 / 1,2,3 | -2.17 | " in twelve
    bootstrap = [line for line in twelve.splitlines() if f"| {TEST_SET} | " in line and " / " not in line]
    assert len(bootstrap) == 9 and all("| +0.00 |" in line for line in bootstrap)  # 3 pairs, 3 seeds, same lines
    # admin 35, 36, 37 against 36, 37, 38: a sum of three of 108 or less, or 111 or more, in 10 of 20 splits
    assert "| admin | 12+12 | 36.00 ± 1.00 (lr 0.002, 3 seeds) | 37.00 ± 1.00 (lr 0.002, 3 seeds) | -1.00 " in out
    assert "| -1.00 | 0.500 (20 splits) |" in out
    assert "not yet" not in out.lower() and "1 seed" not in out


def test_the_deepest_study_is_compared_with_every_shallower_one(tmp_path, capsys):
    """18+18 against 4+4 and against 12+12, each with its own hand-computed p."""
    four = {"admin": {1: 36.0, 2: 37.0, 3: 38.0}}
    twelve = {"admin": {1: 35.0, 2: 36.0, 3: 37.0}}
    eighteen = {"admin": {1: 30.0, 2: 31.0, 3: 35.5}}
    studies = [_study(tmp_path, layers, bleu) for layers, bleu in ((4, four), (12, twelve), (18, eighteen))]
    out = _report(capsys, *studies, "--figure", tmp_path / "depth.png")
    across = out[out.index("### Depth against depth") :]
    assert across.count("| variant | layers | test BLEU | 4+4 test BLEU |") == 1
    assert across.count("| variant | layers | test BLEU | 12+12 test BLEU |") == 1
    deepest = "| admin | 18+18 | 32.17 ± 2.93 (lr 0.002, 3 seeds) | "
    # against 4+4 (37 ± 1): -4.83; of the 20 splits only the observed one and its mirror are as far apart
    assert f"{deepest}37.00 ± 1.00 (lr 0.002, 3 seeds) | -4.83 | 0.100 (20 splits) |" in across
    # against 12+12 (35, 36, 37): a sum of three of 96.5 or less is the observed split {30, 31, 35.5} and
    # {30, 31, 35}; with their mirrors, 4 of 20
    assert f"{deepest}36.00 ± 1.00 (lr 0.002, 3 seeds) | -3.83 | 0.200 (20 splits) |" in across


def test_a_missing_study_and_missing_seeds_are_said_in_a_line(tmp_path, capsys):
    shallow = {variant: {1: 36.0, 2: 37.0, 3: 38.0} for variant in ("pre-ln", "admin", "realformer")}
    deep = {"pre-ln": {1: 36.5, 2: 38.5}, "admin": {1: 35.0, 2: 36.0, 3: 37.0}, "realformer": {1: 38.0}}
    missing = tmp_path / "cpu-quality-depth-18-multi30k-en-de.json"
    out = _report(
        capsys,
        _study(tmp_path, 4, shallow),
        _study(tmp_path, 12, deep, seeds=[1], best_seeds=[2, 3], best_variants=["pre-ln", "admin", "realformer"]),
        missing,
        "--figure",
        tmp_path / "depth.png",
    )
    assert [line for line in out.splitlines() if missing.name in line] == [
        f"Not there yet: `{missing}` (not reported)."
    ]
    assert "Seeds not in yet: pre-ln 3; realformer 2, 3." in out
    assert "Across seeds: not yet for realformer − admin, realformer − pre-ln (the permutation test needs" in out
    assert (
        "| realformer | 12+12 | 38.00 (lr 0.002, 1 seed) | 37.00 ± 1.00 (lr 0.002, 3 seeds) | +1.00 | 1 seed |" in out
    )
    assert "| pre-ln | 12+12 | 37.50 ± 1.41 (lr 0.002, 2 seeds) | " in out  # 2 seeds against 3: tested
    assert "18+18" not in out


def test_the_depth_study_is_found_among_the_committed_records():
    """No list to extend (issue 98): the studies trained on the recipe's schedule in float32 and
    scored on validation are found; the bf16 one, the published recipe, the 10-epoch post-ln sweep
    and the first 4+4 study (no validation BLEU) are not."""
    found = {p.path.name for p in depth_report.depth_studies(RESULTS)}
    named = "cpu-quality-{}-multi30k-en-de.json".format
    assert {named(n) for n in ("lr-sweep", "deepnorm-4", "depth-12", "depth-18", "depth-18-pre-ln-realformer")} <= found
    assert not {"cpu-quality-multi30k-en-de.json", "cpu-quality-multi30k-en-de-bf16.json"} & found
    assert not {"cpu-quality-multi30k-en-de-published.json", named("lr-sweep-post-ln")} & found


def test_a_new_study_joins_its_depth_and_a_variant_comes_from_the_study_with_most_rates(tmp_path):
    """A study written into the results folder is found by what it trained, with no edit of the
    report; one that trained a variant at one rate beside a sweep of it (stage 8's Pre-LN beside the
    4+4 sweep's) adds its other variants only, and one that adds none is not a part."""
    results = tmp_path / "results"
    results.mkdir()

    def put(name, layers, bleu, rates=(2e-3,), validated=True, **settings):
        path = _study(
            tmp_path / name, layers, bleu, **{"preset": "cpu", "epochs": 20, "warmup": 400, "seeds": [1], **settings}
        )
        study = json.loads(path.read_text())
        study["runs"] = [{**run, "lr": lr} for lr in rates for run in study["runs"]]
        if len(rates) > 1:
            study["settings"]["lrs"] = list(rates)
        if not validated:
            study["runs"] = [{k: v for k, v in run.items() if k != "val"} for run in study["runs"]]
        (results / f"cpu-quality-{name}-multi30k-en-de.json").write_text(json.dumps(study))

    put("sweep", 4, {"pre-ln": {1: 36.0}, "admin": {1: 37.0}}, rates=(2e-3, 4e-3))
    put("streams", 4, {"pre-ln": {1: 35.0}, "pre-ln-hyper-connections": {1: 36.5}}, rates=(4e-3,))
    put("admin-again", 4, {"admin": {1: 30.0}})
    put("deep", 18, {"pre-ln": {1: 35.0}})
    put("deep-longer-warm-up", 18, {"pre-ln": {1: 34.0}}, warmup=1600)
    put("bf16", 4, {"pre-ln": {1: 36.0}}, bf16=True)
    put("shorter", 4, {"pre-ln": {1: 36.0}}, epochs=10)
    put("unvalidated", 4, {"realformer-sum": {1: 36.0}}, validated=False)
    found = depth_report.depth_studies(results, tmp_path)
    names = [p.path.name.removeprefix("cpu-quality-").removesuffix("-multi30k-en-de.json") for p in found]
    assert names == ["sweep", "admin-again", "deep", "streams", "deep-longer-warm-up"]  # another warm-up last

    four = depth_report.one_study_each([p for p in found if p.layers == 4])
    assert [(p.path.name.split("-")[2], p.settings.variants) for p in four] == [
        ("sweep", ["pre-ln", "admin"]),
        ("streams", ["pre-ln-hyper-connections"]),
    ]
    merged = StudyRecord.merged(four)
    assert sorted((r.variant, r.test_sets[TEST_SET]["sacrebleu"]) for r in merged.compared) == [
        ("admin", 37.0),
        ("pre-ln", 36.0),
        ("pre-ln-hyper-connections", 36.5),
    ]
    eighteen = StudyRecord.merged(depth_report.one_study_each([p for p in found if p.layers == 18]))
    assert eighteen.settings.variants == ["pre-ln", "pre-ln, warm-up 1600"]


def test_the_figure_names_every_machine_the_studies_ran_on():
    what = "Multi30k en→de test_2016_flickr, d=128; AMD EPYC VM, 2 cores; float32"

    def study(layers, machine):
        return StudyRecord(Settings(layers=layers), [], machine=machine)

    one = [study(4, "AMD EPYC VM, 2 cores"), study(12, "AMD EPYC VM, 2 cores")]
    assert depth_report.machines(what, one) == what
    two = [one[0], study(12, "Intel Xeon VM, 2 cores for seeds 2 and 3")]
    assert depth_report.machines(what, two) == (
        "Multi30k en→de test_2016_flickr, d=128; float32; "
        "4+4: AMD EPYC VM, 2 cores; 12+12: Intel Xeon VM, 2 cores for seeds 2 and 3"
    )


def test_studies_of_one_depth_are_one_section_and_residual_attention_meets_each_backbone(tmp_path, capsys):
    """The 18+18 study of ADMIN and RealFormer and the one of Pre-LN and DeepNorm beside it (issue
    69): one table of the four, RealFormer against each of the three across seeds, and each
    variant's seeds more than 2 BLEU below its best named."""
    shallow = {variant: {1: 36.0, 2: 37.0, 3: 38.0} for variant in ("pre-ln", "admin", "realformer")}
    ours = {"admin": {1: 35.0, 2: 32.5, 3: 35.5, 4: 34.0, 5: 35.0}}
    ours["realformer"] = {1: 38.0, 2: 39.0, 3: 40.0, 4: 38.5, 5: 39.5}
    theirs = {"pre-ln": {1: 37.0, 2: 38.0, 3: 39.0}, "deepnorm": {1: 36.0, 2: 36.5, 3: 37.0}}
    studies = [_study(tmp_path / "4", 4, shallow), _study(tmp_path / "a", 18, ours), _study(tmp_path / "b", 18, theirs)]
    out = _report(capsys, *studies, "--figure", tmp_path / "depth.png")
    assert out.count("### 18+18 layers") == 1
    eighteen = out[out.index("### 18+18 layers") : out.index("### Depth against depth")]
    assert all(f"| {variant} | " in eighteen for variant in ("admin", "realformer", "pre-ln", "deepnorm"))
    # realformer's five seeds all above deepnorm's three: of the 56 splits into 5 + 3 only the observed
    # one is +2.50 or more apart (a sum of five of 195), and none -2.50 (that needs 185.6 or less; the
    # least is 186)
    assert f"| realformer | deepnorm | {TEST_SET} | 1,2,3,4,5 / 1,2,3 | +2.50 | 0.018 | 56 |" in eighteen
    assert f"| realformer | pre-ln | {TEST_SET} | 1,2,3,4,5 / 1,2,3 | +1.00 | " in eighteen
    assert f"| realformer | admin | {TEST_SET} | 1,2,3,4,5 / 1,2,3,4,5 | +4.60 | " in eighteen
    assert (
        "- admin: best valid loss by seed 4.100 / 4.200 / 4.300 / 4.400 / 4.500; 1 of 5 seeds more than 2 BLEU "
        "below its best (35.50): seed 2 32.50" in eighteen
    )
    assert "- realformer: best valid loss by seed 4.100 / 4.200 / 4.300 / 4.400 / 4.500; 0 of 5 seeds" in eighteen
    # depth against depth: each 18+18 variant against its 4+4 study, deepnorm (not at 4+4) left out
    assert "| realformer | 18+18 | 39.00 ± 0.79 (lr 0.002, 5 seeds) | " in out and "| deepnorm | 18+18 |" not in out


def test_a_study_of_the_same_depth_with_another_warm_up_is_its_own_variant_not_more_seeds(tmp_path, capsys):
    """Stage 7 of lr_depth_study.sh (issue 86) trains DeepNorm at 18+18 again with 1,600 warm-up
    updates: beside the 400-update study its seeds must not be pooled with those of the same name."""
    ours = {"pre-ln": {1: 37.0, 2: 38.0, 3: 39.0}, "deepnorm": {1: 2.0, 2: 3.0, 3: 36.0}}
    longer = {"deepnorm": {1: 35.0, 2: 36.0, 3: 37.0}}
    studies = [_study(tmp_path / "a", 18, ours, warmup=400), _study(tmp_path / "b", 18, longer, warmup=1600)]
    out = _report(capsys, *studies, "--figure", tmp_path / "depth.png")
    assert f"| deepnorm | 1,2,3 | {_mean_cell([2.0, 3.0, 36.0])} |" in out
    assert f"| deepnorm, warm-up 1600 | 1,2,3 | {_mean_cell([35.0, 36.0, 37.0])} |" in out
    merged = StudyRecord.merged([StudyRecord.load(path, tmp_path) for path in studies])
    lines = {variant: found for variant, [(_, found, _)], _ in depth_report.figure_lines([merged], TEST_SET)}
    assert lines == {"pre-ln": [37.0, 38.0, 39.0], "deepnorm": [36.0], "deepnorm, warm-up 1600": [35.0, 36.0, 37.0]}


def test_the_figure_names_a_variant_that_trained_at_no_depth(tmp_path):
    """A variant run only where it failed (DeepNorm before its 4+4 run, issue 69): the depth figure
    draws no point of it but names it in the legend, as it names the depths where another failed."""
    shallow = {"post-ln": {1: 36.0, 2: 37.0}, "admin": {1: 37.0, 2: 38.0}}
    deep = {"post-ln": {1: 1.5, 2: 2.5}, "admin": {1: 35.0, 2: 34.0}, "deepnorm": {1: 2.0, 2: 2.6}}
    studies = [StudyRecord.load(_study(tmp_path / str(n), n, bleu), tmp_path) for n, bleu in ((4, shallow), (18, deep))]
    assert depth_report.figure_lines(studies, TEST_SET) == [
        ("post-ln", [(4, [36.0, 37.0], True)], "post-ln (not drawn at 18+18: 2.0 BLEU: it did not train)"),
        ("admin", [(4, [37.0, 38.0], True), (18, [35.0, 34.0], True)], "admin"),
        ("deepnorm", [], "deepnorm (not drawn at 18+18: 2.3 BLEU: it did not train)"),
    ]
    assert depth_report.depth_figure(studies, tmp_path / "depth.png").stat().st_size > 10_000


def test_a_seed_that_did_not_train_is_named_not_drawn_nor_averaged_into_the_drawn_mean(tmp_path):
    """DeepNorm at 18+18 (issue 69): two seeds fail to learn, one trains. The trained seed is drawn;
    the failed two are named in the legend with the mean over all three, and no mean is drawn at
    that depth (a mean of 2 and 34 stands for no run), while its 4+4 mean still is."""
    shallow = {"admin": {1: 37.0, 2: 38.0}, "deepnorm": {1: 35.0, 2: 36.0}}
    deep = {"admin": {1: 35.0, 2: 34.0, 3: 36.0}, "deepnorm": {1: 2.35, 2: 1.56, 3: 34.0}}
    studies = [StudyRecord.load(_study(tmp_path / str(n), n, bleu), tmp_path) for n, bleu in ((4, shallow), (18, deep))]
    assert depth_report.figure_lines(studies, TEST_SET)[1] == (
        "deepnorm",
        [(4, [35.0, 36.0], True), (18, [34.0], False)],
        "deepnorm (at 18+18, 2 of 3 seeds did not train: 2.4 and 1.6 BLEU, not drawn; mean of all 3: 12.6)",
    )
    assert depth_report.depth_figure(studies, tmp_path / "depth.png").stat().st_size > 10_000


def test_the_figure_says_which_dots_are_at_the_one_rate_a_variant_ran(tmp_path):
    """The figure's title promises each variant's best peak lr; a variant a study ran at one rate
    only (DeepNorm's 4+4 probe, issue 69) is named with that rate, also inside a depth made of two
    studies. Variants swept over two rates are not, nor one with the first of its rates in (issue 86:
    pre-ln-realformer's 2e-3 run came first; its dot is not drawn until its rate is chosen)."""
    sweep_path = _study(tmp_path / "a", 4, {"admin": {1: 37.0}, "pre-ln": {1: 36.0}})
    sweep = json.loads(sweep_path.read_text())
    sweep["runs"] += [{**run, "lr": 4e-3} for run in sweep["runs"]]
    sweep_path.write_text(json.dumps(sweep))
    probe_path = _study(tmp_path / "b", 4, {"deepnorm": {1: 35.7}})
    started_path = _study(tmp_path / "c", 4, {"pre-ln-realformer": {1: 36.3}}, lrs=[2e-3, 1e-3, 4e-3], widen=True)
    group = [StudyRecord.load(path, tmp_path) for path in (sweep_path, probe_path, started_path)]
    assert depth_report.one_rate([StudyRecord.merged(group)]) == ["deepnorm at 4+4 (0.002)"]
    assert depth_report.figure_lines([StudyRecord.merged(group)], TEST_SET)[-1][0] == "deepnorm"


def test_a_variant_has_one_colour_in_every_depth_figure_whatever_else_it_draws():
    """The depth figure draws the sweep's five variants and DeepNorm, the 18+18 curves four of them
    in another order: read side by side, each variant must be the same colour in both."""
    depth = variant_colours(
        ["post-ln", "pre-ln", "admin", "realformer", "post-ln-realformer", "deepnorm", "pre-ln-realformer"]
    )
    curves = variant_colours(["admin", "realformer", "pre-ln-realformer", "pre-ln", "deepnorm"])
    assert all(curves[variant] == depth[variant] for variant in curves)
    assert len(set(depth.values())) == len(depth), "two variants share a colour"
    other = variant_colours(["rezero", "admin"])  # a variant outside the sweep takes a colour none of it uses
    assert other["admin"] == depth["admin"] and other["rezero"] not in depth.values()


def test_the_deepest_depths_validation_curves_are_drawn_for_every_run(tmp_path, capsys):
    curves = tmp_path / "curves.png"
    depth_18 = RESULTS / "cpu-quality-depth-18-multi30k-en-de.json"
    out = _report(capsys, depth_18, "--figure", tmp_path / "depth.png", "--curves", curves)
    assert f"Validation curves: `{curves}`." in out and curves.stat().st_size > 10_000


def test_a_variant_whose_rate_is_not_chosen_yet_is_said_so_not_listed_as_missing_every_seed(tmp_path, capsys):
    """--widen (issue 69): a variant best at an edge of the sweep waits for the rate beyond it, and
    its study's JSON names no best rate for it meanwhile. The report says which rates are in, and
    lists neither its runs as compared nor its seeds as missing."""
    shallow = {variant: {1: 36.0, 2: 37.0, 3: 38.0} for variant in ("pre-ln", "admin", "realformer")}
    path = _study(tmp_path / "b", 18, {"pre-ln": {1: 37.0}, "deepnorm": {1: 36.0, 2: 36.5, 3: 37.0}})
    study = json.loads(path.read_text())
    widened = {**study["runs"][0], "lr": 4e-3, "label": "pre-ln lr=0.004"}  # pre-ln at both rates, undecided
    study["runs"].append({**widened, "test_sets": {TEST_SET: {**widened["test_sets"][TEST_SET], "sacrebleu": 99.0}}})
    # deepnorm chose 2e-3 over 4e-3 and, 2e-3 being an edge, over 1e-3 beyond it, on validation
    deepnorm = study["runs"][1]
    study["runs"] += [{**deepnorm, "lr": lr, "val": {**deepnorm["val"], "sacrebleu": 30.0}} for lr in (4e-3, 1e-3)]
    study["settings"].update(lrs=[2e-3, 4e-3], widen=True, best_seeds=[2, 3])
    study["settings"]["seeds"] = [1]
    study["best"] = {"deepnorm": 2e-3}
    path.write_text(json.dumps(study))
    out = _report(capsys, _study(tmp_path / "4", 4, shallow), path, "--figure", tmp_path / "depth.png")
    eighteen = out[out.index("### 18+18 layers") : out.index("### Depth against depth")]
    assert (
        "peak lr the best of 0.001, 0.002, 0.004 and the rate beyond an edge (--widen) on validation BLEU (seed 1): "
        in (eighteen)
    )
    assert "deepnorm 0.002." in eighteen
    assert "Best rate not chosen yet (seed 1 not in at every rate, or the rate beyond an edge still trains): " in (
        eighteen
    )
    assert "pre-ln (in: 0.002, 0.004)." in eighteen
    assert "| pre-ln" not in eighteen and "99.00" not in out  # neither rate stands for pre-ln
    assert "Seeds not in yet" not in eighteen  # deepnorm's three are in; pre-ln's wait for its rate
