"""The update's host work, removed exactly: fairseq-train's optimizer step, gradient norm and
``--fp16`` copies as one multi-tensor (``torch._foreach_*``) op each, instead of a Python loop of
~7 ops per parameter tensor (283 tensors in a 6L-6L RealFormer). On a GPU the loop's launches,
not its arithmetic, set the pace of a small model's update.

Every replacement computes the same floating-point operations in the same order as the code it
replaces, so a float32 run on a CPU gives the same parameters and optimizer state bit for bit
(``tests/test_fast_update.py``, 30+ fairseq-train updates each way). On a GPU the multi-tensor
kernels can round a reduction (the gradient norm) in another order.

=========================  ==========================================  =============================
what                       fairseq's                                   here
=========================  ==========================================  =============================
Adam's step                ``fairseq.optim.adam.Adam.step``: a loop    ``ForeachAdam``: its formula
                           over tensors (eps added to √v before the    line by line, per group of
                           bias correction, decoupled weight decay)    tensors at the same step
RAdam's step (the          ``torch.optim.RAdam``, one tensor at a      ``ForeachRAdam``: the loop's
plugin's ``radam``)        time on a CPU (torch's own multi-tensor     formula; torch's multi-
                           RAdam differs from it in the last bit)      tensor one differs
gradient norm and clip     ``utils.clip_grad_norm_``: one norm per     ``_foreach_norm`` and one
                           tensor, then the norm of their stack        ``_foreach_mul_``
``--fp16`` copies          gradients into, parameters out of the       ``_foreach_copy_`` over the
                           flat float32 masters, a tensor at a time    same slices
the update's seed          ``Trainer._set_seed``: seeds, and copies    ``seed_without_snapshot``:
                           the RNG state it never restores             the same seed, no copy
=========================  ==========================================  =============================

Installed by ``install`` on the optimizer fairseq-train builds for the plugin's models
(``patches.model_support``; ``--fairseq-update`` leaves fairseq's own). The state layout is fairseq's
(Adam: ``step`` an int, ``exp_avg``, ``exp_avg_sq``; RAdam: torch's), so a checkpoint moves both
ways between the two paths. What is not float32 (``--memory-efficient-fp16``'s half-precision
weights), AMSGrad, sparse gradients and apex's fused kernels keep fairseq's code.

The device syncs left in a fast update are the ones fairseq-train's output needs: the finite check
of the gradient norm (it raises ``FloatingPointError``), ``--fp16``'s overflow check and its
clip's comparison (they skip the update and lower the loss scale), and the statistics fairseq
logs (its criteria turn each update's loss sums into Python numbers). What is left of the host's
bookkeeping is fairseq's: ``model.train()`` twice an update (the trainer's and the task's) and
``set_num_updates``'s walk over the modules.
"""

import functools
import logging
import math
import types
from collections import defaultdict

import torch
from fairseq import utils
from fairseq.optim.adam import Adam, FairseqAdam
from fairseq.optim.fp16_optimizer import FP16Optimizer

from .radam import FairseqRAdam

logger = logging.getLogger(__name__)


def _buckets(items):
    """*items* (key, value) grouped by key, in first-seen order: multi-tensor ops need one device
    and dtype, and one step count for one bias correction."""
    grouped = defaultdict(list)
    for key, value in items:
        grouped[key].append(value)
    return grouped.values()


def _all_float32(params) -> bool:
    return all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 and not p.grad.is_sparse for p in params)


class _ForeachStep:
    """What every foreach optimizer here shares: the parameters with a gradient, bucketed by
    device and step count, each bucket one ``_step_bucket``; the base class's own loop for what
    it handles that the buckets do not (``_foreach_handles``)."""

    def step(self, closure=None):
        groups = [[p for p in group["params"] if p.grad is not None] for group in self.param_groups]
        if not (self._foreach_handles() and all(map(_all_float32, groups))):
            return super().step(closure)
        loss = closure() if closure is not None else None
        with torch.no_grad():
            for group, params in zip(self.param_groups, groups):
                steps = self._advance(params)
                for bucket in _buckets(((p.device, step), (p, step)) for p, step in zip(params, steps)):
                    params_, (step, *_) = zip(*bucket)
                    states = [self.state[p] for p in params_]
                    exp_avgs, exp_avg_sqs = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
                    self._step_bucket(group, list(params_), [p.grad for p in params_], exp_avgs, exp_avg_sqs, step)
        return loss


