"""What a study is doing while it trains (quality.py --status), read without writing: every run
of its plan with its state, and what the runner trains next:

    finished   scored (or held by the --json)
    diverged   stopped where it diverged (divergence.py)
    training   its attempt under way: epochs, updates, tokens/s, validation loss, when it ends
    waiting    not started, stopped (resumes after its last epoch checkpoint), or waiting for a slot
"""

import datetime
from collections import Counter
from dataclasses import dataclass

from studies import recipe
from studies.runs import RunFolder

STATES = ("finished", "diverged", "training", "waiting")


@dataclass(frozen=True)
class RunStatus:
    name: str  # run_name: as the runner's log names the run
    state: str  # one of STATES
    words: str  # the state and how far the run has got: its row of the table after its name


def now():
    """The clock of the estimates (the status's and the runner's lines)."""
    return datetime.datetime.now()


def run_name(config, seed):
    """A run as the runner's log and the status name it: "post-ln lr=0.002 seed 1"."""
    return f"{config.label} seed {seed}"


def training_words(progress, epochs, per_epoch=None):
    """A run in training in words (runs.Progress), and when it ends at its speed; *per_epoch*: the
    updates an epoch makes (None: as many as its epochs made so far)."""
    of = f" of {epochs}" if epochs else ""  # the published recipe has no epoch limit
    if not progress.epochs:
        return f"training, epoch 1{of} under way, {progress.updates:,} updates"
    words = [f"training, epoch {progress.epochs}{of} done", f"{progress.updates:,} updates"]
    if progress.tokens_per_s:
        words.append(f"{progress.tokens_per_s:,.0f} tokens/s")
    if progress.valid_loss is not None:
        words.append(f"valid loss {progress.valid_loss:.3f}")
    if epochs and progress.epochs >= epochs:
        words.append("translating and scoring")
    elif epochs and progress.tokens_per_s and progress.tokens_per_update:
        per_epoch = per_epoch or progress.epoch_updates / progress.epochs
        seconds = (epochs * per_epoch - progress.epoch_updates) * progress.tokens_per_update / progress.tokens_per_s
        end, clock = progress.ended + datetime.timedelta(seconds=seconds), now()
        when = f"{end:%H:%M}" if end.date() == clock.date() else f"{end:%d %b %H:%M}"
        words.append(f"training ends {when} (in {max(0, round((end - clock).total_seconds() / 60))} min)")
    return ", ".join(words)


def run_status(study, config, seed, record, previous, per_epoch=None):
    """The RunStatus of (*config*, *seed*); *previous*: the --json's record (none of its runs trains)."""
    name, folder = run_name(config, seed), RunFolder(study.run_folder(config, seed))
    run = record.run(config.variant, config.lr, seed)  # its folder's outcome, else the --json's record
    if run is not None and run.diverged:
        return RunStatus(name, "diverged", f"diverged at update {run.diverged['update']}")
    if (previous is not None and previous.run(config.variant, config.lr, seed) is not None) or folder.finished():
        val = f", val BLEU {run.val['sacrebleu']:.2f}" if run.val else ""
        return RunStatus(name, "finished", "finished" + val)
    trainer = folder.trainer()
    if trainer == "training":
        return RunStatus(name, "training", training_words(folder.progress(), study.epochs, per_epoch))
    resumes = folder.resumes_at()
    return RunStatus(name, "waiting", (trainer or "waiting") + (f", resumes at epoch {resumes}" if resumes else ""))


def table(study, previous):
    """Every run of *study*'s plan, one row each, and the foot."""
    record = study.record(previous, scored=False)
    per_epoch = recipe.counted_updates_per_epoch(study.out / "data")
    runs = [run_status(study, c, seed, record, previous, per_epoch) for c, seed in study.plan(record)]
    width = max(len(r.name) for r in runs)
    epochs = f", {study.epochs} epochs a run" if study.epochs else ""
    return "\n".join(
        [
            f"{study.out} at {now():%Y-%m-%d %H:%M}{epochs}",
            f"{'run':<{width}}  state",
            *(f"{r.name:<{width}}  {r.words}" for r in runs),
            foot(runs, study.decided(record)),
        ]
    )


def foot(runs, decided):
    """How many runs are in each state, the next the runner trains, and whether more will come."""
    counts = Counter(r.state for r in runs)
    line = f"{counts['finished']} of {len(runs)} runs finished"
    line += "".join(f", {counts[state]} {state}" for state in STATES[1:] if counts[state])
    waiting = next((r.name for r in runs if r.state == "waiting"), None)
    if waiting:
        line += f"; next: {waiting}"
    elif counts["training"]:
        line += "; nothing waits"
    return line + ("" if decided else "; more runs once each variant's best rate is chosen")
