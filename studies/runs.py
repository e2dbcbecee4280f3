"""One run folder of a study (OUT/VARIANT-SUFFIX/seedS): everything written into it and read from
it is here. The recipe (examples/multi30k/run.sh) leaves train.log (fairseq-train's, every attempt
appended), test-sets, and score/SET/scores.json with the hypotheses beside it (scripts/score.py;
the published recipe's also tokenised); score/val/ the same for the validation set.

The supervisor (supervise.py) writes: lock (one trainer per folder); command (the recipe's
arguments: a run resumes only with the same ones); machines.jsonl (each attempt's processor, as it
starts: a run may span VMs); attempts.jsonl (each attempt that ended, with its wall time: a killed
one's is read from train.log); diverged.json (divergence.py); dropout_gap.json (dropout_gap.py).
"""

import datetime
import fcntl
import gzip
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import fairseq_log
from common.results import measured, read_result
from studies.divergence import divergence

_TRAIN_START = "| fairseq_cli.train | {'_name'"  # fairseq-train's config dump: one per invocation
_STOPPED = {  # fairseq-train's own words for why it stopped, in its log
    "patience": "early stop since valid performance hasn't improved",
    "max-update": "Stopping training due to num_updates",
}
LOCK_TRIES = 5  # RunFolder.lock's tries, 0.1 s apart
_EPOCH_CHECKPOINT = re.compile(r"checkpoint(\d+)\.pt$")
_SCORES = {}  # (scores.json, its mtime and size, subset, language): RunFolder.scores, read once per process


def try_lock(path, tries=1):
    """*path* opened and locked, held until it is closed; None while another process holds it
    (tried *tries* times, 0.1 s apart)."""
    handle = open(path, "w")
    for attempt in range(tries):
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            time.sleep(0.1 * (attempt < tries - 1))
    handle.close()
    return None


