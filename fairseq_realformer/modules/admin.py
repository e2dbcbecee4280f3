"""ADMIN (Liu et al. 2020, "Understanding the Difficulty of Training Transformers"): each
sublayer computes ``LN(x·ω + f(x))`` with a trainable per-channel ω, set at initialisation so that
no sublayer's output is dominated by its residual branch. Everything about setting ω lives here.

Three ways to set the initial ω (``--admin-init``):

``closed-form`` (admin-torch): the same ω for every sublayer of a stack,
    ``ω = sqrt((N + 1) / ln(N + 1) − 1)``, N = residual sublayers in that stack
    (``sublayers.SUBLAYERS``: 2 per encoder layer, self-attention and FFN; 3 per decoder layer,
    self-attention, cross-attention and FFN). E.g. N = 12 → 2.017, N = 36 → 3.041. Set at
    construction.

``profile`` (the paper's method): one forward pass on a real training batch, dropout on, runs
    the sublayers in order with a running ratio that starts at 1.0, separately for encoder and
    decoder; each sublayer sets ``ω_i = ratio``, then ``ratio = sqrt(Var(x·ω_i) + Var(f(x)))``,
    variances over all elements of real (non-padding) tokens. Unlike Transformer-Clinic, this
    happens inside the training run, before the first update; the ω live in the model and in
    every checkpoint (no ``profile.ratio.init``, no second run, nothing at generation time).
    Padding is left out of the statistics: padded positions carry no data and their share of a
    batch depends only on how sentences were bucketed, not on the model.

``--admin-init-path FILE``: ω from a Transformer-Clinic ``profile.ratio.init`` (lines
    ``index ratio``: encoder sublayers 1..2N, then decoder sublayers 1..3M).

The last two set ω from data: the model is built with ω = 1 and a pending state (``attach``), and
``initialize`` — the one call fairseq-train (through ``patches.model_support``), the benchmarks and a
user's own training loop make before building the optimizer — sets them once. Optimizers that
keep their own copy of the parameters (fairseq's --fp16) would otherwise overwrite the new ω.
"""

import logging
import math
import os
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from ..errors import RealformerConfigError
from .sublayers import counts_per_layer, per_layer

logger = logging.getLogger(__name__)


def closed_form_omega(num_sublayers: int) -> float:
    """ω for a stack of *num_sublayers* residual sublayers (admin-torch's closed form)."""
    if num_sublayers < 1:
        raise ValueError(f"a stack needs at least one residual sublayer, got {num_sublayers}")
    n = num_sublayers + 1
    return math.sqrt(n / math.log(n) - 1)


def initial_omega(options, layers: int, side: str) -> float:
    """The ω every sublayer of a stack of *layers* layers on *side* ("encoder" or "decoder") is
    constructed with: the closed form, or 1.0 when ω will be set from data before training."""
    if options.admin_from_data:
        return 1.0
    return closed_form_omega(per_layer(side) * layers)


# --- ω set from data: the pending state and the one call that sets them --------------------------


def attach(model: nn.Module, options) -> None:
    """Give *model* (an encoder-decoder whose ``options`` are *options*) ADMIN's start-up state when its ω are to be set from data: a buffer ``admin_initialized``,
    0 until ``initialize`` ran and carried by every checkpoint (a resumed run never re-profiles),
    and a guard that refuses to train before. Nothing for the closed form or other backbones."""
    if not options.admin_from_data:
        return
    if options.admin_init_path and os.path.exists(options.admin_init_path):
        # fail at construction rather than after the data are loaded; a missing file is an error
        # only when training starts (generation reads ω from the checkpoint, never the file)
        read_clinic_profile(options.admin_init_path, *map(len, _stacks(model)))
    model.register_buffer("admin_initialized", torch.zeros(()))
    model._admin_pending = True
    model.register_load_state_dict_post_hook(_refresh_pending)
    model.register_forward_pre_hook(_refuse_to_train_while_pending)


