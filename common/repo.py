"""What every benchmark takes from this checkout: where the repository, the plugin and the virtual
environment are, and the named variants (fairseq_realformer/variants.py, read as a file: importing
the package would import fairseq, and speed.py's memory probes measure from before that)."""

import os
import runpy
from pathlib import Path

from common import commands

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
    return commands.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], check=False).stdout.strip() or None


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
