"""RealFormer residual attention and ADMIN deep Transformers as a fairseq ``--user-dir`` plugin.

Importing the package registers what fairseq looks up by name (the ``realformer`` model and its
architectures), installs what the model needs from fairseq (``fairseq_patches``: checkpoints load
under ``torch.load(weights_only=True)``, ADMIN's ω are set from data in fairseq-train), and the
fixes of fairseq's own defects for every model (``fairseq_fixes``: a batching defect that drops
sentences, missing checkpoints named, half precision without a GPU, ``--bf16`` as mixed
precision, one-line errors, ...), which ``REALFORMER_FAIRSEQ_FIXES=0`` leaves out.
"""

from . import fairseq_fixes, fairseq_patches, models, radam  # noqa: F401  (models and radam register with fairseq)

fairseq_patches.install()
fairseq_fixes.install()

__version__ = "0.1.0"
