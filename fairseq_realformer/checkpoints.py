"""Load fairseq checkpoints with ``torch.load(weights_only=True)`` protection kept on.

Since torch 2.6, ``torch.load`` unpickles only tensors and plain containers unless told otherwise,
and every fairseq load (fairseq-generate, fairseq-interactive, ``--restore-file``, the hub API)
fails on the ``argparse.Namespace`` that fairseq stores with the model. Instead of turning the
protection off (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``), the plugin allows exactly the globals
fairseq checkpoints contain, only while a checkpoint is loaded: ``guarded`` wraps a loader
(``fairseq_patches`` wraps fairseq's with it), ``read_checkpoint`` is the loader of our own
scripts. Anything else is refused with a message that names the global and says how a user who
trusts the file opts in.
"""
import argparse
import functools
import importlib
import os
import pickle
from typing import Callable, List

import numpy
import torch

from .errors import RealformerConfigError

ALLOW_ENV = "REALFORMER_ALLOW_GLOBALS"


class UntrustedCheckpointError(RealformerConfigError, pickle.UnpicklingError):
    """A checkpoint holds a global that fairseq checkpoints do not contain."""


def _numpy_globals() -> List[object]:
    # Metrics (e.g. --eval-bleu's n-gram counts) reach the checkpoint as numpy scalars/arrays.
    try:
        from numpy._core import multiarray  # numpy >= 2
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core import multiarray
    allowed = [multiarray._reconstruct, multiarray.scalar, numpy.ndarray, numpy.dtype]
    for name in ("int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64", "bool_"):
        allowed.append(type(numpy.dtype(name)))  # numpy.dtypes.Int64DType, ...
    return allowed


def _user_allowed_globals() -> List[object]:
    """Globals the user opted into with REALFORMER_ALLOW_GLOBALS=module.Name[,module.Name]."""
    allowed = []
    for spec in filter(None, (s.strip() for s in os.environ.get(ALLOW_ENV, "").split(","))):
        module_name, _, attr = spec.rpartition(".")
        try:
            obj = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError, ValueError) as e:
            raise RealformerConfigError(f"{ALLOW_ENV}: cannot import {spec!r} ({e})") from None
        allowed.append(obj)
    return allowed


def allowed_globals() -> List[object]:
    """Everything a fairseq checkpoint may contain beyond what torch allows by default."""
    return [argparse.Namespace, *_numpy_globals(), *_user_allowed_globals()]


def _refusal(path, error: Exception) -> RealformerConfigError:
    """Why *path* was not loaded: not a torch checkpoint at all, or which globals it holds."""
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # not a zip archive: a text file, a truncated or legacy-format file, ...
        return RealformerConfigError(f"{path} is not a readable torch checkpoint ({type(error).__name__})")
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in allowed_globals()}
    unknown = [g for g in found if g not in allowed]
    if not unknown:
        return RealformerConfigError(f"checkpoint {path} could not be unpickled safely: {str(error).splitlines()[0]}")
    return UntrustedCheckpointError(
        f"checkpoint {path} contains {', '.join(unknown)}, which fairseq checkpoints do not contain, "
        f"so it was not loaded (torch.load weights_only=True). If you trust this file, allow exactly "
        f"that: {ALLOW_ENV}={','.join(unknown)}, or load it without protection with "
        f"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1."
    )


def guarded(load: Callable) -> Callable:
    """Wrap a loader whose first argument is a checkpoint path."""

    @functools.wraps(load)
    def load_with_allowed_globals(path, *args, **kwargs):
        with torch.serialization.safe_globals(allowed_globals()):
            try:
                return load(path, *args, **kwargs)
            except pickle.UnpicklingError as e:
                if isinstance(e, RealformerConfigError):
                    raise
                raise _refusal(path, e) from None

    return load_with_allowed_globals


@guarded
def read_checkpoint(path, map_location="cpu"):
    """``torch.load`` a fairseq checkpoint file as fairseq would, safely (for our own scripts)."""
    with open(path, "rb") as f:
        return torch.load(f, map_location=map_location)
