"""A result JSON, written and read in one place: what a benchmark or a study measured, after its
header (HEADER: the command that wrote it, the machine, the date, the commit, torch's version),
written whole or not at all (a reader, or a study that skips what exists, never finds half a file)."""

import datetime
import json
import os
import shlex
import sys
from importlib import metadata
from pathlib import Path

from common.host import host
from common.repo import commit, repo_relative

HEADER = ("command", "machine", "date", "commit", "torch")


def header(script, argv=None, machine=None):
    """HEADER for *script* run with *argv* (None: this process's) on *machine* (None: this one, by
    common.host; a report names the machines its runs trained on). The command names the script,
    and any path inside the checkout, from the checkout's root: it runs in any clone. torch's
    version is the installed one's, read without importing torch."""
    argv = [str(word) for word in (sys.argv[1:] if argv is None else argv)]
    named = [repo_relative(word) if os.path.isabs(word) else word for word in argv]  # absolute: outside
    argv = [word if os.path.isabs(name) else name for word, name in zip(argv, named)]
    command, machine = shlex.join(["python", repo_relative(script), *argv]), host() if machine is None else machine
    return dict(zip(HEADER, (command, machine, datetime.date.today().isoformat(), commit(), metadata.version("torch"))))


def write_result(path, script, argv, machine=None, **fields):
    """The result at *path*: what it measured (a "what" field) first, then ``header``, then *fields*."""
    what = {"what": fields.pop("what")} if "what" in fields else {}
    write_json(path, {**what, **header(script, argv, machine), **fields})


def write_json(path, data):
    """*data* as JSON at *path* (its folder made), whole: written beside it, then renamed over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(partial, path)


def read_result(path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def measured(result: dict) -> dict:
    """*result* without its header, as a record that holds it keeps it (a study's run, its dropout gap)."""
    return {key: value for key, value in result.items() if key not in HEADER}
