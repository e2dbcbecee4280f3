"""Training a study's runs N at a time, each in its own session under its folder's lock, watched
for divergence (each epoch said in --status's words), then (--dropout-gap) its checkpoints scored
with dropout off and on; all stopped on SIGINT or SIGTERM (the same command resumes). Studies
started side by side into one --out share its N slots."""

import datetime
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from common import commands
from common.host import cpu_model
from common.repo import VENV
from studies import recipe, status
from studies.runs import RunFolder, try_lock

WATCH_S = 10  # how often a training's log is read for a divergence
SLOT_WAIT_S = 10  # how often a run waiting for one of --out's N slots tries again
DROPOUT_GAP = Path(__file__).resolve().parent / "dropout_gap.py"


def say(text):
    print(f"[quality {time.strftime('%H:%M:%S')}] {text}", flush=True)


def run_all(study, data_dir, previous=None, on_finished=None):
    """Every run of Study.plan, --jobs at a time, each queued as soon as the record decides it; the
    runs *previous* holds are not trained again. *on_finished*(record) each time runs finish."""
    runner = Runner(study, data_dir)
    signal.signal(signal.SIGINT, runner.stop)
    signal.signal(signal.SIGTERM, runner.stop)
    queued, errors, pending = set(), [], set()
    with ThreadPoolExecutor(max_workers=study.jobs) as pool:
        record = study.record(previous)
        while True:
            for config, seed in study.plan(record):  # what the record decides now, once each
                known = previous is not None and previous.run(config.variant, config.lr, seed) is not None
                if not known and (config.label, seed) not in queued:
                    queued.add((config.label, seed))
                    pending.add(pool.submit(runner.run, config, seed))
            if not pending:
                break
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            errors += [future.result() for future in done if future.result()]
            record = study.record(previous)  # once a round: it reads every run folder
            if on_finished is not None and not runner.stopping and any(not f.result() for f in done):
                on_finished(record)
    if runner.stopping:
        raise SystemExit(130)
    if errors:  # every run that could not train, one line each: the others trained meanwhile
        raise SystemExit("\n".join(f"quality.py: error: {error}" for error in errors))


class Runner:
    """Runs the recipe for (config, seed) pairs; stops them all on SIGINT/SIGTERM."""

    def __init__(self, study, data_dir):
        self.study, self.data_dir = study, data_dir
        self.running, self.lock, self.stopping, self.locks = set(), threading.Lock(), False, []

    def run(self, config, seed):
        """Train one run, then (--dropout-gap) score its checkpoints; None, or what went wrong."""
        folder = RunFolder(self.study.run_folder(config, seed))
        error = None if folder.finished() else self.train(folder, config, seed)
        if error is None and self.study.dropout_gap and not self.stopping:
            error = record_dropout_gap(folder, self.study.jobs)
        return error

    def train(self, folder, config, seed):
        """Train (or resume) one run; None when it finished or diverged, else what went wrong."""
        name = status.run_name(config, seed)
        lock = folder.lock()  # held until this process ends: one trainer per run folder
        if lock is None:
            return f"{folder.path} is being trained by another process (it holds {folder.lock_file})"
        self.locks.append(lock)
        folder.link_data(self.data_dir)
        cmd = recipe.command(self.study, self.data_dir, config, seed, folder.path)
        if not folder.keep_command(cmd[2:]):  # a run resumes only with the flags it started with
            return f"{folder.path} was started with other settings ({folder.command_file}): choose another --out"
        env = dict(os.environ, **recipe.environment(self.study, config.variant))
        slot = self.take_slot(name)
        if slot is None:
            return "stopped"
        with slot:
            with self.lock:
                if self.stopping:  # a stop came while this run was queued: nothing starts, nothing is recorded
                    return "stopped"
                started = datetime.datetime.now()
                folder.record_start(started, cpu_model())  # before it starts: a killed attempt writes nothing after
                say(f"start {name}: {folder.path}")
                process = commands.Process(cmd, folder.recipe_log, env=env, append=True, new_session=True, name=name)
                self.running.add(process)
            returncode, where = self.wait_watching(process, folder, name)
            with self.lock:
                self.running.discard(process)
        folder.record_attempt(started, process.seconds, returncode)
        if where is not None:  # stopped there, recorded, not retried
            folder.record_divergence(where)
            say(f"{name} diverged at update {where['update']}: {where['reason']}; stopped")
            return None
        if returncode != 0:
            return "stopped" if self.stopping else process.failure()
        say(f"done {name} in {process.seconds:.0f} s")
        return None

    def take_slot(self, name):
        """One of --out's --jobs slots (a locked file in OUT/slots, shared by the studies training
        there), held while the run trains; None if a stop comes first."""
        slots = self.study.out / "slots"
        slots.mkdir(parents=True, exist_ok=True)
        said = False
        while not self.stopping:
            for number in range(self.study.jobs):
                if handle := try_lock(slots / str(number)):
                    return handle
            if not said:
                say(f"{name} waits: {self.study.jobs} runs train in {self.study.out} (another study trains there)")
                said = True
            time.sleep(SLOT_WAIT_S)
        return None

    def wait_watching(self, process, folder, name):
        """Wait for the recipe, reading its log every WATCH_S seconds: stopped at once if it diverges,
        each epoch said as --status says it. Its exit status and where it diverged."""
        said = folder.progress().epochs  # a resumed run's epochs so far were said by the attempts before
        per_epoch = recipe.counted_updates_per_epoch(self.data_dir)
        while True:
            try:
                returncode = process.wait(timeout=WATCH_S, check=False).returncode
                break
            except subprocess.TimeoutExpired:
                if folder.divergence() is not None and not self.stopping:
                    process.stop()
                progress = folder.progress()
                if progress.epochs > said:
                    said = progress.epochs
                    say(f"{name}: {status.training_words(progress, self.study.epochs, per_epoch)}")
        return returncode, None if self.stopping else folder.divergence()

    def stop(self, signum, _frame):
        with self.lock:
            self.stopping = True
            for process in self.running:
                process.stop()  # the recipe and its fairseq-train: its session
        print(f"[quality] stopping ({signal.Signals(signum).name}); run the same command to resume", flush=True)


def record_dropout_gap(folder, jobs):
    """dropout_gap.py on a finished run's checkpoints, once (a record that exists is whole); None, or what failed."""
    if folder.dropout_gap_file.exists() or not folder.checkpoints():
        return None
    say(f"dropout gap: {folder.path}")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1") if jobs > 1 else None
    cmd = [str(VENV / "bin" / "python"), str(DROPOUT_GAP), str(folder.path), "--json", str(folder.dropout_gap_file)]
    scored = commands.run(cmd, env=env, check=False, name=f"--dropout-gap on {folder.path}")
    return None if scored.returncode == 0 else scored.failure()
