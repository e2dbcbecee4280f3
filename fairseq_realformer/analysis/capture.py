"""Hand on the per-head attention probabilities that every attention layer of a model used.

Works on every subclass of fairseq's ``MultiheadAttention``: fairseq's own (stock ``transformer``
models), which returns ``(output, weights)``, and the plugin's two, ``ResidualMultiheadAttention``
and ``PlainMultiheadAttention`` (fairseq's on a path that carries nothing), which return
``Attended(output, weights, carried)``: the weights come second in both. Each layer is asked for
per-head weights through a forward pre-hook that rewrites the keyword arguments its encoder or
decoder layer passes (``need_weights``, ``need_head_weights``); a forward hook hands those weights
on as soon as the layer has run, so no more than one layer's probabilities need to be kept at a
time.

Nothing else changes: the model computes what it computes without the recorder (tested).
"""

from typing import Callable, Dict, List

from fairseq.modules import MultiheadAttention
from torch import Tensor, nn

from ..errors import RealformerConfigError
from ..modules.sublayers import ATTENTION_BY_PATH

# The three attention types of an encoder-decoder, by the name of their score path (options.PATHS).
PATH_TITLES = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "encoder-decoder (cross-)attention",
}


def attention_modules(model: nn.Module) -> Dict[str, List[MultiheadAttention]]:
    """The attention modules of *model* by path, first layer first.

    Raises ``RealformerConfigError`` for a model that is not a Transformer encoder-decoder built
    from fairseq's attention (e.g. an LSTM or a convolutional model)."""
    encoder_layers = getattr(getattr(model, "encoder", None), "layers", None)
    decoder_layers = getattr(getattr(model, "decoder", None), "layers", None)
    kind = type(model).__name__
    if not encoder_layers or not decoder_layers:
        raise RealformerConfigError(f"{kind} has no Transformer encoder and decoder layers to read attention from")
    stacks = {"encoder": encoder_layers, "decoder": decoder_layers}
    modules = {
        path: [getattr(layer, sublayer.name, None) for layer in stacks[side]]
        for path, (side, sublayer) in ATTENTION_BY_PATH.items()
    }
    for path, found in modules.items():
        if not all(isinstance(m, MultiheadAttention) for m in found):
            raise RealformerConfigError(
                f"{kind}'s {PATH_TITLES[path]} is not fairseq's MultiheadAttention in every layer, "
                f"so its per-head probabilities cannot be read"
            )
    return modules


def _ask_for_head_weights(module, args, kwargs):
    # fairseq's encoder and decoder layers (and the plugin's) call attention with keywords only.
    return args, {**kwargs, "need_weights": True, "need_head_weights": True}


class AttentionRecorder:
    """Context manager: during each forward pass of the model, every attention layer, as soon as
    it has run, calls ``consume(path, layer, probabilities)`` with layer counted from 0 and its
    attention probabilities ``(heads, batch, queries, keys)`` in float32, exactly those the layer
    used (masked entries 0; running mean's ``softmax(S_n / n)`` for residual attention).

    fairseq's ``MultiheadAttention`` takes a fused path (``F.multi_head_attention_forward``) for
    self-attention outside incremental decoding, which returns weights averaged over heads even
    when per-head weights are asked for. Its ``skip_embed_dim_check`` flag is the one switch
    that sends it to its explicit path (the one incremental decoding and cross-attention use),
    which honours ``need_head_weights``; it is set while recording and restored afterwards.
    """

    def __init__(self, model: nn.Module, consume: Callable[[str, int, Tensor], None]):
        self.modules = attention_modules(model)
        self.consume = consume
        self._handles = []
        self._saved_flags = []

    def __enter__(self) -> "AttentionRecorder":
        for path, modules in self.modules.items():
            for layer, module in enumerate(modules):
                self._saved_flags.append((module, module.skip_embed_dim_check))
                module.skip_embed_dim_check = True
                self._handles.append(module.register_forward_pre_hook(_ask_for_head_weights, with_kwargs=True))
                self._handles.append(module.register_forward_hook(self._recorder(path, layer)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        for module, flag in self._saved_flags:
            module.skip_embed_dim_check = flag
        self._handles, self._saved_flags = [], []

    def _recorder(self, path: str, layer: int):
        def record(module, inputs, output):
            weights = output[1]  # fairseq's (output, weights) and the plugin's Attended alike
            if weights is None or weights.dim() != 4 or weights.size(0) != module.num_heads:
                raise RealformerConfigError(
                    f"{PATH_TITLES[path]} layer {layer + 1} ({type(module).__name__}) did not return "
                    f"per-head attention probabilities"
                )
            self.consume(path, layer, weights.float())

        return record
