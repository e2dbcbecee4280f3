"""Errors that a user fixes on the command line, shown as one line instead of a traceback (the
hook that prints them is installed by ``fairseq_patches``)."""
try:  # fairseq-hydra-train: hydra prints a CompactHydraException's message, not its traceback
    from hydra.errors import CompactHydraException as _ShownAsItsMessage
except ImportError:  # hydra comes with fairseq; without it there is no fairseq-hydra-train either
    _ShownAsItsMessage = Exception


class RealformerConfigError(ValueError, _ShownAsItsMessage):
    """An impossible or unsupported combination of flags, or unusable input named by the message."""