def read_lines(path):
    with (gzip.open if str(path).endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def lines_of(path):
    """read_lines, or none when *path* is not there (yet)."""
    return read_lines(path) if Path(path).exists() else []


@dataclass
class Run:
    """One run as a study's JSON holds it, its keys in its order (OPTIONAL ones left out when None)."""

    variant: str
    lr: float  # None: the recipe's
    label: str  # the tables' and figures' name: the variant, or "variant lr=X" in a sweep
    seed: int
    folder: str = None  # VARIANT-SUFFIX/seedS
    updates: int = 0
    epochs: int = 0
    tokens_per_s: float = None
    best_valid_loss: float = None
    valid_curve: list = field(default_factory=list)  # [(updates, validation loss)] per epoch
    wall_s: float = 0.0
    wall_s_by_cpu: dict = None
    attempts: int = 0
    stopped_by: str = None  # "patience" or "max-update": fairseq-train's reason
    dropout_gap: dict = None  # dropout_gap.py's record
    diverged: dict = None  # divergence.divergence's: where and why
    test_sets: dict = field(default_factory=dict)  # {test set: score}
    val: dict = None  # the validation set's score

    OPTIONAL = ("wall_s_by_cpu", "stopped_by", "dropout_gap", "diverged", "val")

    def to_json(self):
        return {k: v for k, v in vars(self).items() if v is not None or k not in self.OPTIONAL}

    @property
    def scored_sets(self):
        """Its scores by set name: its test sets, and "val" when it scored the validation set."""
        return {**self.test_sets, **({"val": self.val} if self.val is not None else {})}


class RunFolder:
    """A run's folder: its records, its scores and its training summary."""

    # what checkpoints(average_only) lists, for an error
    KEPT = {False: "checkpoints/checkpointN.pt or checkpoint_avg.pt", True: "checkpoints/checkpoint_avg.pt"}

    def __init__(self, path):
        self.path = Path(path)
        self.bin = self.path / "bin"  # the study's binarised data (link_data)
        self.recipe_log = self.path / "recipe.log"  # the recipe's output, every attempt appended
        self.lock_file, self.command_file = self.path / "lock", self.path / "command"
        self.dropout_gap_file = self.path / "dropout_gap.json"

    def __truediv__(self, name):
        return self.path / name

    @property
    def name(self):  # as a study's JSON and its translations name the run
        return f"{self.path.parent.name}/{self.path.name}"

    # --- what the supervisor writes ---------------------------------------------------------------

    def lock(self):
        """The folder's lock, held until the file is closed; None while another process holds it.
        Tried a few times: --status probes it for an instant (``trainer``), and a probe is not a trainer."""
        self.path.mkdir(parents=True, exist_ok=True)
        return try_lock(self.lock_file, LOCK_TRIES)

    def trainer(self):
        """What the lock's holder does, read without writing: "training" while the attempt it started
        (machines.jsonl, since it took the lock) has not ended (attempts.jsonl); "waiting for a slot"
        before it starts one; None when no process holds the lock."""
        try:
            handle = open(self.lock_file, "rb")
        except FileNotFoundError:
            return None
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return None  # no holder: closing the file lets the shared lock go
            except BlockingIOError:
                pass
        # when it was locked (lock() opens it for writing), to the second as machines.jsonl's starts
        locked = datetime.datetime.fromtimestamp(int(self.lock_file.stat().st_mtime))
        started = [datetime.datetime.fromisoformat(m["started"]) for m in self.jsonl("machines.jsonl")]
        if not started or started[-1] < locked:
            return "waiting for a slot"
        ended = {datetime.datetime.fromisoformat(a["started"]) for a in self.jsonl("attempts.jsonl") if "started" in a}
        return None if started[-1] in ended else "training"

    def link_data(self, data_dir):  # bin -> the study's binarised data, the same for every run
        if not self.bin.exists():
            self.bin.symlink_to(os.path.relpath(Path(data_dir) / "bin", self.path))

    def keep_command(self, arguments):
        """Record the recipe's *arguments*; False if the run started with other ones."""
        record, text = self.command_file, " ".join(arguments) + "\n"
        if record.exists() and record.read_text() != text:
            return False
        record.write_text(text)
        return True

    def record_start(self, started, cpu):
        """An attempt starts on processor *cpu* (written first: a killed attempt writes nothing after)."""
        self._append("machines.jsonl", started, cpu=cpu)

    def record_attempt(self, started, wall_s, returncode):
        self._append("attempts.jsonl", started, wall_s=round(wall_s, 1), returncode=returncode)

    def _append(self, name, started, **record):
        with open(self / name, "a") as f:
            f.write(json.dumps({"started": started.isoformat(timespec="seconds"), **record}) + "\n")

    def record_divergence(self, where):
        (self / "diverged.json").write_text(json.dumps(where) + "\n")

    # --- what it holds ------------------------------------------------------------------------------

    def finished_test_sets(self):
        """The test sets the recipe scored, in its order; None while it has not scored them all."""
        listed = self / "test-sets"
        if not listed.exists():
            return None
        names = listed.read_text().strip().split(",")
        return names if all((self / "score" / name / "scores.json").exists() for name in names) else None

    def diverged(self):
        """Where the run diverged (the record written when it was stopped); None if it did not."""
        record = self / "diverged.json"
        return json.loads(record.read_text()) if record.exists() else None

    def finished(self):
        """The run diverged, or scored its test sets and the validation set (one finished before the
        recipe scored validation runs again for that alone)."""
        return self.diverged() is not None or (
            self.finished_test_sets() is not None and (self / "score" / "val" / "scores.json").exists()
        )

    def resumes_at(self):
        """The epoch after its last epoch checkpoint; None with none."""
        epochs = self._epoch_checkpoints()
        return max(epochs) + 1 if epochs else None

    def progress(self):
        return Progress.of(lines_of(self / "train.log"))

    def divergence(self):
        """Where its train.log says it diverged (checkpoints/crash.pt names a NaN's update)."""
        return divergence(lines_of(self / "train.log"), self / "checkpoints" / "crash.pt")

    def checkpoints(self, average_only=False):
        """The epoch checkpoints in order, then the average the translations came from (*average_only*: it)."""
        epochs = self._epoch_checkpoints()
        average = [f for f in [self / "checkpoints" / "checkpoint_avg.pt"] if f.exists()]
        return average if average_only else [epochs[e] for e in sorted(epochs)] + average

    def _epoch_checkpoints(self):  # {epoch: checkpoints/checkpointN.pt}
        found = (self / "checkpoints").glob("checkpoint*.pt")
        return {int(m.group(1)): f for f in found if (m := _EPOCH_CHECKPOINT.search(f.name))}

    @staticmethod
    def checkpoint_name(checkpoint):
        """ "post-ln/seed1" for a run folder's average, "post-ln/seed1 checkpoint3" for another of its
        checkpoints; None outside a run folder's checkpoints/."""
        path = Path(checkpoint)
        if len(path.parts) < 4 or path.parent.name != "checkpoints":
            return None
        return "/".join(path.parts[-4:-2]) + ("" if path.name == "checkpoint_avg.pt" else f" {path.stem}")

    def dropout_gap(self):
        """The dropout-gap record with checkpoint names, not local paths; None if it has none."""
        if not self.dropout_gap_file.exists():
            return None
        gap = measured(read_result(self.dropout_gap_file))
        for row in gap["rows"]:
            row["checkpoint"] = Path(row["checkpoint"]).name
        return gap

    def jsonl(self, name):
        return [json.loads(line) for line in lines_of(self / name)]

    def summary(self):
        """Updates, tokens/s, the validation curve, why it stopped and wall time: Run's fields."""
        log = lines_of(self / "train.log")
        train, valid = training_log(log)
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
        attempts = self.jsonl("attempts.jsonl")
        killed = unrecorded_spans(log, attempts)
        return {
            "updates": updates,
            "epochs": len(epochs),
            "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
            "best_valid_loss": min(loss for _, loss in curve) if curve else None,
            "valid_curve": curve,
            "wall_s": round(sum(a["wall_s"] for a in attempts) + sum(seconds for _, seconds in killed), 1),
            "wall_s_by_cpu": wall_s_by_cpu(attempts, killed, self.jsonl("machines.jsonl")),
            "attempts": len(attempts) + len(killed),
            "stopped_by": stopped_by(log),
        }

    def scores(self, name, subset, target_lang):
        """sacreBLEU, chrF and lowercased BLEU of one scored set, with signatures (the published
        recipe's: the literature's BLEU, and both case-insensitive); *subset*: fairseq's name for it.
        Scored once per process (the runner reads its finished runs again and again)."""
        record = self / "score" / name / "scores.json"
        stat = record.stat()
        key = (str(record), stat.st_mtime_ns, stat.st_size, subset, target_lang)
        if key not in _SCORES:
            _SCORES[key] = self._scores(record, subset, target_lang)
        return dict(_SCORES[key])  # a copy: a caller may change its paths

    @staticmethod
    def _scores(record, subset, target_lang):
        from sacrebleu.metrics import BLEU, CHRF

        folder = record.parent
        scored = json.loads(record.read_text())
        hypotheses_path = folder / f"{subset}.hyp.{target_lang}"
        hypotheses, references = read_lines(hypotheses_path), read_lines(scored["reference"])
        published = "tokenized_bleu" in scored  # the published recipe's: case-insensitive, tokenised too
        chrf = CHRF(lowercase=published)
        score = {
            "sacrebleu": scored["sacrebleu"],
            "signature": f"BLEU|{scored['sacrebleu_signature']}" if published else scored["sacrebleu_signature"],
            "chrf": chrf.corpus_score(hypotheses, [references]).score,
            "chrf_signature": f"chrF2|{chrf.get_signature()}" if published else str(chrf.get_signature()),
        }
        if published:
            return {
                "bleu_tok": scored["tokenized_bleu"],
                "bleu_tok_signature": f"BLEU|{scored['tokenized_signature']}|tokenised lowercased text (multi-bleu)",
                **score,
                "hypotheses": str(hypotheses_path),
                "hypotheses_tok": str(folder / f"{subset}.hyp.tok.{target_lang}"),
                "reference": scored["reference"],
                "reference_tok": scored["tokenized_reference"],
            }
        lowercase = BLEU(lowercase=True)
        score.update(bleu_lc=lowercase.corpus_score(hypotheses, [references]).score)
        score.update(bleu_lc_signature=str(lowercase.get_signature()), hypotheses=str(hypotheses_path))
        return {**score, "reference": scored["reference"]}

    def record(self, config, seed, target_lang, scored=True):
        """The Run of *config* and *seed*; None while it has neither finished nor diverged. *scored*
        False: only what Study.plan decides by (where it diverged, scripts/score.py's val sacreBLEU)."""
        names, where = self.finished_test_sets(), self.diverged()
        if names is None and where is None:
            return None
        summary = {"folder": self.name, **self.summary(), "dropout_gap": self.dropout_gap()} if scored else {}
        run = Run(config.variant, config.lr, config.label, seed, diverged=where, **summary)
        val = self / "score" / "val" / "scores.json"
        if where is None and scored:
            # fairseq's names for the test splits: test, test1, ...
            run.test_sets = {name: self.scores(name, f"test{i or ''}", target_lang) for i, name in enumerate(names)}
            run.val = self.scores("val", "valid", target_lang) if val.exists() else None
        elif where is None and val.exists():
            run.val = json.loads(val.read_text())
        return run


@dataclass(frozen=True)
class Progress:
    """How far a training has got, from its log: what --status shows of it."""

    epochs: int = 0  # the last epoch logged as ended
    updates: int = 0  # the last update logged (an interval's or an epoch's)
    epoch_updates: int = 0  # the updates when the last epoch ended
    tokens_per_s: float = None  # fairseq's wps over the last epoch
    tokens_per_update: float = None  # fairseq's wpb over it
    valid_loss: float = None  # the last validation loss
    ended: datetime.datetime = None  # when the last epoch was logged

    @classmethod
    def of(cls, lines):
        """The progress fairseq-train's log *lines* show (a resumed run's last lines win)."""
        found = {"updates": 0}
        for line in lines:
            kind, fields = fairseq_log.parse(line) or (None, None)
            if kind in ("train_inner", "train"):
                found["updates"] = int(fields.get("num_updates", found["updates"]))
            if kind == "valid":
                found["valid_loss"] = fields.get("loss")
            elif kind == "train":
                found.update(epochs=fields["epoch"], epoch_updates=found["updates"], ended=fairseq_log.timestamp(line))
                found.update(tokens_per_s=fields.get("wps"), tokens_per_update=fields.get("wpb"))
        return cls(**found)


def training_log(lines):
    """Per epoch, fairseq-train's end-of-epoch training and validation fields; an epoch logged twice
    (killed before its checkpoint was saved, then run again) counts once, the last."""
    epochs = {"train": {}, "valid": {}}
    for kind, fields in fairseq_log.records(lines, "train", "valid"):
        epochs[kind][fields["epoch"]] = fields
    return epochs["train"], epochs["valid"]


def stopped_by(lines):
    """Why fairseq-train stopped early ("patience" or "max-update"), the last reason its log gives."""
    reasons = [name for line in lines for name, words in _STOPPED.items() if words in line]
    return reasons[-1] if reasons else None


def unrecorded_spans(lines, attempts):
    """(first logged line, seconds to its last) of each fairseq-train in the log that no attempt of
    *attempts* covers (one killed with its session leaves no record): a lower bound."""
    invocations = []  # [first, last] timestamp of each fairseq-train in the log
    for line in lines:
        stamp = fairseq_log.timestamp(line)
        if stamp is not None and _TRAIN_START in line:
            invocations.append([stamp, stamp])
        elif stamp is not None and invocations:
            invocations[-1][1] = stamp
    spans = _recorded_spans(attempts)
    return [
        (first, round((last - first).total_seconds(), 1))
        for first, last in invocations
        if not any(start <= first <= start + datetime.timedelta(seconds=wall) for start, wall in spans)
    ]


def _recorded_spans(attempts):  # (start, seconds) of each attempt that says when it started
    return [(datetime.datetime.fromisoformat(a["started"]), a["wall_s"]) for a in attempts if "started" in a]


def wall_s_by_cpu(attempts, killed, machines):
    """Wall seconds per processor model: each attempt (recorded, or *killed*) on the processor of the
    last *machines* record between the attempt before it and its start; else "not recorded"."""
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
