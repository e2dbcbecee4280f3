"""A quality study: what it trains (variants × peak learning rates × seeds, on one preset), where
its runs' folders are, and its JSON with the translations committed beside it. Everything a
study's JSON holds is written, and read back (a StudyRecord, which answers what a report asks of a
study: quality.py's, --beside's, the runner's and depth_report.py's), here.

The JSON: "what", the header (common.results: "command", "machine", "date", "commit", "torch"),
"settings" (what the runs were trained with; a study goes on from the runs a JSON of the same
settings holds), "runs" (each run's record, runs.RunFolder.record, with its variant, rate, label,
seed and the committed translations' paths), "best" (a sweep: each variant's chosen rate),
"comparisons" (paired bootstrap, seed by seed), "seed_comparisons" (the permutation test across
seeds) and "summary" (mean ± std).
"""

import copy
import gzip
import os
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from common.presets import PRESETS
from common.repo import REPO, repo_relative
from common.results import read_result, write_result
from studies import scoring
from studies.runs import RunFolder, read_lines

QUALITY = Path(__file__).with_name("quality.py")  # the command that writes a study's JSON


@dataclass(frozen=True)
class RunConfig:
    label: str  # the table's and the figures' name: the variant, or "variant lr=X" in a sweep
    variant: str
    lr: float  # None: the recipe's
    suffix: str  # of its folders: OUT/VARIANT+SUFFIX/seedS


