"""Errors that a user fixes on the command line, shown as one line instead of a traceback."""
import sys


class RealformerConfigError(ValueError):
    """An impossible or unsupported combination of flags, or unusable input named by the message."""


def _excepthook(exc_type, exc, tb, _previous=sys.excepthook):
    # fairseq's CLIs let exceptions from model construction escape as deep tracebacks; for
    # mistakes the user fixes by changing a flag or a file, the message is all that helps.
    if issubclass(exc_type, RealformerConfigError):
        prog = __import__("os").path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fairseq"
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return
    _previous(exc_type, exc, tb)


sys.excepthook = _excepthook