class ForeachAdam(_ForeachStep, Adam):
    """fairseq's ``Adam``, each line of its per-tensor formula one multi-tensor op over all the
    tensors at the same step."""

    def _foreach_handles(self):
        return not any(group.get("amsgrad", False) for group in self.param_groups)

    def _advance(self, params):
        """Each tensor's step count after this update, its state made as fairseq makes it."""
        for p in params:
            state = self.state[p]
            if len(state) == 0:
                state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
            state["step"] += 1
        return [self.state[p]["step"] for p in params]

    def _step_bucket(self, group, params, grads, exp_avgs, exp_avg_sqs, step):
        beta1, beta2 = group["betas"]
        torch._foreach_mul_(exp_avgs, beta1)
        torch._foreach_add_(exp_avgs, grads, alpha=1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
        denoms = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_add_(denoms, group["eps"])
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = group["lr"] * math.sqrt(bias_correction2) / bias_correction1
        if group["weight_decay"] != 0:
            torch._foreach_add_(params, params, alpha=-group["weight_decay"] * group["lr"])
        torch._foreach_addcdiv_(params, exp_avgs, denoms, value=-step_size)


class ForeachRAdam(_ForeachStep, torch.optim.RAdam):
    """torch's ``RAdam`` as its one-tensor-at-a-time loop computes it (``_single_tensor_radam``),
    each line one multi-tensor op over all the tensors at the same step."""

    def _foreach_handles(self):
        flags = ("maximize", "capturable", "differentiable", "fused")
        return not any(group.get(flag) for group in self.param_groups for flag in flags)

    def _advance(self, params):
        """Each tensor's step count after this update, its state made as torch makes it (the step
        a float32 tensor on the CPU)."""
        for p in params:
            state = self.state[p]
            if len(state) == 0:
                zeros = functools.partial(torch.zeros_like, p, memory_format=torch.preserve_format)
                state.update(step=torch.tensor(0.0), exp_avg=zeros(), exp_avg_sq=zeros())
        steps = [self.state[p]["step"] for p in params]
        torch._foreach_add_(steps, 1)
        return [step.item() for step in steps]

    def _step_bucket(self, group, params, grads, exp_avgs, exp_avg_sqs, step):
        lr, (beta1, beta2), eps, weight_decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        if weight_decay != 0:
            if group["decoupled_weight_decay"]:
                torch._foreach_mul_(params, 1 - lr * weight_decay)
            else:
                grads = torch._foreach_add(grads, params, alpha=weight_decay)
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        update = torch._foreach_div(exp_avgs, bias_correction1)
        torch._foreach_mul_(update, lr)
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * (beta2**step) / bias_correction2
        if rho_t > 5.0:
            rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
            adaptive_lr = torch._foreach_sqrt(exp_avg_sqs)
            torch._foreach_add_(adaptive_lr, eps)
            torch._foreach_reciprocal_(adaptive_lr)  # torch's `scalar / tensor` is reciprocal, then times
            torch._foreach_mul_(adaptive_lr, bias_correction2**0.5)
            torch._foreach_mul_(update, adaptive_lr)
            torch._foreach_mul_(update, rect)
        torch._foreach_add_(params, update, alpha=-1.0)


FOREACH = {Adam: ForeachAdam, torch.optim.RAdam: ForeachRAdam}


def clip_grad_norm(optimizer, max_norm, aggregate_norm_fn=None):
    """``utils.clip_grad_norm_`` over *optimizer*'s parameters: each tensor's norm by one
    ``_foreach_norm``, the same float32 norms fairseq stacks, then its clip as one multiply."""
    params = list(optimizer.params)
    grads = [p.grad for p in params if p.grad is not None]
    fairseqs = (
        len(grads) < 2
        or utils.multi_tensor_l2norm_available  # apex's fused kernel: fairseq's own is already one op
        or any(hasattr(p, "expert") for p in params)
        or any(g.dtype != torch.float32 or g.is_sparse for g in grads)
        or len({g.device for g in grads}) > 1
    )
    if fairseqs:
        return utils.clip_grad_norm_(params, max_norm, aggregate_norm_fn)
    grads = [g.detach() for g in grads]
    total_norm = torch.norm(torch.stack(torch._foreach_norm(grads, 2)))
    if aggregate_norm_fn is not None:
        total_norm = aggregate_norm_fn(total_norm)
    if max_norm > 0:
        clip_coef = (float(max_norm) / (total_norm + 1e-6)).clamp_(max=1)
        torch._foreach_mul_(grads, clip_coef)
    return total_norm


def _flat_slices(fp16_optimizer, device):
    """(fp16 parameters, the matching views of the flat float32 masters' data and gradient) on
    *device*, in fairseq's order; computed once (the flat buffers never move)."""
    cache = fp16_optimizer.__dict__.setdefault("_realformer_flat_slices", {})
    if device not in cache:
        params = [p for p in fp16_optimizer.fp16_params if p.device.index == device]
        flat = fp16_optimizer.fp32_params[device]
        offsets = [0]
        for p in params:
            offsets.append(offsets[-1] + p.numel())
        data = [flat.data[a:b].view_as(p) for p, a, b in zip(params, offsets, offsets[1:])]
        grads = [flat.grad.data[a:b].view_as(p) for p, a, b in zip(params, offsets, offsets[1:])]
        cache[device] = (params, data, grads)
    return cache[device]


def _sync_fp16_grads_to_fp32(self):
    """``FP16Optimizer._sync_fp16_grads_to_fp32`` for flat masters: one multi-tensor copy."""
    if not self._needs_sync:
        return
    for device in self.fp32_params:
        params, _, grads = _flat_slices(self, device)
        with_grad = [(p.grad, g) for p, g in zip(params, grads) if p.grad is not None]
        if with_grad:
            torch._foreach_copy_([g for _, g in with_grad], [src for src, _ in with_grad])
        for p, g in zip(params, grads):
            if p.grad is None:
                g.zero_()
    self._needs_sync = False


def _sync_fp32_params_to_fp16(self):
    """``FP16Optimizer._sync_fp32_params_to_fp16`` for flat masters: one multi-tensor copy."""
    for device in self.fp32_params:
        params, data, _ = _flat_slices(self, device)
        torch._foreach_copy_([p.data for p in params], data)


def seed_without_snapshot(trainer) -> None:
    """``Trainer._set_seed`` (the seed of every update: ``--seed`` plus the update number) without
    the RNG-state snapshot that ``utils.set_torch_seed`` takes and never restores here (on a GPU
    a copy of every device's generator state to the host, each update)."""
    seed = trainer.cfg.common.seed + trainer.get_num_updates()
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)


