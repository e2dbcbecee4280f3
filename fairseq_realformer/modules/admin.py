"""ADMIN initialisation of ω (Liu et al. 2020, "Understanding the Difficulty of Training
Transformers"): each sublayer computes ``LN(x·ω + f(x))`` with a trainable per-channel ω, set at
initialisation so that no sublayer's output is dominated by its residual branch.

Three ways to set the initial ω (``--admin-init``):

``closed-form`` (admin-torch): the same ω for every sublayer of a stack,
    ``ω = sqrt((N + 1) / ln(N + 1) − 1)``, N = residual sublayers in that stack
    (2 per encoder layer: self-attention, FFN; 3 per decoder layer: self-attention,
    cross-attention, FFN). E.g. N = 12 → 2.017, N = 36 → 3.041.

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
"""
import math
from typing import Callable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from ..errors import RealformerConfigError

ADMIN_INITS = ("closed-form", "profile")

ENCODER_SUBLAYERS_PER_LAYER = 2
DECODER_SUBLAYERS_PER_LAYER = 3


def closed_form_omega(num_sublayers: int) -> float:
    """ω for a stack of *num_sublayers* residual sublayers (admin-torch's closed form)."""
    if num_sublayers < 1:
        raise ValueError(f"a stack needs at least one residual sublayer, got {num_sublayers}")
    n = num_sublayers + 1
    return math.sqrt(n / math.log(n) - 1)


def initialized_from_data(cfg) -> bool:
    """ω are set from data (a profiling pass or a Clinic file) at the start of training."""
    return getattr(cfg, "admin_init", None) == "profile" or bool(getattr(cfg, "admin_init_path", None))


def initial_omega(cfg, side: str) -> float:
    """The ω every sublayer on *side* ("encoder" or "decoder") is constructed with: the closed
    form, or 1.0 when ω will be set from data before the first update."""
    if initialized_from_data(cfg):
        return 1.0
    layers = {"encoder": cfg.encoder.layers, "decoder": cfg.decoder.layers}[side]
    per_layer = {"encoder": ENCODER_SUBLAYERS_PER_LAYER, "decoder": DECODER_SUBLAYERS_PER_LAYER}[side]
    return closed_form_omega(per_layer * layers)


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
def profile(model: nn.Module, forward: Callable[[], object], stacks: Sequence[nn.ModuleList],
            keeps: Sequence[Optional[Tensor]]) -> List[List[float]]:  # fmt: skip
    """Set every sublayer's ω of *stacks* by one profiling pass: *forward* runs *model* once on a
    training batch, with dropout on (as ADMIN profiles) and LayerDrop off (every sublayer needs
    its ω); stack i's statistics are taken over the elements *keeps[i]* selects and summed over
    processes. Returns the ω set, per stack, in sublayer order."""
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
        forward()
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
            raise RealformerConfigError(f"{flag} {path}: line {number} is not 'index ratio': {' '.join(row)!r}") from None
        if index == 1:
            runs.append([])
        if not runs or index != len(runs[-1]) + 1:
            raise RealformerConfigError(f"{flag} {path}: line {number} has sublayer index {index}, "
                                        f"expected {len(runs[-1]) + 1 if runs else 1}")  # fmt: skip
        runs[-1].append(ratio)
    want = (ENCODER_SUBLAYERS_PER_LAYER * encoder_layers, DECODER_SUBLAYERS_PER_LAYER * decoder_layers)
    have = tuple(len(r) for r in runs)
    if have != want:
        raise RealformerConfigError(
            f"{flag} {path} holds {' + '.join(map(str, have)) or 'no'} sublayer ratios, but this "
            f"{encoder_layers}L-{decoder_layers}L model needs {want[0]} encoder + {want[1]} decoder "
            f"(2 per encoder layer, 3 per decoder layer)"
        )
    return runs[0], runs[1]


def write_clinic_profile(path: str, encoder_omegas: Sequence[float], decoder_omegas: Sequence[float]) -> None:
    """Write ω in Transformer-Clinic's ``profile.ratio.init`` format."""
    with open(path, "w") as f:
        for omegas in (encoder_omegas, decoder_omegas):
            for index, omega in enumerate(omegas, start=1):
                f.write(f"{index} {omega!r}\n")
