"""Load fairseq checkpoints with ``torch.load(weights_only=True)`` protection kept on.

Since torch 2.6, ``torch.load`` unpickles only tensors and plain containers unless told otherwise,
and every fairseq load (fairseq-generate, fairseq-interactive, ``--restore-file``, the hub API)
fails on the ``argparse.Namespace`` that fairseq stores with the model. Instead of turning the
protection off (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``), the plugin allows exactly the globals
fairseq checkpoints contain, only while a checkpoint is loaded: ``guarded`` wraps a loader
(``patches.model_support`` wraps fairseq's loaders with it), ``read_checkpoint`` is the loader of our own
scripts. Anything else is refused with a message that names the global and says how a user who
trusts the file opts in.

A file that a loader fails on because it cannot be a checkpoint (missing, empty, cut short by an
interrupted save or copy, not written by ``torch.save``, or a torch file without fairseq's
``model`` and ``cfg``) is named with what is wrong with it (``DamagedCheckpointError``), instead of
the error that torch or fairseq happens to raise deep inside (``EOFError``, ``KeyError: 101``, a zip
reader's message). A file that fairseq's loader accepts is never refused: the guard asks of what
it returns only what that loader's callers read.

Every diagnosis of a checkpoint file is here: the loaders' (``guarded``), and the messages and
paths with which ``patches.fixes`` names a checkpoint that fairseq's entry points were told to load
and that does not exist (``missing``, ``restore_file_path``).
"""

import argparse
import functools
import importlib
import os
import pickle
import zipfile
from typing import Callable, List, Optional

import numpy
import torch

from ..errors import RealformerConfigError

ALLOW_ENV = "REALFORMER_ALLOW_GLOBALS"


class UntrustedCheckpointError(RealformerConfigError, pickle.UnpicklingError):
    """A checkpoint holds a global that fairseq checkpoints do not contain."""


class DamagedCheckpointError(RealformerConfigError):
    """A checkpoint file that is missing, empty, cut short, not a torch file, or not fairseq's."""


class MissingCheckpointError(DamagedCheckpointError, FileNotFoundError):
    """A checkpoint path where there is no file: still the ``OSError`` that fairseq's and torch's
    loaders raise for it, for callers that catch that."""


# How torch.save's files begin: a zip archive (torch >= 1.6), or the legacy format's pickled
# magic number (torch.serialization._legacy_save, pickle protocol 2).
_ZIP_START = b"PK\x03\x04"
_LEGACY_START = pickle.dumps(torch.serialization.MAGIC_NUMBER, protocol=2)


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


# fairseq-train's --restore-file when none is given: the save dir's last checkpoint
DEFAULT_RESTORE_FILE = "checkpoint_last.pt"


def restore_file_path(restore_file: str, save_dir: str, suffix: Optional[str]) -> str:
    """The file fairseq-train resumes from, worked out as fairseq's
    ``checkpoint_utils.load_checkpoint`` does: the default name in the save dir, any other
    ``--restore-file`` as given, the checkpoint *suffix* (``--checkpoint-suffix``, and the shard's
    with sharded models) before its '.pt'."""
    suffix = suffix or ""
    if restore_file == DEFAULT_RESTORE_FILE:
        return os.path.join(save_dir, f"checkpoint_last{suffix}.pt")
    return restore_file.replace(".pt", suffix + ".pt")


def missing(path, flag: Optional[str] = None, note: Optional[str] = None) -> MissingCheckpointError:
    """The error for a checkpoint path where there is no file; *flag*: the command-line flag that
    named it; *note*: what fairseq would have done instead."""
    named = f"{flag} {path}" if flag else f"{path}"
    return MissingCheckpointError(f"{named}: no such checkpoint file" + (f" ({note})" if note else ""))


def _file_damage(path) -> Optional[RealformerConfigError]:
    """What is wrong with the file itself, before anything is unpickled; None when it is a
    complete torch file (a zip archive with its central directory, or the legacy format)."""
    unreadable = f"{path} is not a readable torch checkpoint"
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            start = f.read(len(_LEGACY_START))
    except FileNotFoundError:
        return missing(path)
    except OSError as e:
        return DamagedCheckpointError(f"{unreadable}: {e.strerror}")
    if size == 0:
        return DamagedCheckpointError(f"{unreadable}: it is empty (0 bytes), as an interrupted save or copy leaves it")
    if start.startswith(_ZIP_START):
        if not zipfile.is_zipfile(path):  # the zip's directory is at its end: a file cut short lacks it
            return DamagedCheckpointError(
                f"{unreadable}: it is truncated, a torch zip archive cut short at "
                f"{size} bytes (an interrupted save or copy?)"
            )
        return None
    if start == _LEGACY_START:
        return None
    return DamagedCheckpointError(f"{unreadable}: torch.save did not write it ({size} bytes starting {start[:8]!r})")


