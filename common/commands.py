"""Running a command (fairseq-train, fairseq-generate, a recipe, a script of the harness), one way for
every benchmark and study: its output kept in its log, its time and peak memory measured, and a
failure said in one sentence that names it and its last error line. ``run`` runs one to its end;
``Process`` starts one (side by side with others, or for a supervisor to watch and stop)."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLL_S = 0.05  # how often a timed wait looks whether a command has ended (side by side: its time to that)
# the lines that say what went wrong: a program's own one-line error ("run.sh: error: ...", argparse's
# "prog: error: ..."), or the last line of a Python traceback ("FloatingPointError: ...")
ERROR_LINE = re.compile(r"^(\S+: error: |(\w+\.)*\w*(Error|Exception|Interrupt)\b)")
OWN_ERROR = re.compile(r"^\S+: error: ")  # a program's own: the user's input named, no traceback behind it


def last_error(output: str) -> str:
    """The last error line (ERROR_LINE) of *output*, else its last line; at most 300 characters."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return ([line for line in lines if ERROR_LINE.match(line)] or lines or ["(no output)"])[-1][:300]


def program(command) -> str:
    """How a message names *command*: its program, and the script an interpreter runs ("bash run.sh",
    "python dropout_gap.py", "python -c")."""
    name = Path(command[0]).name
    script = next((word for word in command[1:] if word == "-c" or not word.startswith("-")), None)
    interpreted = script is not None and (name in ("bash", "sh") or name.startswith("python"))
    return f"{name} {Path(script).name}" if interpreted else name


class CommandFailed(RuntimeError):
    """A command that failed: Process.failure's sentence; *own*, the program's own one-line error
    ("run.sh: error: X not found (--test-sets)" gives "X not found (--test-sets)"), where it said one."""

    def __init__(self, sentence, own=None):
        super().__init__(sentence)
        self.own = own


class Process:
    """A command, started: its stdout and stderr into *log* (appended with *append*; without a log,
    apart in memory), in *cwd* with *env*; with *new_session*, in a session of its own, under this
    process's niceness, that ``stop`` ends whole (a recipe and its fairseq-train). Once it has ended
    (``poll``, ``wait``), what it left: ``returncode`` (negative: the signal), ``seconds``, ``peak_rss``
    (bytes, ru_maxrss), ``output`` (this run's part of its log) and ``stdout`` (a probe's answer)."""

    returncode = seconds = peak_rss = output = stdout = None

    def __init__(self, command, log=None, *, env=None, cwd=None, append=False, new_session=False, name=None):
        command = [str(word) for word in command]
        self.name, self.new_session, self.log = name or program(command), new_session, log  # name: for messages
        if log is not None:
            Path(log).parent.mkdir(parents=True, exist_ok=True)
        self._files = [open(log, "a+b" if append else "w+b")] if log else [tempfile.TemporaryFile() for _ in range(2)]
        self._from = self._files[0].tell()  # appended: this run's output starts here
        stderr = self._files[1] if len(self._files) > 1 else subprocess.STDOUT
        self.started = time.monotonic()
        self._popen = subprocess.Popen(
            command, stdout=self._files[0], stderr=stderr, env=env, cwd=cwd, start_new_session=new_session
        )
        self.pid = self._popen.pid
        if new_session:
            # under this process's niceness: with Linux's autogroups (sched_autogroup_enabled) nice ranks
            # processes only inside a session, and each session competes with the others at its own
            # autogroup nice (0), so a command started under `nice -n 19` would not yield
            with contextlib.suppress(OSError):  # no autogroups: nothing to do
                Path(f"/proc/{self.pid}/autogroup").write_text(f"{os.nice(0)}\n")

    def poll(self, block=False) -> bool:
        """Whether it has ended (with *block*, once it has); what it left is read then."""
        if self.returncode is None:
            pid, status, usage = os.wait4(self.pid, 0 if block else os.WNOHANG)  # wait4: its rusage, for its peak
            if pid == 0:
                return False
            self.seconds, self.peak_rss = time.monotonic() - self.started, usage.ru_maxrss * 1024
            texts = []
            for file, start in zip(self._files, (self._from, 0)):
                file.seek(start)
                texts.append(file.read().decode(errors="replace"))
                file.close()
            self.output, self.stdout = "".join(texts), texts[0]
            self.returncode = self._popen.returncode = os.waitstatus_to_exitcode(status)  # Popen: not to wait again
        return True

    def wait(self, timeout=None, check=True):
        """Itself, once it has ended (subprocess.TimeoutExpired after *timeout* seconds, if given); with
        *check*, CommandFailed if it failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.poll(block=timeout is None):
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self._popen.args, timeout)
            time.sleep(POLL_S)
        if check and self.returncode != 0:
            own = last_error(self.output)
            own = own.split(": error: ", 1)[1] if OWN_ERROR.match(own) else None
            raise CommandFailed(self.failure(), own)
        return self

    def failure(self) -> str:
        """The one sentence that says it failed, how, its last error line and where its log is."""
        how = f"killed by {signal.Signals(-self.returncode).name}" if self.returncode < 0 else f"exit {self.returncode}"
        return f"{self.name} failed ({how}): {last_error(self.output)}" + (f"; see {self.log}" if self.log else "")

    def stop(self, sig=signal.SIGTERM):
        """Send it *sig*: to its whole session with *new_session*, else to it alone."""
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            (os.killpg if self.new_session else os.kill)(self.pid, sig)


def run(command, log=None, *, check=True, **options) -> Process:
    """*command* run to its end (Process's *options*); CommandFailed if it failed, with *check*."""
    return Process(command, log, **options).wait(check=check)


def wait_all(processes, check=True):
    """*processes* (started side by side) once all have ended, each timed to its own end; with
    *check*, CommandFailed for the first that failed."""
    while [process for process in processes if not process.poll()]:  # every one polled each round
        time.sleep(POLL_S)
    return [process.wait(check=check) for process in processes]


class InputError(Exception):
    """Bad input, said in one line (``exit_on_failure``)."""


@contextlib.contextmanager
def exit_on_failure(prog):
    """A failure inside as *prog*'s one-line error (no traceback), "PROG: error: " and then: for an
    InputError, its words (argparse's status for bad input, 2); for a failed command, its own error
    where it said one (bad input, already named: the user's to fix), else the sentence that says which
    command failed, how and where its log is."""
    try:
        yield
    except CommandFailed as failure:
        raise SystemExit(f"{prog}: error: {failure.own or failure}") from None
    except InputError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
