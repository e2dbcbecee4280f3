"""A quality study: its plan (Study: variants × peak learning rates × seeds, and their folders)
and its record (StudyRecord: the runs gathered from their folders or loaded from its JSON).

The JSON: "what", the header (common.results), "settings" (Settings), "runs" (runs.Run, naming the
committed translations), "best" (a sweep's chosen rates), "comparisons" (paired bootstrap),
"seed_comparisons" (permutation test across seeds) and "summary" (mean ± std).
"""

import copy
import gzip
import os
import re
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from common.presets import PRESETS
from common.repo import REPO, repo_relative
from common.results import read_result, write_result
from studies import scoring
from studies.runs import Run, RunFolder, read_lines

QUALITY = Path(__file__).with_name("quality.py")  # the command that writes a study's JSON


@dataclass(frozen=True)
class RunConfig:
    label: str  # the table's and the figures' name: the variant, or "variant lr=X" in a sweep
    variant: str
    lr: float  # None: the recipe's
    suffix: str  # of its folders: OUT/VARIANT+SUFFIX/seedS


@dataclass
class Study:
    """A study's plan, from the command line (quality.py)."""

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
        self.configs = [self._config(variant, lr, self.lr_given) for variant in self.variants for lr in self.lrs]
        # --widen: the rate beyond each edge, trained for a variant whose best is at that edge
        edges = beyond_edges(self.lrs).values() if self.widen else ()
        self.beyond = [self._config(variant, lr, True) for variant in self.variants for lr in edges]
        self.all_configs = self.configs + self.beyond
        self.labels = [config.label for config in self.all_configs]

    def _config(self, variant, lr, rate_named):
        label = f"{variant} lr={lr:g}" if self.sweep else variant
        return RunConfig(label, variant, lr, (f"-lr{lr:g}" if rate_named else "") + self.run_suffix)

    def run_folder(self, config, seed):
        return self.out / f"{config.variant}{config.suffix}" / f"seed{seed}"

    def settings(self):
        given = dict(lrs=self.lrs if self.sweep else None, best_seeds=self.best_seeds, widen=self.widen, bf16=self.bf16)
        fixed = (self.preset_name, self.epochs, self.layers, self.lr, self.warmup, self.seeds, self.variants, self.jobs)
        return Settings(*fixed, best_variants=self.best_variants, **{k: v or None for k, v in given.items()})

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
        """The StudyRecord of the --json this study goes on from; None without one, or when its runs
        were trained otherwise (DEFINING)."""
        if not self.json or not Path(self.json).exists():
            return None
        record, mine = StudyRecord.load(self.json, self.data), self.settings()
        return record if all(getattr(record.settings, k) == getattr(mine, k) for k in DEFINING) else None

    def config(self, variant, lr):
        return next(c for c in self.all_configs if (c.variant, c.lr) == (variant, lr))

    def record(self, previous=None, scored=True):
        """Every finished run, from its folder, else from *previous* (a fresh checkout has no run
        folders), under this study's label. *scored* False: only what the plan decides by."""
        runs = []
        for seed in self.seeds + self.best_seeds:
            for config in self.all_configs:
                run = RunFolder(self.run_folder(config, seed)).record(config, seed, self.target_lang, scored)
                if run is None and previous is not None and (known := previous.run(config.variant, config.lr, seed)):
                    run = replace(known, label=config.label)
                runs += [run] if run else []
        labels = self.labels
        runs.sort(key=lambda r: (labels.index(r.label), r.seed))
        return StudyRecord(self.settings(), runs, self.describe(), self.machine)

    def plan(self, record):
        """The (config, seed) pairs to train, in order, as far as *record* decides: every config's
        --seeds; --widen's rates; then --best-seeds at each variant's best rate, seed by seed."""
        runs = [(config, seed) for seed in self.seeds for config in self.configs]
        runs += [(self.config(variant, lr), seed) for variant, lr in record.widening() for seed in self.seeds]
        for seed in self.best_seeds:
            runs += [(self.config(v, lr), seed) for v, lr in record.best.items() if seed in record.further_seeds(v)]
        return list(dict.fromkeys(runs))

    def decided(self, record):
        """Whether *record* has chosen every rate the plan waits for (--widen: every variant's,
        --best-seeds: each of --best-variants')."""
        if not self.sweep or not (self.widen or self.best_seeds):
            return True
        return all(v in record.best for v in (self.variants if self.widen else self.best_variants or self.variants))

    def machines(self, previous, report_only=False):
        """--machine, after *previous*'s machine (where its runs trained) unless that names it; a
        report (*report_only*: it trains nothing) names *previous*'s alone."""
        before = previous.machine if previous else None
        if not before:
            return self.machine
        return before if report_only or self.machine in before else f"{before}; later runs: {self.machine}"

    def save(self, argv, record, found, across_seeds, show=True):
        """--json: *record*, its translations committed beside it, and its comparisons."""
        path = Path(self.json)
        write_result(
            path,
            QUALITY,
            argv,
            self.machine,
            what=record.what,
            settings=record.settings.to_json(),
            runs=[committed(run, path.parent / path.stem, self.target_lang) for run in record.runs],
            **({"best": record.best} if self.sweep else {}),
            comparisons=found,
            seed_comparisons=across_seeds,
            summary=scoring.summary(record.runs, self.labels),
        )
        if show:
            print(f"[quality] wrote {path}")