@dataclass
class Study:
    """A study's settings, from the command line (quality.py) to the JSON (settings())."""

    preset_name: str  # a key of common.presets.PRESETS ("quick" for --quick)
    variants: list
    seeds: list
    lrs: list  # the peak learning rates: one, or a sweep; [None]: the recipe's
    out: Path
    data: str
    overrides: dict = field(default_factory=dict)  # the preset's epochs, layers, warmup given on the command line
    lr_given: bool = False  # --lr given: the rate is in the folders' names
    best_seeds: list = field(default_factory=list)
    best_variants: list = None
    widen: bool = False
    bf16: bool = False
    source_lang: str = "en"
    target_lang: str = "de"
    test_sets: str = None
    jobs: int = 1
    json: str = None
    machine: str = ""
    dropout_gap: bool = False

    def __post_init__(self):
        # absolute: a run's recorded command (RunFolder.keep_command) must not depend on where it was typed
        self.out = Path(os.path.abspath(self.out))
        self.data = os.path.abspath(self.data) if self.data else self.data
        self.preset = PRESETS[self.preset_name]
        self.quick = self.preset_name == "quick"
        self.epochs = self.overrides.get("epochs") or self.preset.epochs
        self.layers = self.overrides.get("layers") or self.preset.layers
        self.warmup = self.overrides.get("warmup", self.preset.warmup)
        self.sweep = len(self.lrs) > 1
        self.lr = None if self.sweep else self.lrs[0]
        self.pair = f"{self.source_lang}-{self.target_lang}"
        # runs with settings given on the command line get their own folders: OUT/post-ln-lr0.002/seed1
        suffix = "".join(
            f"-{name}{self.overrides[name]:g}" for name in ("warmup", "epochs", "layers") if name in self.overrides
        )
        self.run_suffix = suffix + ("-bf16" if self.bf16 else "")
        self.configs = [
            RunConfig(
                f"{variant} lr={lr:g}" if self.sweep else variant,
                variant,
                lr,
                (f"-lr{lr:g}" if self.lr_given else "") + self.run_suffix,
            )
            for variant in self.variants
            for lr in self.lrs
        ]
        # --widen: the rate beyond each edge, trained for a variant whose best is at that edge
        self.beyond = [
            RunConfig(f"{variant} lr={lr:g}", variant, lr, f"-lr{lr:g}{self.run_suffix}")
            for variant in (self.variants if self.widen else ())
            for lr in (min(self.lrs) / 2, max(self.lrs) * 2)
        ]

    @property
    def all_configs(self):
        return self.configs + self.beyond

    @property
    def labels(self):
        return [config.label for config in self.all_configs]

    def run_folder(self, config, seed):
        return self.out / f"{config.variant}{config.suffix}" / f"seed{seed}"

    def settings(self):
        """What the JSON records of how its runs were trained (a float32 study's have no "bf16": the
        studies committed before it existed)."""
        return {
            "preset": self.preset_name,
            "epochs": self.epochs,
            "layers": self.layers,
            "lr": self.lr,
            "warmup": self.warmup,
            "seeds": self.seeds,
            "variants": self.variants,
            "jobs": self.jobs,
            **({"lrs": self.lrs} if self.sweep else {}),
            **({"best_seeds": self.best_seeds} if self.best_seeds else {}),
            **({"best_variants": self.best_variants} if self.best_variants else {}),
            **({"widen": True} if self.widen else {}),
            **({"bf16": True} if self.bf16 else {}),
        }

    def describe(self):
        size = self.preset.describe
        if self.layers and self.layers != self.preset.layers:
            depth = f"{self.layers}+{self.layers} layers"  # the preset's "N+N layers" says what was trained
            size, found = re.subn(r"^\d+\+\d+ layers", depth, size)
            size = size if found else f"{size}, {depth}"
        lr = f", peak lr {self.lr:g}" if self.lr else ""
        lr += f", warm-up {self.warmup}" if self.warmup is not None else ""
        lr += "; bf16 mixed precision" if self.bf16 else ""
        epochs = f", {self.epochs} epochs" if self.epochs else ""
        return (
            f"Multi30k {self.source_lang}→{self.target_lang}, {size}{epochs}{lr}; "
            f"average of the last epoch checkpoints, beam 5; {self.machine}"
        )

    def previous(self):
        """The StudyRecord of the --json file this study goes on from: None when there is none, or
        when its runs were trained with other settings (the rate aside)."""
        path = Path(self.json) if self.json else None
        if path is None or not path.exists():
            return None
        record = StudyRecord.load(path, self.data)
        return record if all(record.settings.get(k) == self.settings().get(k) for k in DEFINING) else None

    def config(self, variant, lr):
        """The config that trains *variant* at *lr* (a sweep's rate, or one beyond its edges)."""
        return next(c for c in self.all_configs if (c.variant, c.lr) == (variant, lr))

    def record(self, previous=None, scored=True):
        """The study's record: every finished run, from its folder, else from *previous* (the
        StudyRecord it goes on from: a fresh checkout has no run folders), under this study's label
        for its variant and rate (a sweep takes a single-rate study's runs as its own at that rate).
        *scored* False: of a run folder only what the plan decides by (RunFolder.outcome: no
        translation scored again), for a status that answers at once."""
        runs = []
        for seed in self.seeds + self.best_seeds:
            for config in self.all_configs:
                folder = RunFolder(self.run_folder(config, seed))
                found = folder.record(self.target_lang) if scored else folder.outcome()
                if found is not None:
                    runs.append(
                        {"variant": config.variant, "lr": config.lr, "label": config.label, "seed": seed, **found}
                    )
                elif previous is not None and (found := previous.run(config.variant, config.lr, seed)) is not None:
                    runs.append({**found, "label": config.label})
        labels = self.labels
        runs.sort(key=lambda r: (labels.index(r["label"]), r["seed"]))
        return StudyRecord({"settings": self.settings(), "runs": runs})

    def plan(self, record):
        """The (config, seed) pairs the study trains, in the order supervise.run_all queues them, as
        far as its *record* (Study.record) decides: every config's seed 1 first, then its other
        --seeds; with --widen, the rate beyond the edge a variant's best is at, with --seeds; then
        --best-seeds at each variant's best rate, seed 2 of every variant before seed 3. Runs
        that are recorded are in it too."""
        runs = [(config, seed) for seed in self.seeds for config in self.configs]
        runs += [(self.config(variant, lr), seed) for variant, lr in record.widening() for seed in self.seeds]
        for seed in self.best_seeds:
            runs += [(self.config(v, lr), seed) for v, lr in record.best.items() if seed in record.further_seeds(v)]
        return list(dict.fromkeys(runs))

    def decided(self, record):
        """Whether *record* has chosen every rate the plan waits for (before that, plan() holds only
        the runs known so far): with --widen every variant's best, with --best-seeds each of
        --best-variants' (with --widen, a best at an edge is chosen once the rate beyond it is in)."""
        if not self.sweep or not (self.widen or self.best_seeds):
            return True
        return all(v in record.best for v in (self.variants if self.widen else self.best_variants or self.variants))

    def machines(self, previous):
        """The machine the JSON names: --machine, after the one of *previous* (the JSON this study
        goes on from) when that does not name it yet (its runs trained there); that one alone when it
        does."""
        before = previous.machine if previous else None
        if not before:
            return self.machine
        return before if self.machine in before else f"{before}; later runs: {self.machine}"

    def save(self, argv, record, found, across_seeds, show=True):
        """--json: the study (*record*: its runs and best rates), with its translations committed
        beside it (hypotheses' local paths dropped)."""
        path = Path(self.json)
        # on copies: the runs are also the recorded ones a later report in this process compares
        runs = copy.deepcopy(record.runs)
        write_translations(runs, path.parent / path.stem, self.target_lang)
        for run in runs:
            for score in scored_sets(run).values():
                del score["hypotheses"]  # local paths; `translations` is the committed copy
                if "hypotheses_tok" in score:
                    del score["hypotheses_tok"]
                    score["reference_tok"] = repo_relative(score["reference_tok"])  # made again by the same command
        write_result(
            path,
            QUALITY,
            argv,
            self.machine,
            what=self.describe(),
            settings=self.settings(),
            runs=runs,
            **({"best": record.best} if self.sweep else {}),
            comparisons=found,
            seed_comparisons=across_seeds,
            summary=scoring.summary(runs, self.labels),
        )
        if show:
            print(f"[quality] wrote {path}")


