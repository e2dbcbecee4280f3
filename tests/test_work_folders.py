"""Trainings that outlive a checkout (issue 100): every tool that trains keeps its work folders under
REALFORMER_RUNS, so a study stopped in one clone resumes in a fresh one, and ends where an
uninterrupted run ends; on a CPU each training gets glibc's allocator settings (common/allocator.py),
all three or none, and trains exactly as without them; and a run names the generation of each
processor it trained on."""

import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from common import allocator, fairseq_log, host, repo, results
from studies.runs import RunFolder

from .cli import clean_env, popen, run
from .helpers import REPO
from .test_fast_update import TRAIN, assert_same_training, checkpoint

MULTI30K = Path(REPO).parent / "shared" / "data" / "multi30k"
RUN_SECONDS = 120  # on 2 busy cores: two --quick studies of 4 epochs side by side, two tiny trainings
MALLOC = tuple(allocator.SETTINGS)


# --- REALFORMER_RUNS -------------------------------------------------------------------------------


def test_runs_named_from_the_checkout_go_under_realformer_runs_and_are_recorded_as_runs(monkeypatch, tmp_path):
    """`--out runs/NAME`, as the committed JSONs' commands name it, is REALFORMER_RUNS/NAME; a result's
    command names a folder there as runs/NAME again (no machine's path), and any other path as given."""
    monkeypatch.setattr(repo, "RUNS", tmp_path / "kept")
    assert repo.work_folder(Path(REPO) / "runs" / "depth-18") == tmp_path / "kept" / "depth-18"
    monkeypatch.chdir(REPO)
    assert repo.work_folder("runs/depth-18") == tmp_path / "kept" / "depth-18"
    assert repo.work_folder(tmp_path / "elsewhere") == tmp_path / "elsewhere"
    argv = ["--out", str(tmp_path / "kept" / "depth-18"), "--data", str(tmp_path / "data")]
    command = results.header(Path(REPO) / "studies" / "quality.py", argv, "m")["command"]
    assert command == f"python studies/quality.py --out runs/depth-18 --data {tmp_path / 'data'}"


