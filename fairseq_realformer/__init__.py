"""RealFormer residual attention and ADMIN deep Transformers as a fairseq ``--user-dir`` plugin.

Importing the package registers what fairseq looks up by name (the ``realformer`` model and its
architectures), makes fairseq checkpoints load under ``torch.load(weights_only=True)``, sets
ADMIN's ω from data at the start of fairseq-train (``training``), and fixes fairseq defects that
would silently change results (``fairseq_fixes``).
"""
from . import checkpoints, errors, fairseq_fixes, training  # noqa: F401  (installed on import)
from . import models  # noqa: F401  (registers the model and architectures)

__version__ = "0.1.0"
