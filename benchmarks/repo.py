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


def import_fairseq_quietly():
    """Import fairseq and the plugin, then put the root logger back at WARNING: `import fairseq`
    leaves it at DEBUG (a speech task of fairseq's calls basicConfig), and every library's chatter
    would reach the output, torch inductor's file locks alone hundreds of lines a compile."""
    import logging

    import fairseq_realformer  # noqa: F401  (imports fairseq)

    logging.getLogger().setLevel(logging.WARNING)


def repo_relative(path) -> str:
    """*path* as the repository's files name it (relative to it), or absolute when outside it."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)


if str(REPO) not in sys.path:  # the plugin of this checkout, also when it is not installed
    sys.path.insert(0, str(REPO))