def fresh_clone(dest: Path) -> Path:
    """A fresh checkout of this one at *dest*: the files git lists (committed or not, never ignored
    ones: no runs/, no .venv), as a clone of its commit would hold them."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"], capture_output=True
    )
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.decode().strip()}")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = Path(REPO) / name
        if source.is_file():  # (a file deleted but not yet committed is listed too)
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def training_environment(run_dir: Path, found: dict, stop: threading.Event):
    """Until *stop*: the environment of the first fairseq-train that trains *run_dir*, into *found*."""
    while not stop.is_set() and not found:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if any(part.endswith(b"fairseq-train") for part in cmdline) and str(run_dir).encode() in b" ".join(
                    cmdline
                ):
                    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                    found.update(entry.decode().split("=", 1) for entry in environ if b"=" in entry)
            except OSError:  # it ended meanwhile
                continue
        time.sleep(0.02)


@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"Multi30k data not found at {MULTI30K}")
def test_a_study_stopped_in_one_clone_ends_in_a_fresh_one_as_an_uninterrupted_run(tmp_path):
    """A --quick study of 4 epochs into `--out runs/resume` with REALFORMER_RUNS set: stopped once
    it has saved its second epoch's checkpoint, its clone deleted, the same command in a fresh clone
    resumes it from that checkpoint and ends at epoch 4 with the validation losses, epoch by epoch,
    of the same study trained without a stop. Its fairseq-train ran with the allocator settings."""
    flags = ["--data", MULTI30K, "--quick", "--epochs", "4", "--variants", "pre-ln", "--test-sets", "test_2016_flickr"]
    flags += ["--out", "runs/resume", "--machine", "m"]

    def study(clone, runs):  # typed in the clone's root, as the committed commands are
        env = {"REALFORMER_RUNS": str(runs), "REALFORMER_VENV": sys.prefix}
        return popen(Path("studies") / "quality.py", *flags, cwd=clone, env=env)

    uninterrupted = study(fresh_clone(tmp_path / "clone-a"), tmp_path / "runs-a")

    runs = tmp_path / "runs-b"
    run_dir = runs / "resume" / "pre-ln-epochs4" / "seed1"
    first = study(fresh_clone(tmp_path / "clone-1"), runs)
    found, stop = {}, threading.Event()
    watcher = threading.Thread(target=training_environment, args=(run_dir, found, stop), daemon=True)
    watcher.start()
    # fairseq logs "Saved checkpoint" once the checkpoint is written in full; on a loaded machine the
    # data and the first epochs take minutes (a fixed 2 minutes stopped it before it trained)
    deadline, saved = time.monotonic() + 900, None
    while not saved and first.poll() is None and time.monotonic() < deadline:
        log = (run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else ""
        saved = re.search(r"Saved checkpoint .*checkpoint2\.pt", log)
        time.sleep(0.02)
    assert saved, f"no checkpoint2.pt saved: {first.poll()=}, after {900 - (deadline - time.monotonic()):.0f} s"
    first.send_signal(signal.SIGTERM)
    stopped = first.communicate(timeout=120)[0]
    stop.set()
    assert first.returncode == 130 and "run the same command to resume" in stopped, stopped
    assert not RunFolder(run_dir).finished() and not (run_dir / "checkpoints" / "train.done").exists()
    assert {name: found.get(name) for name in MALLOC} == allocator.SETTINGS, "the training ran without them"
    shutil.rmtree(tmp_path / "clone-1")

    resumed = study(fresh_clone(tmp_path / "clone-2"), runs)
    outputs = [process.communicate(timeout=600)[0] for process in (resumed, uninterrupted)]
    assert resumed.returncode == 0 and uninterrupted.returncode == 0, outputs
    assert "start pre-ln seed 1" in outputs[0]  # trained again, from its checkpoint
    log = (run_dir / "train.log").read_text()
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch [23] @ \d+ updates\)", log), log[-3000:]
    after, before = RunFolder(run_dir).summary(), RunFolder(tmp_path / "runs-a" / run_dir.relative_to(runs)).summary()
    assert after["epochs"] == before["epochs"] == 4 and after["attempts"] == 2
    assert after["valid_curve"] == before["valid_curve"] and after["updates"] == before["updates"]
    assert not (tmp_path / "clone-2" / "runs").exists()  # nothing went into the checkout


# --- glibc's allocator settings --------------------------------------------------------------------


def test_the_allocator_settings_come_all_three_or_none():
    """Any one of them alone turns off glibc's dynamic mmap threshold (the trim threshold alone
    halves the speed): a training gets all three, a setting the user made kept as made, or, with
    REALFORMER_MALLOC=off, none of its own. run.sh exports what `python common/allocator.py` prints."""
    assert allocator.settings({}) == allocator.SETTINGS
    mine = allocator.settings({"MALLOC_TOP_PAD_": "4096"})
    assert set(mine) == set(MALLOC) and mine["MALLOC_TOP_PAD_"] == "4096"
    assert allocator.settings({"REALFORMER_MALLOC": "off", "MALLOC_TOP_PAD_": "4096"}) == {}
    assert allocator.environment({"REALFORMER_MALLOC": "off", "A": "1"}, cpu=True) == {
        "REALFORMER_MALLOC": "off",
        "A": "1",
    }
    env = {k: v for k, v in clean_env().items() if k not in MALLOC}
    printed = run(Path(REPO) / "common" / "allocator.py", env=env).stdout.split()
    expected = [] if torch.cuda.is_available() else [f"{k}={v}" for k, v in allocator.SETTINGS.items()]
    assert printed == expected
    assert run(Path(REPO) / "common" / "allocator.py", env={**env, "REALFORMER_MALLOC": "off"}).stdout == ""


def test_a_training_with_the_allocator_settings_trains_exactly_as_without(tmp_path):
    """The same tiny fairseq-train, with glibc's defaults and with the three settings: the same
    logged losses, and the same parameters and optimizer state bit for bit."""
    without = {k: v for k, v in clean_env().items() if k not in MALLOC}
    logs = {}
    for name, env in (("without", without), ("with", allocator.environment(without, cpu=True))):
        assert sum(k in env for k in MALLOC) == (3 if name == "with" else 0)
        result = subprocess.run(
            [str(Path(sys.executable).parent / "fairseq-train"), *map(str, TRAIN), "--save-dir", str(tmp_path / name)]
            + ["--max-update", "31"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        records = fairseq_log.records(result.stdout.splitlines(), "train_inner", "train", "valid")
        logs[name] = [(kind, fields["loss"], fields.get("nll_loss"), fields.get("gnorm")) for kind, fields in records]
    assert logs["with"] == logs["without"] and len(logs["with"]) >= 5
    assert_same_training(checkpoint(tmp_path / "with"), checkpoint(tmp_path / "without"))


# --- which processor ------------------------------------------------------------------------------

ZEN4 = {"model name": "AMD EPYC", "cpu family": "25", "model": "17", "flags": "fpu sse2 avx2 avx512f avx512bw"}
AVX2_EPYC = {"model name": "AMD EPYC", "cpu family": "23", "model": "49", "flags": "fpu sse2 avx avx2"}


def test_a_processor_is_named_by_its_generation_not_its_marketing_name():
    """Both of the project's CPUs call themselves "AMD EPYC"; a run's record tells them apart."""
    assert host.generation(ZEN4) == "family 25 model 17, AVX-512"
    assert host.generation(AVX2_EPYC) == "family 23 model 49, AVX2"
    assert host.generation({}) == ""
    assert host.cpu_model().startswith(host._cpuinfo().get("model name", ""))
    assert host.host().endswith(f", {os.cpu_count()} cores")


def test_a_run_keys_its_wall_time_by_the_processor_it_recorded(tmp_path):
    """machines.jsonl holds cpu_model() of each attempt; wall_s_by_cpu is keyed by it."""
    folder = RunFolder(tmp_path / "run")
    folder.path.mkdir()
    started = datetime.datetime(2026, 12, 5, 14, 0, 0)
    folder.record_start(started, host.cpu_model())
    folder.record_attempt(started, 12.5, 0)
    assert folder.summary()["wall_s_by_cpu"] == {host.cpu_model(): 12.5}
    assert json.loads((folder / "machines.jsonl").read_text())["cpu"] == host.cpu_model()
