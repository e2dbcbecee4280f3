"""Everything the plugin changes in fairseq: what the model needs (``model_support``, always) and
fairseq's defects fixed for every model (``fixes``, unless ``REALFORMER_FAIRSEQ_FIXES=0``), both
through ``patching``. May import every part of the plugin: it is what the package installs last.
"""

# The fixes are imported first, then the model's changes, as the package always has.
# isort: off
from . import fixes, model_support
# isort: on


def install() -> None:
    """Install the model's changes, then the fixes (``fixes.install`` leaves them out when
    ``REALFORMER_FAIRSEQ_FIXES=0``); a second import of the plugin changes nothing."""
    model_support.install()
    fixes.install()
