"""What every benchmark takes from this checkout: where the repository, the plugin and the virtual
environment are, and the named variants (fairseq_realformer/variants.py, read as a file: importing
the package would import fairseq, and speed.py's memory probes measure from before that)."""

import os
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
USER_DIR = REPO / "fairseq_realformer"
VENV = Path(os.environ.get("REALFORMER_VENV", REPO / ".venv"))
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

    # a path inside the checkout as the checkout names it: the command runs in any clone
    argv = [repo_relative(a) if os.path.isabs(a) and Path(a).is_relative_to(REPO) else a for a in map(str, argv)]
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


def repo_relative(path) -> str:
    """*path* as the repository's files name it (relative to it), or absolute when outside it."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)


if str(REPO) not in sys.path:  # the plugin of this checkout, also when it is not installed
    sys.path.insert(0, str(REPO))
