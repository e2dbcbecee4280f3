"""bfloat16 mixed precision for fairseq on a CPU or a CUDA GPU: what ``--bf16`` means with the
plugin loaded and torch_xla not installed (with torch_xla, fairseq's own meaning, a TPU run in
bfloat16, stays).

fairseq 0.12's ``--bf16`` turns on ``--tpu`` and casts the model, the batches and the optimizer's
working copy to bfloat16; without torch_xla it fails (fairseq issue 4696 asks for GPU bf16 since
2022). Here it is automatic mixed precision instead, as PyTorch defines it:

- weights, gradients, the optimizer's state and the checkpoints stay float32; fairseq's trainer is
  built as for a float32 run, with its plain optimizer: bfloat16 has float32's range, so there is
  no loss scaler and no "minimum loss scale reached";
- ``torch.autocast(device, torch.bfloat16)`` runs the matrix products in bfloat16. Softmax, LayerNorm
  and the residual stream stay in the dtype of their input (float32 for the residual stream, which
  starts from float32 embeddings); fairseq's ``log_softmax`` and the loss run in float32 (fairseq
  casts the logits to float32 first);
- where the autocast is entered (``autocast_training``): around the criterion's forward (the
  model's forward and the loss) and around the task's ``inference_step``, not around the task's
  ``train_step``. fairseq's ``train_step`` wraps the criterion in ``torch.cuda.amp.autocast(
  enabled=False)`` unless --amp's optimizer is used, which on a GPU would switch an outer autocast
  off exactly there; the criterion's forward is where --amp's own autocast sits, and it leaves
  the backward pass outside the autocast, as PyTorch recommends.

On a CPU, PyTorch's fused attention (``scaled_dot_product_attention``'s flash kernel, which
fairseq's own ``MultiheadAttention`` calls in training) has a bfloat16 backward 4-5x slower than
its float32 one at NMT shapes (44 against 9 ms for 300 sentences of 14 tokens, 4 heads of 32);
its math kernel in bfloat16 takes 11 ms. Under bf16 on a CPU the autocast therefore asks for the
math kernel (``_math_attention``). The plugin's own residual attention computes its scores with
``bmm`` and is not affected.

Also on a CPU, dropout's mask (``bernoulli_``) took 16 % of a bf16 update at the quality study's
size: ``torch.rand(...) >= p`` draws the same mask distribution in half the time, forward and
backward (``dropout``; fairseq's ``FairseqDropout`` uses it under the bf16 autocast on a CPU, and
keeps ``F.dropout`` everywhere else, so float32 runs draw the masks they always drew).

And the vocabulary's ``log_softmax``: fairseq computes it in float32 from the bfloat16 logits
(``F.log_softmax(x, dtype=float32)``), which on a CPU first copies the whole (tokens, vocabulary)
tensor to float32, and whose float32 gradient autograd then copies back to bfloat16.
``log_softmax_from_bf16`` converts row blocks into the float32 result itself (no float32 copy of
the logits beside it) and returns the gradient in bfloat16: the same values bit for bit, faster
(forward and backward with fairseq's label-smoothed loss on 4,080 x 7,792 logits: 170 against
221 ms, 2 threads; in a bf16 beam-5 decode at d=128, 64 sentences, 1 thread: 106 against 152 ms
of log_softmax when each block was first copied to float32). It does not save memory: that loss
path's peak resident set measured ~120 MB higher than fairseq's (in isolation; glibc's allocator
keeps the blocks' memory; ~90 MB with the blocks converted in place, 1 thread), a cost taken for
the speed.
"""

import contextlib
import functools
import importlib.util
import sys
import warnings
from typing import Callable, Optional

import torch

from ..errors import RealformerConfigError

DTYPE = torch.bfloat16


def requested(common) -> bool:
    """fairseq's *common* config (or argparse namespace) asks for bf16 and this plugin gives it:
    ``--bf16`` (or ``common.bf16``) without torch_xla installed."""
    return bool(getattr(common, "bf16", False)) and not xla_installed()


def xla_installed() -> bool:
    return importlib.util.find_spec("torch_xla") is not None


def problem(common) -> Optional[str]:
    """Why the bf16 of *common* cannot run as asked, or None. ``--memory-efficient-bf16`` means
    fairseq's bfloat16 weights without a float32 copy, which only its TPU run has; with --fp16
    (float16 weights) or --amp (float16 autocast with a loss scaler) it would be two precisions
    at once."""
    if not requested(common):
        return None
    if getattr(common, "memory_efficient_bf16", False):
        return (
            "--memory-efficient-bf16 keeps the weights themselves in bfloat16, which only fairseq's TPU run "
            "(torch_xla) does: use --bf16 (bfloat16 mixed precision, float32 weights)"
        )
    for flag, field in (("--fp16", "fp16"), ("--amp", "amp")):
        if getattr(common, field, False):
            return f"--bf16 and {flag} exclude each other: choose one precision"
    return None


def check(common) -> None:
    """Raise the one-line error of ``problem``, if any."""
    message = problem(common)
    if message is not None:
        raise RealformerConfigError(message)


