"""What PyTorch reports of this CPU, forced for a test or for the whole suite, in the test process
and in the commands the tests start (sitecustomize.py here): a test asserts what the plugin does on
the hardware PyTorch reports, and tests both answers on any machine.

    REALFORMER_TEST_BF16_UNITS=none scripts/test.sh    # the suite as on a CPU without bf16 units
"""

import os
from pathlib import Path
from typing import Optional

from .sitecustomize import ENV, REPORTS, check, force

__all__ = ["ENV", "REPORTS", "check", "environment", "force", "forced"]

FOLDER = Path(__file__).parent


def forced() -> Optional[str]:
    """The bf16 units the suite runs with (REALFORMER_TEST_BF16_UNITS), or None: as PyTorch reports."""
    return os.environ.get(ENV) or None


def environment(units: str) -> dict:
    """The variables a command's environment needs for its Python processes to report *units*."""
    check(units)
    return {ENV: units, "PYTHONPATH": os.pathsep.join(p for p in (str(FOLDER), os.environ.get("PYTHONPATH")) if p)}