def install(optimizer) -> bool:
    """Give fairseq's *optimizer* (what fairseq-train built) the fast update where it is exact;
    True if it took it. The wrappers' methods are replaced on the instance, not by a subclass:
    fairseq stores the wrapper's class name in checkpoints and refuses a resume when it differs."""
    inner = optimizer.fp32_optimizer if type(optimizer) is FP16Optimizer else optimizer
    if type(inner) not in (FairseqAdam, FairseqRAdam) or type(inner.optimizer) not in FOREACH:
        return False  # another optimizer (or apex's FusedAdam, already fused): fairseq's own
    inner.optimizer.__class__ = FOREACH[type(inner.optimizer)]  # a subclass with the same state
    inner.clip_grad_norm = types.MethodType(clip_grad_norm, inner)
    # fairseq lays out the gradients of trained parameters only, but the parameters of all: where
    # they differ (a frozen parameter: the trainer passes none), its own copies stay
    flat = optimizer is not inner and optimizer.has_flat_params and isinstance(optimizer.fp32_params, dict)
    if flat and all(p.requires_grad for p in optimizer.fp16_params):
        optimizer._sync_fp16_grads_to_fp32 = types.MethodType(_sync_fp16_grads_to_fp32, optimizer)
        optimizer._sync_fp32_params_to_fp16 = types.MethodType(_sync_fp32_params_to_fp16, optimizer)
    logger.info(
        f"fast update: {type(inner.optimizer).__name__}, multi-tensor gradient norm (--fairseq-update: fairseq's)"
    )
    return True