def native_on_cpu() -> bool:
    """This CPU has bfloat16 arithmetic (AVX512-BF16 or AMX): PyTorch's bfloat16 matrix products
    run natively instead of being emulated with float32 instructions, slower than float32."""
    detectors = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in detectors)


def emulated(device_type: str) -> bool:
    """bf16 on *device_type* runs, but slower than float32: a CPU without bf16 units."""
    return device_type == "cpu" and not native_on_cpu()


WITHOUT_UNITS = "on a CPU without bfloat16 units (no AVX512-BF16 or AMX, as PyTorch reports)"


def warn_if_emulated(device_type: str, prog: str) -> None:
    """One line on stderr where a command's --bf16 runs, but slower than float32."""
    if emulated(device_type):
        print(f"{prog}: warning: --bf16 {WITHOUT_UNITS}: it runs, but slower than float32", file=sys.stderr, flush=True)


def warn_hub_if_emulated(device_type: str) -> None:
    """A ``RuntimeWarning`` where the hub's ``bf16=True`` translates slower than float32, shown (by
    Python's default filter) once for each line that calls the hub's ``generate``: fairseq's
    ``sample`` for ``translate`` and ``sample``, or the user's."""
    if emulated(device_type):
        warnings.warn(
            f"bf16=True {WITHOUT_UNITS}: it translates, but slower than float32", RuntimeWarning, stacklevel=3
        )


@contextlib.contextmanager
def autocast(device_type: str):
    """Matrix products in bfloat16 on *device_type* ("cpu" or "cuda"), with PyTorch's math
    attention kernel on a CPU (see the module's docstring)."""
    with (
        torch.autocast(device_type, dtype=DTYPE),
        _math_attention() if device_type == "cpu" else contextlib.nullcontext(),
    ):
        yield


def _math_attention():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])


def in_autocast(function: Callable, device_type: str) -> Callable:
    """*function* called under ``autocast(device_type)``."""

    @functools.wraps(function)
    def in_bf16(*args, **kwargs):
        with autocast(device_type):
            return function(*args, **kwargs)

    return in_bf16


def autocast_training(trainer) -> None:
    """Train *trainer* (fairseq's, built for float32) in bf16: the criterion's forward and the
    task's ``inference_step`` (``--eval-bleu``) run under the autocast; see the module's
    docstring for why there. Instance attributes: the classes, and every other trainer, stay
    as they are."""
    device_type = trainer.device.type
    criterion = trainer.get_criterion()
    criterion.forward = in_autocast(criterion.forward, device_type)
    trainer.task.inference_step = in_autocast(trainer.task.inference_step, device_type)


class _Dropout(torch.autograd.Function):
    """Inverted dropout whose mask comes from ``torch.rand`` (kept where >= p), saved as booleans
    for backward, as ``F.dropout`` saves its mask."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        keep = torch.rand(x.shape, device=x.device) >= p
        ctx.save_for_backward(keep)
        ctx.scale = 1.0 / (1.0 - p)
        return x * keep * ctx.scale

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return grad * keep * ctx.scale, None


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Training-mode dropout with probability *p* (0 <= p < 1), its mask drawn with
    ``torch.rand``: on a CPU twice as fast as ``F.dropout``'s ``bernoulli_`` (forward and
    backward of a 15 x 272 x 256 tensor: 5.1 against 10.5 ms in bfloat16, 5.9 against 11.4 in
    float32, 2 threads)."""
    return _Dropout.apply(x, p)


def fast_dropout_here(x: torch.Tensor) -> bool:
    """*x* is computed under the bf16 autocast on a CPU, where ``dropout`` replaces ``F.dropout``."""
    return x.device.type == "cpu" and torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == DTYPE


_ROWS = 512  # rows of the logits converted to float32 at a time


class _LogSoftmaxFromBf16(torch.autograd.Function):
    """``log_softmax`` over the last dimension in float32 of bfloat16 *logits*, converted a row
    block at a time into the result, where it runs in place; the gradient is computed in float32
    per block and returned in bfloat16."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor) -> torch.Tensor:
        rows = logits.reshape(-1, logits.size(-1))
        out = torch.empty(rows.shape, dtype=torch.float32, device=logits.device)
        for i in range(0, rows.size(0), _ROWS):
            block = out[i : i + _ROWS].copy_(rows[i : i + _ROWS])  # converted where the result goes
            torch.log_softmax(block, dim=-1, out=block)
        ctx.save_for_backward(out)
        ctx.shape, ctx.dtype = logits.shape, logits.dtype
        return out.view(logits.shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (out,) = ctx.saved_tensors
        grad = grad.reshape(out.shape)
        grad_logits = torch.empty(out.shape, dtype=ctx.dtype, device=out.device)
        for i in range(0, out.size(0), _ROWS):
            rows = slice(i, i + _ROWS)
            grad_logits[rows] = torch._log_softmax_backward_data(grad[rows], out[rows], -1, torch.float32)
        return grad_logits.view(ctx.shape)


def log_softmax_from_bf16(logits: torch.Tensor) -> torch.Tensor:
    """float32 log-probabilities over the last dimension of bfloat16 *logits* (see the module's
    docstring)."""
    return _LogSoftmaxFromBf16.apply(logits)
