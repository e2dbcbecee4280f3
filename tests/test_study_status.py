"""quality.py --status: every run of a study's plan with its state, read from fake run folders (the
logs and score files the recipe writes, the locks and records the runner writes) without writing
anything; and the runner's line at each epoch's end, in the same words as the run's row."""

import datetime
import json
import subprocess

import pytest

from studies import quality, status, supervise
from studies.runs import RunFolder

# fairseq-train's lines (--log-format simple), as tests/test_quality_sweep.py's EPOCH and INNER
INNER = (
    "{time} | INFO | train_inner | epoch {epoch:03d}:     50 / 132 loss={loss}, nll_loss=7.9, ppl=238.9, "
    "wps=3100.5, ups=0.9, wpb=3474.1, bsz=220.8, num_updates={updates}, lr=0.0004, gnorm=1.6, train_wall=55, wall=60"
)
EPOCH = (
    "{time} | INFO | train | epoch {epoch:03d} | loss {loss} | nll_loss 7.5 | ppl 181.0 | wps 3003.1 | ups 0.87 | "
    "wpb 3464.6 | bsz 219.7 | num_updates {updates} | lr 0.00066 | train_wall 149 | wall 153"
)
VALID = (
    "{time} | INFO | valid | epoch {epoch:03d} | valid on 'valid' subset | loss {loss} | nll_loss 6.5 | "
    "ppl 90.5 | wps 9001.2 | wpb 3000.1 | bsz 200.3 | num_updates {updates}"
)
NOW = datetime.datetime(2026, 11, 24, 20, 40)


def _epoch(epoch, time, loss, valid_loss):
    """The lines fairseq-train logs as an epoch of 132 updates ends: validation, then training."""
    updates = 132 * epoch
    return [
        VALID.format(time=time, epoch=epoch, loss=valid_loss, updates=updates),
        EPOCH.format(time=time, epoch=epoch, loss=loss, updates=updates),
    ]


def _scored(folder, bleu):
    """A finished run: what the recipe leaves once it scored the test set and the validation set."""
    (folder.path / "test-sets").write_text("test_2016_flickr\n")
    for name in ("test_2016_flickr", "val"):
        (folder / "score" / name).mkdir(parents=True)
        record = {"sacrebleu": bleu, "sacrebleu_signature": "nrefs:1", "reference": str(folder / f"{name}.de")}
        (folder / "score" / name / "scores.json").write_text(json.dumps(record) + "\n")


def _tree(root):
    """Every file and folder under *root* with its modification time and size."""
    return {path: (path.stat().st_mtime_ns, path.stat().st_size) for path in [root, *sorted(root.rglob("*"))]}


@pytest.fixture
def study(tmp_path, monkeypatch):
    """A sweep of post-ln and realformer at 1e-3 and 2e-3, seed 1, and seed 2 at each variant's
    best rate, 4 epochs of 132 updates: post-ln at 1e-3 is in the study's --json, at 2e-3 its
    folder finished (the better validation BLEU, so its seed 2 is planned there, stopped after
    epoch 1); realformer at 1e-3 trains (the test holds its lock), at 2e-3 it diverged."""
    monkeypatch.setattr(status, "now", lambda: NOW)
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    (data / "train.en.gz").touch()
    (out / "data").mkdir(parents=True)
    (out / "data" / "updates_per_epoch").write_text("132\n")  # what quality.py counted on the data
    argv = ["--data", str(data), "--out", str(out), "--preset", "cpu", "--epochs", "4", "--seeds", "1"]
    argv += ["--variants", "post-ln,realformer", "--lr", "1e-3,2e-3", "--best-seeds", "2"]
    argv += ["--json", str(tmp_path / "study.json")]
    plan, _ = quality.parse_args(argv)
    config = {(c.variant, c.lr): c for c in plan.configs}
    committed = {"variant": "post-ln", "lr": 1e-3, "label": "post-ln lr=0.001", "seed": 1, "test_sets": {}}
    committed["val"] = {"sacrebleu": 30.0, "reference": "val.de"}
    (tmp_path / "study.json").write_text(json.dumps({"settings": plan.settings().to_json(), "runs": [committed]}))

    finished = RunFolder(plan.run_folder(config["post-ln", 2e-3], 1))
    finished.path.mkdir(parents=True)
    _scored(finished, 35.0)

    training = RunFolder(plan.run_folder(config["realformer", 1e-3], 1))
    lock = training.lock()  # as the runner holds it (a second open file of this process conflicts with it)
    training.record_start(datetime.datetime.now(), "a CPU")  # the runner, as its attempt starts
    lines = _epoch(1, "2026-11-24 20:31:00", 10.8, 9.5) + _epoch(2, "2026-11-24 20:37:44", 9.0, 7.9)
    lines.append(INNER.format(time="2026-11-24 20:39:50", epoch=3, loss=8.5, updates=300))
    (training / "train.log").write_text("\n".join(lines) + "\n")

    diverged = RunFolder(plan.run_folder(config["realformer", 2e-3], 1))
    diverged.path.mkdir(parents=True)
    diverged.record_divergence({"update": 200, "reason": "the training loss climbed back above the first epoch's"})

    stopped = RunFolder(plan.run_folder(config["post-ln", 2e-3], 2))
    stopped.lock().close()  # its runner ended: the lock file stays, nobody holds it
    (stopped / "checkpoints").mkdir()
    for name in ("checkpoint1.pt", "checkpoint_last.pt"):
        (stopped / "checkpoints" / name).touch()
    (stopped / "train.log").write_text("\n".join(_epoch(1, "2026-11-24 19:00:00", 10.8, 9.5)) + "\n")
    yield argv, plan, training
    lock.close()