def pending(model: nn.Module) -> bool:
    """ω still have to be set from data (any other model: False, also an object that answers
    every attribute, such as a ``MagicMock``)."""
    return getattr(model, "_admin_pending", False) is True


@torch.no_grad()
def initialize(model: nn.Module, net_input: Optional[Dict[str, Tensor]] = None) -> None:
    """Set ADMIN's ω from data, once: from ``--admin-init-path``, or by one profiling pass on
    *net_input* (a training batch: src_tokens, src_lengths, prev_output_tokens). A no-op when
    nothing is pending (other backbones, the closed form, a loaded checkpoint, a second call).
    In a distributed run every process must call it; they all end with the same ω. Call it
    before building the optimizer."""
    if not pending(model):
        return
    clinic_file = model.options.admin_init_path
    if clinic_file:
        encoder_omegas, decoder_omegas = load_clinic_profile(clinic_file, *_stacks(model))
        source = f"from {clinic_file}"
    else:
        if net_input is None:
            raise ValueError("--admin-init profile needs a training batch (net_input)")
        encoder_omegas, decoder_omegas = profile(model, net_input)
        source = "by profiling one training batch per process"
    model.admin_initialized.fill_(1)
    model._admin_pending = False
    logger.info(
        f"ADMIN omega initialised {source}: encoder {encoder_omegas[0]:.3f} .. {encoder_omegas[-1]:.3f}, "
        f"decoder {decoder_omegas[0]:.3f} .. {decoder_omegas[-1]:.3f}"
    )


def _refresh_pending(model: nn.Module, incompatible_keys) -> None:
    model._admin_pending = not bool(model.admin_initialized)


def _refuse_to_train_while_pending(model: nn.Module, args) -> None:
    if model._admin_pending and model.training:
        raise RealformerConfigError(
            "ADMIN's omega is not initialised yet (--admin-init profile / --admin-init-path): "
            "fairseq-train does it before the first update; in your own training loop call "
            "model.initialize_admin(sample['net_input']) before building the optimizer"
        )


def _stacks(model: nn.Module) -> Tuple[nn.ModuleList, nn.ModuleList]:
    return model.encoder.layers, model.decoder.layers


class AdminProfiler:
    """The running ratio of one stack during a profiling pass.

    Layers call it once per residual sublayer, in order, with their ω, the sublayer input x and
    the branch output f(x) (after dropout). *keep* (T x B, True for real tokens) selects the
    elements the variances are taken over; *all_reduce* sums statistics over processes so
    that every rank computes the same ω from the union of their batches.
    """

    def __init__(self, keep: Optional[Tensor], all_reduce: Callable[[Tensor], Tensor]):
        self.keep = keep
        self.all_reduce = all_reduce
        self.ratio = 1.0
        self.omegas: List[float] = []

    def __call__(self, omega: Tensor, residual: Tensor, branch: Tensor) -> None:
        omega.data.fill_(self.ratio)
        stats = self.all_reduce(torch.stack([self._moments(residual * omega), self._moments(branch)]))
        count, total, squares = stats.unbind(dim=1)
        variances = squares / count - (total / count) ** 2
        self.omegas.append(self.ratio)
        self.ratio = math.sqrt(float(variances.sum()))

    def _moments(self, t: Tensor) -> Tensor:
        """(number of elements, sum, sum of squares) of the real tokens' features, in float64."""
        t = (t[self.keep] if self.keep is not None else t).double()
        return torch.stack([t.new_tensor(float(t.numel())), t.sum(), t.square().sum()])


