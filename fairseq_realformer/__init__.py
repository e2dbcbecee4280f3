"""RealFormer residual attention and ADMIN deep Transformers as a fairseq ``--user-dir`` plugin.

Importing the package registers what fairseq looks up by name (the ``realformer`` model and its
architectures), makes fairseq checkpoints load under ``torch.load(weights_only=True)``, and fixes
fairseq defects that would silently change results (``fairseq_fixes``).
"""
from . import checkpoints, errors, fairseq_fixes  # noqa: F401  (installed on import)
from . import models  # noqa: F401  (registers the model and architectures)

__version__ = "0.1.0"
