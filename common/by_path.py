"""A command of the harness run by its path (``python studies/quality.py``, from any folder) runs
again as its checkout's module (``python -m studies.quality``): benchmarks/ and studies/ are
packages, which a file run by its path cannot import. A command's first lines import this file from
its own folder (benchmarks/by_path.py and studies/by_path.py link here), only when run so."""

import os
import sys


def again_as_module():
    """Replace this process with ``python -P -m PACKAGE.COMMAND`` and the same arguments, the checkout
    of the command first on PYTHONPATH (-P: not the package of the folder it runs in, another checkout)."""
    script = os.path.realpath(sys.argv[0])
    root = os.path.dirname(os.path.dirname(script))
    module = os.path.relpath(script, root).removesuffix(".py").replace(os.sep, ".")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    safe = ["-P"] if sys.version_info >= (3, 11) else []
    os.execve(sys.executable, [sys.executable, *safe, "-m", module, *sys.argv[1:]], env)


if __name__ == "by_path":  # imported from a command's folder by that command, run by its path
    again_as_module()
