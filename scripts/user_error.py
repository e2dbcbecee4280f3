"""The one error type of the scripts in this folder: a mistake in the arguments or files, which a
script reports as one line (``PROG: error: ...``, exit status 2) instead of a traceback.

The scripts import it as a sibling module (Python puts a script's own folder first on its path);
it stays outside the package so that importing it does not import fairseq.
"""


class UserError(Exception):
    """A mistake in the arguments or files, reported as one line."""
