"""RealFormer residual attention and ADMIN deep Transformers as a fairseq ``--user-dir`` plugin.

Importing the package registers what fairseq looks up by name (the ``realformer`` model and its
architectures) and installs the plugin's changes to fairseq (``fairseq_patches``: checkpoints load
under ``torch.load(weights_only=True)``, ADMIN's ω are set from data in fairseq-train, a batching
defect that drops sentences is fixed, flag errors are one line).
"""
from . import fairseq_patches, models, radam  # noqa: F401  (models and radam register with fairseq)

fairseq_patches.install()

__version__ = "0.1.0"
