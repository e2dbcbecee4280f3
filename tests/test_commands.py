"""common/commands.py, the one way the benchmarks and studies run fairseq, its recipes and their own
scripts: a failure is one sentence naming the command and its last error line, the log is kept,
commands started side by side each report their own time, and a supervisor can wait a while and
stop a command's whole session. Small commands only: nothing trains."""

import signal
import subprocess
import sys
import time

import pytest

from common import commands


def python(code):
    return [sys.executable, "-c", code]


@pytest.mark.parametrize(
    "code, line",
    [
        ("print('epoch 1 | loss 9.1'); raise ValueError('no such data folder')", "ValueError: no such data folder"),
        # a program's own one-line error, then its usage: the error is what is named
        (
            "import sys; print('run.sh: error: --test-sets x: not found', file=sys.stderr); print('usage: ...');"
            " sys.exit(2)",
            "run.sh: error: --test-sets x: not found",
        ),
        ("import sys; print('half a line'); sys.exit(3)", "half a line"),  # no error line: its last line
    ],
)
def test_a_failing_command_is_one_sentence_naming_it_and_its_last_error_line(tmp_path, code, line):
    log = tmp_path / "logs" / "train.log"  # its folder is made
    with pytest.raises(commands.CommandFailed) as failed:
        commands.run(python(code), log)
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(f"{commands.program(python(code))} failed (exit ")
    assert message.endswith(f"): {line}; see {log}")
    assert line in log.read_text()


def test_a_command_is_named_by_its_program_and_the_script_it_runs():
    assert commands.program(["/venv/bin/fairseq-train", "data-bin", "--arch", "x"]) == "fairseq-train"
    assert commands.program(["bash", "/repo/examples/multi30k/run.sh", "--tiny"]) == "bash run.sh"
    assert commands.program(["/venv/bin/python3", "-P", "/repo/studies/gap.py", "run"]) == "python3 gap.py"
    assert commands.program(["python", "-c", "print(1)"]) == "python -c"


def test_the_log_keeps_every_run_and_each_run_reads_its_own_part(tmp_path):
    """A resumed training appends to its log: its output (and so its error line) is its own, not an
    earlier attempt's."""
    log = tmp_path / "recipe.log"
    first = commands.run(python("import sys; print('first'); sys.exit(1)"), log, check=False)
    second = commands.run(python("print('second')"), log, append=True)
    assert log.read_text() == "first\nsecond\n"
    assert (first.output, second.output) == ("first\n", "second\n")
    assert first.failure() == f"{commands.program(python(''))} failed (exit 1): first; see {log}"
    assert second.returncode == 0 and second.seconds > 0


def test_without_a_log_its_answer_is_stdout_alone():
    """A probe prints its number on stdout; whatever it says on stderr (warnings) is not the answer."""
    finished = commands.run(python("import sys; print(4096); print('a warning', file=sys.stderr)"))
    assert finished.stdout == "4096\n"
    assert "a warning" in finished.output and finished.log is None


def test_commands_side_by_side_both_finish_each_timed_to_its_own_end(tmp_path):
    started = time.monotonic()
    short, long = commands.wait_all(
        [commands.Process(["sleep", seconds], tmp_path / f"{seconds}.log") for seconds in ("0.5", "1.5")]
    )
    wall = time.monotonic() - started
    assert short.returncode == long.returncode == 0
    assert 0.5 <= short.seconds < long.seconds and long.seconds >= 1.5
    assert wall < short.seconds + long.seconds  # they ran at once
    assert short.peak_rss > 0 and long.peak_rss > 0


def test_side_by_side_a_failure_is_raised_once_all_have_ended(tmp_path):
    failing = commands.Process(python("raise SystemExit('out of memory')"), tmp_path / "a.log")
    other = commands.Process(["sleep", "0.5"], tmp_path / "b.log")
    with pytest.raises(commands.CommandFailed, match="out of memory"):
        commands.wait_all([failing, other])
    assert other.poll() and other.returncode == 0


def test_a_supervisor_waits_a_while_then_stops_the_whole_session(tmp_path):
    """The study's runner: a recipe in a session of its own, watched every few seconds, stopped with
    the fairseq-train it started."""
    log = tmp_path / "recipe.log"
    recipe = commands.Process(["bash", "-c", "sleep 30 & wait"], log, new_session=True, name="admin seed 1")
    with pytest.raises(subprocess.TimeoutExpired):
        recipe.wait(timeout=0.2)
    recipe.stop()
    finished = recipe.wait(timeout=10, check=False)
    assert finished.returncode == -signal.SIGTERM
    assert finished.failure().startswith("admin seed 1 failed (killed by SIGTERM)")
    recipe.stop()  # it has ended: nothing to stop, no error


def test_a_command_line_says_a_failure_in_one_line_without_a_traceback():
    # bad input that the command named itself: its own words, as if this program had said them
    with pytest.raises(SystemExit) as stopped:
        with commands.exit_on_failure("quality.py"):
            commands.run(
                python("raise SystemExit('run.sh: error: --test-sets x: not found')"), name="preparing the data"
            )
    assert str(stopped.value) == "quality.py: error: --test-sets x: not found"
    # anything else: which command failed, how, and its last error line
    with pytest.raises(SystemExit) as stopped:
        with commands.exit_on_failure("quality.py"):
            commands.run(python("raise MemoryError('out of memory')"), name="preparing the data")
    assert str(stopped.value) == "quality.py: error: preparing the data failed (exit 1): MemoryError: out of memory"
