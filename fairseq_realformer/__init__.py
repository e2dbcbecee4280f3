"""RealFormer residual attention and ADMIN deep Transformers as a fairseq ``--user-dir`` plugin.

Importing the package registers what fairseq looks up by name: the ``realformer`` model and its
architectures, and the safe loading of fairseq checkpoints under ``torch.load(weights_only=True)``.
"""
from . import checkpoints, errors  # noqa: F401  (install the checkpoint allow-list, CLI errors)
from . import models  # noqa: F401  (registers the model and architectures)

__version__ = "0.1.0"