# the settings a run was trained with, the rate aside: runs that differ in one are not the same study's
DEFINING = ("preset", "epochs", "layers", "warmup", "bf16")


@dataclass
class Settings:
    """What a study's runs were trained with, as its JSON holds them (OPTIONAL ones only when given)."""

    preset: str = None
    epochs: int = None
    layers: int = None
    lr: float = None  # None: a sweep's, or the recipe's
    warmup: int = None
    seeds: list = field(default_factory=list)
    variants: list = field(default_factory=list)
    jobs: int = 1
    lrs: list = None  # a sweep's rates (the first, post-ln-only sweep committed lists none)
    best_seeds: list = None
    best_variants: list = None
    widen: bool = None
    bf16: bool = None

    OPTIONAL = ("lrs", "best_seeds", "best_variants", "widen", "bf16")

    def to_json(self):
        return {k: v for k, v in vars(self).items() if v or k not in self.OPTIONAL}


@dataclass
class StudyRecord:
    """A study's settings and runs, loaded or gathered (Study.record): what a report asks of a study."""

    settings: Settings
    runs: list  # of runs.Run
    what: str = None  # Study.describe()
    machine: str = None
    date: str = ""
    path: Path = None  # the JSON it was loaded from
    parts: list = None  # merged: the studies of one depth it holds

    @classmethod
    def from_json(cls, data, path=None):
        settings, runs = Settings(**data["settings"]), [Run(**run) for run in data["runs"]]
        return cls(settings, runs, data.get("what"), data.get("machine"), data.get("date", ""), path)

    @property
    def layers(self):
        return self.settings.layers

    @property
    def sweep(self):
        return bool(self.settings.lrs)

    @property
    def test_names(self):
        return next((list(r.test_sets) for r in self.runs if r.test_sets), [])

    @classmethod
    def merged(cls, parts):
        """Studies of one depth as one record of each variant at its best rate; a study trained
        otherwise than the first names its variants with what differs ("deepnorm, warm-up 1600")."""

        def named(part, name):  # a variant or a run's label
            mine, first = vars(part.settings), vars(parts[0].settings)
            differs = [f"{k.replace('warmup', 'warm-up')} {mine[k]}" for k in DEFINING if mine[k] != first[k]]
            return ", ".join([name, *differs])

        variants = list(dict.fromkeys(named(part, v) for part in parts for v in part.settings.variants))
        runs = [
            replace(r, variant=named(part, r.variant), label=named(part, r.label))
            for part in parts
            for r in part.compared
        ]
        first = parts[0]
        settings = replace(first.settings, lrs=None, variants=variants)
        return cls(settings, runs, first.what, first.machine, first.date, parts=parts)

    def run(self, variant, lr, seed):
        return next((r for r in self.runs if (r.variant, r.lr, r.seed) == (variant, lr, seed)), None)

    @property
    def best(self):
        """A sweep's chosen rate per variant (_best_of), with --widen among the rate beyond an edge too."""
        swept = self.settings.variants if self.sweep else []
        chosen = {v: self._best_of(v, [*self.settings.lrs, *self._beyond(v)]) for v in swept}
        return {variant: lr for variant, lr in chosen.items() if lr is not None}

    def widening(self):
        """--widen: (variant, rate beyond the edge of --lr that its best is at)."""
        return [(v, lr) for v in (self.settings.variants if self.sweep else []) for lr in self._beyond(v)]

    def _beyond(self, variant):
        lrs = self.settings.lrs
        edge = beyond_edges(lrs).get(self._best_of(variant, lrs)) if self.settings.widen else None
        return [edge] if edge else []

    def _best_of(self, variant, lrs):
        """The rate of *lrs* with the best mean validation sacreBLEU over --seeds, once all are in;
        diverged runs are never best."""
        runs = {lr: [self.run(variant, lr, seed) for seed in self.settings.seeds] for lr in lrs}
        if any(r is None for found in runs.values() for r in found):
            return None
        scored = {lr: rs for lr, rs in runs.items() if all(not r.diverged and r.val for r in rs)}
        if not scored:
            return None
        return max(scored, key=lambda lr: statistics.mean(r.val["sacrebleu"] for r in scored[lr]))

    @property
    def compared(self):
        """All runs; in a sweep, each variant's at its best rate."""
        best = self.best
        return [r for r in self.runs if not self.sweep or best.get(r.variant) == r.lr]

    @property
    def scored(self):  # the runs compared that have scores
        return [r for r in self.compared if not r.diverged]

    def further_seeds(self, variant):
        """The --best-seeds asked of *variant* (one of --best-variants) at its best rate."""
        settings = self.settings
        return (settings.best_seeds or []) if variant in (settings.best_variants or [variant]) else []

    @classmethod
    def load(cls, path, data):
        """The JSON at *path*, its scores' `hypotheses` the committed translations, and its reference
        the one it names where that is, else the file of that name in *data*."""
        record = cls.from_json(read_result(path), Path(path))
        for score in (score for run in record.runs for score in run.scored_sets.values()):
            for form in ("", "_tok"):
                if f"translations{form}" in score:
                    score[f"hypotheses{form}"] = str(REPO / score[f"translations{form}"])
            if "translations_tok" in score:  # the published recipe's: the prepared tokenised reference
                score["reference_tok"] = str(REPO / score["reference_tok"])
            reference = Path(score["reference"])
            if not reference.exists():  # another machine's, or a gone run folder's (--quick's first lines)
                reference = Path(data) / (reference.name.removesuffix(".gz") + ".gz")
            score["reference"] = str(reference)
        return record

    def undecided(self):
        """Per variant of a sweep with runs in but no best rate yet: the rates in."""
        rates = {v: sorted({r.lr for r in self.runs if r.variant == v}) for v in self.settings.variants}
        return {v: mine for v, mine in rates.items() if self.sweep and v not in self.best and mine}

    def missing_seeds(self):
        """Per variant with a best rate, the seeds asked of it there that are not in yet."""
        waiting, present = self.undecided(), {(r.variant, r.seed) for r in self.compared}
        asked = {v: self.settings.seeds + self.further_seeds(v) for v in self.settings.variants if v not in waiting}
        missing = {v: [s for s in seeds if (v, s) not in present] for v, seeds in asked.items()}
        return {v: seeds for v, seeds in missing.items() if seeds}


def beyond_edges(lrs):
    """--widen's rates, by the edge of *lrs* they are beyond: half the lowest, twice the highest."""
    return {min(lrs): min(lrs) / 2, max(lrs): max(lrs) * 2}


def committed(run, folder, target_lang):
    """*run*'s JSON naming its hypotheses gzipped into *folder* (`translations`, reproducibly)."""
    run = copy.deepcopy(run)  # the recorded run: a later report in this process compares it again
    folder.mkdir(parents=True, exist_ok=True)
    for name, score in run.scored_sets.items():
        # the published recipe's are scored in two forms: detokenised, and tokenised (.tok)
        for form in ("", "_tok"):
            hypotheses = score.pop(f"hypotheses{form}", None)
            if hypotheses is None:
                continue
            target = folder / f"{run.folder.replace('/', '.')}.{name}{form.replace('_', '.')}.{target_lang}.gz"
            text = "".join(f"{line}\n" for line in read_lines(hypotheses)).encode("utf-8")  # also a committed .gz
            with open(target, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
                f.write(text)
            score[f"translations{form}"] = repo_relative(target)
        if "reference_tok" in score:  # made again by the same command
            score["reference_tok"] = repo_relative(score["reference_tok"])
    return run.to_json()