def test_the_status_shows_each_run_of_the_plan_and_writes_nothing(tmp_path, study, capsys):
    """The plan's runs in the runner's order (seed 1 of every config, then seed 2 at post-ln's best
    rate): the one in the --json and the scored one finished, the diverged one where it diverged,
    the training one with its epochs, updates, tokens/s and validation loss of its last epoch and
    its end at that speed (2 epochs of 132 updates left at 3464.6 / 3003.1 s an update after
    20:37:44: 20:42:49), the stopped one waiting to resume; the foot counts them and names the
    next run. Not a file or folder is written or touched."""
    argv, plan, _ = study
    before = _tree(tmp_path)
    quality.main([*argv, "--status"])
    assert _tree(tmp_path) == before
    assert capsys.readouterr().out.splitlines() == [
        f"{plan.out} at 2026-11-24 20:40, 4 epochs a run",
        "run                         state",
        "post-ln lr=0.001 seed 1     finished, val BLEU 30.00",
        "post-ln lr=0.002 seed 1     finished, val BLEU 35.00",
        "realformer lr=0.001 seed 1  training, epoch 2 of 4 done, 300 updates, 3,003 tokens/s, valid loss 7.900, "
        "training ends 20:42 (in 3 min)",
        "realformer lr=0.002 seed 1  diverged at update 200",
        "post-ln lr=0.002 seed 2     waiting, resumes at epoch 2",
        "2 of 5 runs finished, 1 diverged, 1 training, 1 waiting; next: post-ln lr=0.002 seed 2; "
        "more runs once each variant's best rate is chosen",
    ]


def test_the_runner_says_each_epoch_in_the_words_of_the_runs_status(study, capsys):
    """While it watches a training, the runner says one line when the log shows a new epoch (none
    for the epochs logged before it started watching, none when nothing new is logged): the run's
    name and the words of its row in the status."""
    argv, plan, training = study
    log = training / "train.log"

    class Recipe:  # ends epoch 3 while the runner watches, then nothing new, then exits
        pid, waits, returncode = None, 0, 0

        def wait(self, timeout, check):
            self.waits += 1
            if self.waits == 1:
                with open(log, "a") as f:
                    f.write("\n".join(_epoch(3, "2026-11-24 20:42:00", 8.0, 7.2)) + "\n")
            if self.waits < 3:
                raise subprocess.TimeoutExpired("run.sh", timeout)
            return self

    runner = supervise.Runner(plan, plan.out / "data")
    assert runner.wait_watching(Recipe(), training, "realformer lr=0.001 seed 1") == (0, None)
    (said,) = capsys.readouterr().out.splitlines()
    words = "training, epoch 3 of 4 done, 396 updates, 3,003 tokens/s, valid loss 7.200, training ends 20:44 (in 5 min)"
    assert said.startswith("[quality ") and said.endswith(f"] realformer lr=0.001 seed 1: {words}")
    quality.main([*argv, "--status"])
    assert f"realformer lr=0.001 seed 1  {words}" in capsys.readouterr().out.splitlines()


def test_a_folders_trainer_is_read_from_its_lock_and_records(tmp_path):
    """No lock file, or nobody holding it: no trainer. Held, with no attempt started since it was
    taken (a runner waits for one of --out's slots, even with an earlier attempt killed with its
    session): waiting for a slot. Held with an attempt started since: training, until the attempt
    records its end (it failed, and that runner trains it no more)."""
    folder = RunFolder(tmp_path / "admin" / "seed1")
    assert folder.trainer() is None and not folder.path.exists()
    folder.lock().close()
    assert folder.trainer() is None
    killed = datetime.datetime.now() - datetime.timedelta(hours=3)
    folder.record_start(killed, "a CPU")  # no attempts.jsonl line: killed with its session
    lock = folder.lock()
    assert folder.trainer() == "waiting for a slot"
    started = datetime.datetime.now()
    folder.record_start(started, "a CPU")
    assert folder.trainer() == "training"
    folder.record_attempt(started, 5.0, 1)
    assert folder.trainer() is None
    lock.close()


def test_status_and_report_only_are_refused_together(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.en.gz").touch()
    with pytest.raises(SystemExit):
        quality.parse_args(["--data", str(data), "--status", "--report-only"])
    message = "--status: not with --report-only (--status shows the runs' states and reports nothing)"
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(message)
