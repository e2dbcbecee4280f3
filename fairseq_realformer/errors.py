"""Errors that a user fixes on the command line, shown as one line instead of a traceback (the
hook that prints them is installed by ``fairseq_patches``)."""


class RealformerConfigError(ValueError):
    """An impossible or unsupported combination of flags, or unusable input named by the message."""