# the settings a run was trained with, the rate aside: runs that differ in one are not the same study's
DEFINING = ("preset", "epochs", "layers", "warmup", "bf16")


class StudyRecord:
    """A study's record: its settings and its runs, as its JSON holds them (load) or as a Study
    gathers them (Study.record); the questions asked of a study, each answered here."""

    def __init__(self, data, path=None, parts=None):
        self.data, self.settings, self.runs, self.path = data, data["settings"], data["runs"], path
        self.layers, self.machine, self.what = self.settings.get("layers"), data.get("machine"), data.get("what")
        self.parts = parts or [self]  # the studies a record of one depth merges (merged), else itself
        # a sweep lists its rates (the first, post-ln-only sweep committed did not, and compares
        # nothing across variants either way)
        self.sweep = "lrs" in self.settings

    @classmethod
    def merged(cls, parts):
        """Studies of one depth as one record: each variant's runs at its best rate side by side,
        their settings' variants in order, not a sweep; each study stays in ``parts``. A study
        trained otherwise than the first (DEFINING) names its variants with what differs
        ("deepnorm, warm-up 1600"): its seeds are not the same variant's."""

        def named(part, name):  # a variant or a run's label
            differs = [k for k in DEFINING if part.settings.get(k) != parts[0].settings.get(k)]
            return ", ".join([name] + [f"{k.replace('warmup', 'warm-up')} {part.settings.get(k)}" for k in differs])

        variants = list(dict.fromkeys(named(part, v) for part in parts for v in part.settings["variants"]))
        settings = {**{k: v for k, v in parts[0].settings.items() if k != "lrs"}, "variants": variants}
        runs = [
            {**r, "variant": named(part, r["variant"]), "label": named(part, r["label"])}
            for part in parts
            for r in part.compared
        ]
        return cls({**parts[0].data, "settings": settings, "runs": runs}, parts=parts)

    def run(self, variant, lr, seed):
        """The record of *variant*'s run at *lr* with *seed*; None when it is not in."""
        return next((r for r in self.runs if (r["variant"], r["lr"], r["seed"]) == (variant, lr, seed)), None)

    @property
    def best(self):
        """A sweep's chosen rate per variant whose --seeds runs are all in at every rate: the best
        mean validation sacreBLEU over those seeds; diverged runs are never best. With --widen, a
        variant whose best is at an edge of --lr is decided only once the rate beyond it is in."""
        best = {}
        for variant in self.settings["variants"] if self.sweep else ():
            lrs = list(self.settings["lrs"])
            beyond = self._beyond(self._best_of(variant, lrs))
            chosen = self._best_of(variant, lrs + ([beyond] if beyond else []))
            if chosen is not None:
                best[variant] = chosen
        return best

    def widening(self):
        """--widen: (variant, rate) beyond the edge of --lr that a variant's best sweep rate is at."""
        edges = ((v, self._beyond(self._best_of(v, self.settings["lrs"]))) for v in self.settings["variants"])
        return [(variant, lr) for variant, lr in edges if lr] if self.sweep else []

    def _beyond(self, lr):
        """The --widen rate beyond *lr* when it is an edge of --lr (half the lowest, twice the highest)."""
        lrs = self.settings.get("lrs", [])
        edges = {min(lrs): min(lrs) / 2, max(lrs): max(lrs) * 2} if self.settings.get("widen") and lrs else {}
        return edges.get(lr)

    def _best_of(self, variant, lrs):
        """The rate of *lrs* with *variant*'s best mean validation sacreBLEU over the sweep's seeds,
        once every one is in (None before); diverged runs are never best."""
        seeds = self.settings["seeds"]
        runs = {lr: [self.run(variant, lr, seed) for seed in seeds] for lr in lrs}
        if any(r is None for found in runs.values() for r in found):
            return None
        scored = {lr: rs for lr, rs in runs.items() if all(not r.get("diverged") and r.get("val") for r in rs)}
        if not scored:
            return None
        return max(scored, key=lambda lr: statistics.mean(r["val"]["sacrebleu"] for r in scored[lr]))

    @property
    def compared(self):
        """The runs compared across seeds: all of them; in a sweep, each variant at its best rate
        (none when it chose none)."""
        best = self.best
        return [r for r in self.runs if not self.sweep or best.get(r["variant"]) == r["lr"]]

    def further_seeds(self, variant):
        """The --best-seeds the settings ask of *variant* at its best rate (of --best-variants only)."""
        settings = self.settings
        return settings.get("best_seeds", []) if variant in (settings.get("best_variants") or [variant]) else []

    @classmethod
    def load(cls, path, data):
        """The JSON at *path*, each score's `hypotheses` (and the published recipe's
        `hypotheses_tok`) the committed translations, as scoring.comparisons reads them, and its
        reference the one the JSON names where it is, else the file of that name in *data*."""
        record = read_result(path)
        for run in record["runs"]:
            for score in scored_sets(run).values():
                for key in ("hypotheses", "hypotheses_tok"):
                    translations = score.get(key.replace("hypotheses", "translations"))
                    if translations is not None:
                        score[key] = str(REPO / translations)
                if "translations_tok" in score:  # the published recipe's: the prepared tokenised reference
                    score["reference_tok"] = str(REPO / score["reference_tok"])
                reference = Path(score["reference"])
                if not reference.exists():  # another machine's, or a gone run folder's (--quick's first lines)
                    reference = Path(data) / (reference.name.removesuffix(".gz") + ".gz")
                score["reference"] = str(reference)
        return cls(record, path=Path(path))

    def undecided(self):
        """Per variant of a sweep that has runs in but no best rate yet (its seed-1 runs are not all
        in, or, with --widen, its best is at an edge and the rate beyond it still trains): the rates in."""
        rates = {v: sorted({r["lr"] for r in self.runs if r["variant"] == v}) for v in self.settings["variants"]}
        return {v: mine for v, mine in rates.items() if self.sweep and v not in self.best and mine}

    def missing_seeds(self):
        """Per variant, the seeds its settings ask for at its best rate that are not in yet (a variant
        whose rate is not chosen yet: said by undecided())."""
        missing, waiting = {}, self.undecided()
        for variant in (v for v in self.settings["variants"] if v not in waiting):
            present = {r["seed"] for r in self.compared if r["variant"] == variant}
            wanted = [s for s in self.settings["seeds"] + self.further_seeds(variant) if s not in present]
            if wanted:
                missing[variant] = wanted
        return missing


def scored_sets(run):
    """A run's scores by set name: its test sets, and "val" when it scored the validation set."""
    return {**run["test_sets"], **({"val": run["val"]} if "val" in run else {})}


def write_translations(runs, folder, target_lang):
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
                score[key.replace("hypotheses", "translations")] = repo_relative(target)
