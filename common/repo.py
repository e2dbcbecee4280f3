"""What every benchmark takes from this checkout: where the repository, the plugin and the virtual
environment are, and the named variants (fairseq_realformer/variants.py, read as a file: importing
the package would import fairseq, and speed.py's memory probes measure from before that)."""

import os
import runpy
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
USER_DIR = REPO / "fairseq_realformer"
VENV = Path(os.environ.get("REALFORMER_VENV", REPO / ".venv"))
# where trainings keep their run folders: REALFORMER_RUNS, a folder that a fresh checkout keeps (a
# study outlasts a session, and a checkout can be laid anew between sessions), else the checkout's runs/
RUNS = Path(os.path.abspath(os.path.expanduser(os.environ.get("REALFORMER_RUNS") or REPO / "runs")))
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"  # the default --data
_variants = runpy.run_path(str(USER_DIR / "variants.py"))
VARIANTS, parse_variants = _variants["VARIANTS"], _variants["parse"]
STOCK = {"fairseq": "transformer"}  # variants that are fairseq's own architectures (no plugin flags)


def quiet_logging():
    """The root logger at WARNING, as Python leaves it: `import fairseq` sets it to DEBUG (a speech
    task of fairseq's calls basicConfig), and then every library's chatter reaches the output
    (inductor's file locks, hundreds of lines a compile; sacrebleu's every resampling)."""
    import logging

    logging.getLogger().setLevel(logging.WARNING)


def import_fairseq_quietly():
    """Import fairseq and this checkout's plugin, then ``quiet_logging``."""
    import fairseq_realformer  # noqa: F401  (imports fairseq)

    quiet_logging()


def commit():
    """The checkout's commit (None outside a git checkout)."""
    import subprocess

    git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return git.stdout.strip() or None


def header(script, argv, machine):
    """What every result JSON opens with: the command that wrote it (``python SCRIPT ARGV``, the
    script and any path inside the checkout named from its root), the machine, the date and the
    commit."""
    import datetime
    import shlex

    # a path inside the checkout (or REALFORMER_RUNS, its runs/) as the checkout names it: the
    # command runs in any clone, and names no machine's folder
    argv = [repo_relative(a) if os.path.isabs(a) and _inside(a) else a for a in map(str, argv)]
    return {
        "command": shlex.join(["python", repo_relative(script), *argv]),
        "machine": machine,
        "date": datetime.date.today().isoformat(),
        "commit": commit(),
    }


def write_result(path, script, argv, device, machine, **content):
    """A benchmark's JSON at *path*: header() for *script* (its file), the device and torch's
    version, then *content* (settings, runs, ...)."""
    import json

    import torch

    result = {**header(script, argv, machine), "device": device, "torch": torch.__version__, **content}
    Path(path).write_text(json.dumps(result, indent=1))


def _inside(path) -> bool:
    path = Path(path).resolve()
    return path.is_relative_to(REPO) or path.is_relative_to(RUNS.resolve())


def repo_relative(path) -> str:
    """*path* as the repository's files name it: relative to it, a run folder under REALFORMER_RUNS
    as runs/NAME (which ``work_folder`` takes back there), or absolute when outside both."""
    path = Path(path).resolve()
    if path.is_relative_to(RUNS.resolve()):
        return str(Path("runs") / path.relative_to(RUNS.resolve()))
    return str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)


def work_folder(path) -> Path:
    """The folder a tool's --out *path* names, absolute: the checkout's runs/NAME (typed as
    ``runs/NAME`` from the checkout's root, as the committed results' commands name it) is
    REALFORMER_RUNS/NAME when that is set; any other path as given."""
    path = Path(os.path.abspath(os.path.expanduser(path)))
    inside = path.relative_to(REPO / "runs") if path.is_relative_to(REPO / "runs") else None
    return RUNS / inside if inside is not None else path
