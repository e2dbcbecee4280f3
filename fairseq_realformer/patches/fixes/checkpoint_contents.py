"""What a checkpoint holds that the running fairseq's model does not have."""

import functools
import logging
import re

import torch
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase

logger = logging.getLogger(__name__)

# fairseq 0.12.2's BetterTransformer copies of each encoder layer's weights (its
# TransformerEncoderLayerBase.__init__), in the order it registers them
BETTER_TRANSFORMER_COPIES = (
    "in_proj_weight",
    "in_proj_bias",
    "out_proj_weight",
    "out_proj_bias",
    "fc1_weight",
    "fc1_bias",
    "fc2_weight",
    "fc2_bias",
)
_COPY_KEY = re.compile(r"^(.*\.layers\.\d+\.)(" + "|".join(BETTER_TRANSFORMER_COPIES) + r")$")


def has_better_transformer_copies() -> bool:
    """The running fairseq's encoder layers carry the copies: the official fairseq 0.12.2, whose
    layers fill them from the model's weights while loading (its own ``_load_from_state_dict``).
    fairseq main, ve-fairseq and 0.12.2 with scripts/fairseq-0.12.2.patch have neither."""
    return TransformerEncoderLayerBase._load_from_state_dict is not torch.nn.Module._load_from_state_dict


def drop_better_transformer_copies(load_checkpoint_to_cpu):
    """The official fairseq 0.12.2 saves 8 copies of each encoder layer's weights for its
    BetterTransformer fast path (``in_proj_weight`` = q, k and v stacked, ..., ``fc2_bias``), which
    fairseq main and ve-fairseq refuse to load: ``Unexpected key(s) in state_dict:
    "encoder.layers.0.in_proj_weight", ...``. Every value in them is a copy of a weight the model
    has (or zeros, before the first load), so where the running fairseq's layers lack them they are
    dropped from the loaded ``model``. Its optimizer state, if resumed, still counts the copies' 8
    parameters per layer (not tried: ``--reset-optimizer`` is what leaves it out).

    Call site: ``Trainer.load_checkpoint`` (resuming, ``--finetune-from-model``) and
    ``load_model_ensemble_and_task`` (fairseq-generate, fairseq-interactive, the hub) call
    ``checkpoint_utils.load_checkpoint_to_cpu``.

    A stock ``transformer``'s checkpoint: one without the copies (fairseq main's, ve-fairseq's, the
    patched 0.12.2's) comes back unchanged; one with them loads where fairseq alone refuses it.
    Under the official 0.12.2 nothing is dropped."""

    @functools.wraps(load_checkpoint_to_cpu)
    def load_without_better_transformer_copies(*args, **kwargs):
        state = load_checkpoint_to_cpu(*args, **kwargs)
        model = state.get("model") if isinstance(state, dict) else None
        if not isinstance(model, dict) or has_better_transformer_copies():
            return state
        found = {}
        for key in model:
            match = _COPY_KEY.match(key)
            if match:
                found.setdefault(match[1], []).append(key)
        # a layer's keys go only when all 8 are there: a model's own parameter of one of these
        # names stays
        dropped = [key for keys in found.values() if len(keys) == len(BETTER_TRANSFORMER_COPIES) for key in keys]
        for key in dropped:
            del model[key]
        if dropped:
            logger.info(
                f"dropped fairseq 0.12.2's BetterTransformer copies of the weights of {len(dropped) // 8} encoder "
                f"layers from the checkpoint (this fairseq's layers do not have them)"
            )
        return state

    return load_without_better_transformer_copies
