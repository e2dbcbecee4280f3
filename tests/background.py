"""Work that a test module needs and that can run beside its other tests. A module lists its jobs
in ``BACKGROUND``; its fixtures wait for a job's result, or run the job then if it has not started.
In one process (``-n 0``), whose tests use one thread (OMP_NUM_THREADS=1), tests/conftest.py starts
the jobs as soon as pytest knows that a test of their module will run, so that they use the second
core; under pytest-xdist, where every worker collects every module, a job starts when a test asks.
"""

import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path


class Job:
    """``fn(folder)``, once, in a thread, in a temporary folder removed at the session's end;
    its subprocesses (``popen``) are stopped then if still running."""

    def __init__(self, fn):
        self.fn = fn
        self.thread = None
        self.outcome = None
        self.folder = None
        self.processes = []

    def start(self):
        if self.thread is None:
            self.folder = Path(tempfile.mkdtemp(prefix=f"{self.fn.__name__}-"))
            self.thread = threading.Thread(target=self._run, daemon=True)
            self.thread.start()

    def _run(self):
        try:
            self.outcome = (True, self.fn(self))
        except BaseException as error:  # handed to the test that waits for it
            self.outcome = (False, error)

    def result(self):
        self.start()
        self.thread.join()
        ok, value = self.outcome
        if not ok:
            raise value
        return value

    def run(self, args, **kwargs):
        """subprocess.run, in its own process group so that ``stop`` can end it and its children."""
        process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs
        )
        self.processes.append(process)
        stdout, stderr = process.communicate()
        return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)

    def stop(self):
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