@torch.no_grad()
def profile(model: nn.Module, net_input: Dict[str, Tensor]) -> List[List[float]]:
    """Set every sublayer's ω by one profiling pass of *model* on the training batch *net_input*,
    with dropout on (as ADMIN profiles) and LayerDrop off (every sublayer needs its ω); each
    stack's statistics are taken over its real tokens and summed over processes. Returns the ω
    set, per stack (encoder, decoder), in sublayer order."""
    src_tokens, prev_output_tokens = net_input["src_tokens"], net_input["prev_output_tokens"]
    pad = model.encoder.padding_idx
    keeps = (src_tokens.ne(pad).t(), prev_output_tokens.ne(pad).t())  # T x B, as the layers see x
    stacks = _stacks(model)
    profilers = [AdminProfiler(keep, distributed_sum) for keep in keeps]
    layerdrop = [getattr(stack, "p", None) for stack in stacks]
    was_training = model.training
    try:
        model.train()
        for stack, profiler in zip(stacks, profilers):
            if hasattr(stack, "p"):
                stack.p = 0.0
            for layer in _all_layers(stack):
                layer.admin_profiler = profiler
        # forward(), not __call__: the guard against training while pending is a pre-hook
        model.forward(src_tokens, net_input["src_lengths"], prev_output_tokens)
    finally:
        model.train(was_training)
        for stack, p in zip(stacks, layerdrop):
            if p is not None:
                stack.p = p
            for layer in _all_layers(stack):
                layer.admin_profiler = None
    return [profiler.omegas for profiler in profilers]


@torch.no_grad()
def load_clinic_profile(path: str, encoder: nn.ModuleList, decoder: nn.ModuleList) -> List[List[float]]:
    """Set every sublayer's ω from a Transformer-Clinic ``profile.ratio.init``; returns them."""
    encoder_layers, decoder_layers = _all_layers(encoder), _all_layers(decoder)
    omegas = read_clinic_profile(path, len(encoder_layers), len(decoder_layers))
    for layers, values in zip((encoder_layers, decoder_layers), omegas):
        for omega, value in zip((w for layer in layers for w in layer.sublayer_omegas()), values):
            omega.fill_(value)
    return list(omegas)


def _all_layers(stack: nn.ModuleList) -> List[nn.Module]:
    # iterating a LayerDropModuleList in training mode skips layers at random
    return list(stack._modules.values())


def distributed_sum(t: Tensor) -> Tensor:
    """Sum over all processes of the default group (identity when not distributed)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(t)
    return t


def read_clinic_profile(path: str, encoder_layers: int, decoder_layers: int) -> Tuple[List[float], List[float]]:
    """ω per sublayer (encoder, decoder) from a Transformer-Clinic ``profile.ratio.init``."""
    flag = "--admin-init-path"
    try:
        with open(path) as f:
            rows = [line.split() for line in f if line.strip()]
    except OSError as e:
        raise RealformerConfigError(f"{flag} {path}: {e.strerror}") from None
    runs: List[List[float]] = []
    for number, row in enumerate(rows, start=1):
        try:
            index, ratio = int(float(row[0])), float(row[1])
            if len(row) != 2:
                raise ValueError
        except (ValueError, IndexError):
            raise RealformerConfigError(
                f"{flag} {path}: line {number} is not 'index ratio': {' '.join(row)!r}"
            ) from None
        if index == 1:
            runs.append([])
        if not runs or index != len(runs[-1]) + 1:
            raise RealformerConfigError(
                f"{flag} {path}: line {number} has sublayer index {index}, expected {len(runs[-1]) + 1 if runs else 1}"
            )
        runs[-1].append(ratio)
    want = (per_layer("encoder") * encoder_layers, per_layer("decoder") * decoder_layers)
    have = tuple(len(r) for r in runs)
    if have != want:
        raise RealformerConfigError(
            f"{flag} {path} holds {' + '.join(map(str, have)) or 'no'} sublayer ratios, but this "
            f"{encoder_layers}L-{decoder_layers}L model needs {want[0]} encoder + {want[1]} decoder "
            f"({counts_per_layer()})"
        )
    return runs[0], runs[1]
