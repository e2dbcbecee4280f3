"""Errors that a user fixes on the command line, shown as one line instead of a traceback (the
hook that prints them is installed by ``patches.fixes``)."""

import os
import sys

try:  # fairseq-hydra-train: hydra prints a CompactHydraException's message, not its traceback
    from hydra.errors import CompactHydraException as _ShownAsItsMessage
except ImportError:  # hydra comes with fairseq; without it there is no fairseq-hydra-train either
    _ShownAsItsMessage = Exception


class RealformerConfigError(ValueError, _ShownAsItsMessage):
    """An impossible or unsupported combination of flags, or unusable input named by the message."""


def prog() -> str:
    """The command being run, as the user typed it (fairseq-train, translate.py, ...), to begin
    a one-line message with."""
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c") else "python"
