"""RealFormer residual attention and ADMIN deep Transformers as a fairseq ``--user-dir`` plugin.

Importing the package registers what fairseq looks up by name (the ``realformer`` model and its
architectures, ``--optimizer radam``) and installs ``patches``: what the model needs from fairseq
(``patches/model_support.py``: checkpoints load under ``torch.load(weights_only=True)``, ADMIN's ω
are set from data in fairseq-train), and the fixes of fairseq's own defects for every model
(``patches/fixes/``: a batching defect that drops sentences, missing checkpoints named, half
precision without a GPU, ``--bf16`` as mixed precision, one-line errors, ...), which
``REALFORMER_FAIRSEQ_FIXES=0`` leaves out.

The root holds what a command line reaches (``options``, ``variants``, ``errors``, ``user_dir``);
the rest lives in a subpackage named for its concern: ``models``, ``modules``, ``optim``,
``files``, ``patches`` and ``analysis`` (the ``realformer-analyze`` command).
"""

# isort: off
from . import patches, models  # noqa: F401  (models registers the model and its archs with fairseq)
from .optim import radam  # noqa: F401  (registers --optimizer radam with fairseq)
# isort: on

patches.install()

__version__ = "0.1.0"