def _not_fairseq(path, state) -> Optional[DamagedCheckpointError]:
    """A loaded torch object that is not a fairseq checkpoint (a dict with the model's
    parameters under 'model' and its configuration under 'cfg', or 'args' before fairseq 0.10)."""
    if isinstance(state, dict) and "model" in state and (state.get("cfg") is not None or state.get("args") is not None):
        return None
    if isinstance(state, dict) and state and all(torch.is_tensor(v) for v in state.values()):
        holds = f"a dict of {len(state)} tensor{'s' * (len(state) != 1)} only (a model's bare state_dict?)"
    elif isinstance(state, dict):
        keys = [repr(k) for k in list(state)[:5]] + (["..."] if len(state) > 5 else [])
        holds = f"a dict with keys {', '.join(keys)}" if keys else "an empty dict"
    else:
        holds = f"a {type(state).__name__}"
    return DamagedCheckpointError(
        f"{path} is a torch file but not a fairseq checkpoint (no 'model' with its 'cfg'): it holds {holds}"
    )


def _why_not_loaded(path, error: Exception) -> Optional[RealformerConfigError]:
    """Why *path* could not be loaded, when the reason lies in the file: damaged, not a
    checkpoint, or holding globals outside the allow-list. None: the file is a sound fairseq
    checkpoint, and *error* has another cause."""
    if not isinstance(path, (str, os.PathLike)) or "://" in str(path):
        return None  # a file object, or a remote path that fairseq's PathManager resolves
    damage = _file_damage(path)
    if damage is not None:
        return damage
    if isinstance(error, pickle.UnpicklingError):
        return _refusal(path, error)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        return _refusal(path, e)
    except Exception as e:
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return DamagedCheckpointError(f"{path} is not a readable torch checkpoint: {message}")
    return _not_fairseq(path, state)


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


def holds_model(path, state) -> Optional[DamagedCheckpointError]:
    """What ``load_ema_from_checkpoint``'s caller (``EMA.__init__``) reads of its result: the
    parameters under 'model' (fairseq puts the EMA weights there)."""
    if isinstance(state, dict) and "model" in state:
        return None
    return DamagedCheckpointError(f"{path}: the EMA loader found no 'model' in it")


def guarded(
    load: Callable, needs: Optional[Callable[[object, object], Optional[RealformerConfigError]]] = None
) -> Callable:
    """Wrap a loader whose first argument is a checkpoint path and which returns the checkpoint:
    fairseq's globals are allowed while it runs, and when it fails on a file that cannot be a
    fairseq checkpoint, a ``RealformerConfigError`` says what is wrong with the file.

    What the loader returns is handed back as it is. *needs* (path, state -> error or None) is
    what the loader's callers read of it, checked before it is handed back; without it nothing
    is asked beyond what the loader itself read (``load_checkpoint_to_cpu`` reads its
    'optimizer_history' and 'extra_state', or their pre-0.10 forms, and fails on a file without
    them).

    A stock ``transformer``'s checkpoints: they load as fairseq loads them with the protection
    off (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, without which fairseq cannot load them on torch
    >= 2.6), and the loader's result comes back unchanged."""

    @functools.wraps(load)
    def load_with_allowed_globals(path, *args, **kwargs):
        with torch.serialization.safe_globals(allowed_globals()):
            try:
                state = load(path, *args, **kwargs)
            except (RealformerConfigError, MemoryError):
                raise
            except Exception as error:
                reason = _why_not_loaded(path, error)
                if reason is None:
                    raise
                raise reason from None
        problem = needs(path, state) if needs is not None else None
        if problem is not None:
            raise problem
        return state

    return load_with_allowed_globals


@functools.partial(guarded, needs=_not_fairseq)
def read_checkpoint(path, map_location="cpu", mmap=False):
    """``torch.load`` a fairseq checkpoint file as fairseq would, safely (for our own scripts,
    which read its 'model' and 'cfg'). With *mmap*, a zip-format file's tensors are mapped, not
    read: a cheap check that the file loads."""
    if mmap and zipfile.is_zipfile(path):
        return torch.load(path, map_location=map_location, mmap=True)
    with open(path, "rb") as f:
        return torch.load(f, map_location=map_location)
