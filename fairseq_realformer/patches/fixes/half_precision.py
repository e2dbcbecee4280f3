"""fairseq's half-precision flags without the hardware they assume: ``--fp16``, ``--amp`` and
``--memory-efficient-fp16`` without a CUDA GPU are refused in one line, and ``--bf16`` without
torch_xla (fairseq's TPU run) is bfloat16 mixed precision on a CPU or a GPU, in fairseq-train,
fairseq-generate, fairseq-interactive and the hub. What bf16 mixed precision is (its autocast,
its refusals, its faster dropout masks and vocabulary ``log_softmax`` on a CPU) is the plugin's
``precision`` module; the fixes here only enter it where fairseq would not."""

import functools
from typing import Optional

import torch
import torch.nn.functional as F

from ...errors import RealformerConfigError, prog
from ...optim import precision


def half_precision_problem(common, cuda: bool, xla: bool) -> Optional[str]:
    """Why fairseq-train cannot train with the precision flags of *common* (fairseq's
    ``cfg.common``, or its argparse namespace) on this machine, or None. *cuda*: torch sees a CUDA
    GPU; *xla*: torch_xla is installed."""
    if common.bf16 and not xla:  # the plugin's bfloat16 mixed precision, on a CPU or a GPU
        return precision.problem(common)
    if common.tpu:  # fairseq's --bf16 with torch_xla: its TPU run
        return None
    flags = [
        flag
        for flag, on in (
            ("--memory-efficient-fp16", common.memory_efficient_fp16),
            ("--fp16", common.fp16),
            ("--amp", common.amp),
        )
        if on
    ]
    if not flags or (cuda and not common.cpu):
        return None
    why = "--cpu trains on the CPU" if cuda else "torch sees none on this machine"
    return f"{flags[0]} needs a CUDA GPU, and {why}: leave out {flags[0]} to train in float32"


def check_precision(trainer_init):
    """fairseq-train's half-precision flags fail without a CUDA GPU deep inside fairseq, or do
    something else than they say: --fp16 in its optimizer (``Torch not compiled with CUDA
    enabled``), while --amp trains in float32 (autocast is off without CUDA) and
    --memory-efficient-fp16 in emulated float16. Refuse them in one line before anything is
    built; with a GPU nothing changes. --bf16 without torch_xla (which fairseq would run as a
    TPU run and fail on; fairseq issue #4696 asks for bf16 on GPUs) trains in bfloat16 mixed
    precision on the trainer's device, CPU or GPU: the trainer is built as for float32
    (``cfg.common.bf16`` off: float32 model, plain optimizer, no loss scaler), then its criterion
    runs under the autocast (``precision.autocast_training``).

    Call site: ``fairseq_cli.train.main`` (fairseq-train, and fairseq-hydra-train's ``pre_main``)
    builds its ``Trainer(cfg, ...)``, which chooses the device and the precision.

    A stock ``transformer`` run: with a CUDA GPU (and without ``--cpu``), or without these
    flags, nothing; the check reads only ``cfg.common``. Without a GPU, --fp16 fails in fairseq
    too (now in one line), while --amp and --memory-efficient-fp16, which fairseq runs in float32
    or emulated float16, are refused as well: a deliberate difference, for every model alike.
    --bf16 trains in bfloat16 mixed precision, where fairseq fails without torch_xla."""

    @functools.wraps(trainer_init)
    def init_checking_precision(self, cfg, *args, **kwargs):
        common = getattr(cfg, "common", cfg)
        problem = half_precision_problem(common, torch.cuda.is_available(), precision.xla_installed())
        if problem is not None:
            raise RealformerConfigError(problem)
        bf16 = precision.requested(common)
        if bf16:  # a float32 trainer, on the device fairseq chooses (not a TPU)
            common.bf16 = common.tpu = False
        trainer_init(self, cfg, *args, **kwargs)
        if bf16:
            precision.warn_if_emulated(self.device.type, prog())
            precision.autocast_training(self)

    return init_checking_precision


def bf16_without_tpu(call_main):
    """fairseq's parser turns ``--bf16`` into ``--tpu``, and ``call_main`` then skips the
    distributed set-up (``infer_init_method`` returns at once for a TPU) and spawns several GPUs
    through torch_xla. Without torch_xla, --bf16 is the plugin's mixed precision on the CPU or the
    GPUs: take ``--tpu`` back off before fairseq reads it (fairseq issue #4696).

    Call site: ``cli_main`` of fairseq-train and fairseq-interactive call
    ``distributed_utils.call_main(cfg, main)`` (fairseq-hydra-train too; its ``common.bf16``
    never turns on ``tpu``).

    A stock ``transformer`` run: nothing without --bf16 (or with torch_xla installed)."""

    @functools.wraps(call_main)
    def call_main_without_tpu_for_bf16(cfg, main, **kwargs):
        if precision.requested(cfg.common):
            cfg.common.tpu = False
        return call_main(cfg, main, **kwargs)

    return call_main_without_tpu_for_bf16


def translate_in_bf16(main):
    """fairseq-generate and fairseq-interactive apply --fp16 to the models (``model.half()``) but
    never --bf16: they would translate in float32 without a word. With --bf16 (and no torch_xla)
    the whole translation runs under the bf16 autocast on its device: the models stay float32
    and the matrix products run in bfloat16; the autocast's bfloat16 copy of each weight is made
    once for the whole run. (No fairseq issue found.)

    Call site: ``cli_main`` calls ``main(args)`` (fairseq-generate) or hands ``main`` to
    ``distributed_utils.call_main`` (fairseq-interactive), looking it up in its module.

    A stock ``transformer``: without --bf16 the same translation; with it, bfloat16's."""

    @functools.wraps(main)
    def main_in_bf16(cfg, *args, **kwargs):
        common = getattr(cfg, "common", cfg)
        if not precision.requested(common):
            return main(cfg, *args, **kwargs)
        precision.check(common)
        common.tpu = False  # fairseq's parser turned it on with --bf16
        device_type = "cuda" if torch.cuda.is_available() and not common.cpu else "cpu"
        precision.warn_if_emulated(device_type, prog())
        with precision.autocast(device_type):
            return main(cfg, *args, **kwargs)

    return main_in_bf16


def hub_generates_in_bf16(generate):
    """The hub interface (``from_pretrained``) translates in bf16 when loaded with ``bf16=True``
    (fairseq's keyword arguments set the loaded configuration: ``cfg.common.bf16``): every
    ``translate``, ``sample`` and ``generate`` then runs under the bf16 autocast on the models'
    device, the models staying float32; on a CPU without bf16 units, with a ``RuntimeWarning``.
    (No fairseq issue found.)

    Call site: ``translate`` and ``sample`` call ``self.generate``.

    A stock ``transformer``'s hub: without ``bf16=True`` nothing changes."""

    @functools.wraps(generate)
    def generate_in_bf16(self, *args, **kwargs):
        common = self.cfg.common
        if not precision.requested(common):
            return generate(self, *args, **kwargs)
        precision.check(common)
        precision.warn_hub_if_emulated(self.device.type)
        with precision.autocast(self.device.type):
            return generate(self, *args, **kwargs)

    return generate_in_bf16


# fairseq scripts its models with TorchScript (``torch.jit.script``: fairseq-generate's export,
# fairseq's own tests), which compiles FairseqDropout.forward and utils.log_softmax from their
# source. The two replacements below are therefore plain, scriptable functions that repeat
# fairseq's few lines; the Python-only bf16 branch sits behind ``torch.jit.is_scripting()``, and
# its helpers are ``torch.jit.unused`` (compiled as a stub that is never reached).


@torch.jit.unused
def _fast_dropout_here(x: torch.Tensor) -> bool:
    return precision.fast_dropout_here(x)


@torch.jit.unused
def _fast_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    return precision.dropout(x, p)


def _dropout_with_fast_masks_in_bf16(self, x, inplace: bool = False):
    """FairseqDropout.forward (fairseq's lines), with masks from ``precision.dropout`` under
    the bf16 autocast on a CPU."""
    if self.p > 0 and (self.training or self.apply_during_inference):
        if not torch.jit.is_scripting() and _fast_dropout_here(x):
            return _fast_dropout(x, self.p)
        return F.dropout(x, p=self.p, training=True, inplace=inplace)
    else:
        return x


def fast_dropout_in_bf16(forward):
    """fairseq's dropout (``FairseqDropout``: every fairseq layer's, and the plugin's) draws its
    masks with ``precision.dropout`` under the bf16 autocast on a CPU, twice as fast as
    ``F.dropout``'s ``bernoulli_``, which took 16 % of a bf16 update at the quality study's size
    (``precision``'s docstring). Same keep probability and scaling; other random draws. (A speed
    fix for the plugin's bf16; no fairseq issue.)

    Call site: every module calls its ``dropout_module(x)`` (``nn.Module.__call__`` looks
    ``forward`` up on the class).

    A stock ``transformer`` run: without --bf16, or on a GPU, fairseq's own lines run (and are
    what TorchScript compiles); in bf16 on a CPU, the masks come from ``torch.rand``."""
    return _dropout_with_fast_masks_in_bf16


@torch.jit.unused
def _bf16_logits_on_cpu(x: torch.Tensor, dim: int) -> bool:
    return x.dtype == precision.DTYPE and x.device.type == "cpu" and dim in (-1, x.dim() - 1)


@torch.jit.unused
def _blocked_log_softmax(x: torch.Tensor) -> torch.Tensor:
    return precision.log_softmax_from_bf16(x)


def _log_softmax_in_blocks_from_bf16(x, dim: int, onnx_trace: bool = False):
    """fairseq.utils.log_softmax (fairseq's lines), from bfloat16 logits on a CPU in row blocks."""
    if not torch.jit.is_scripting() and not onnx_trace and _bf16_logits_on_cpu(x, dim):
        return _blocked_log_softmax(x)
    if onnx_trace:
        return F.log_softmax(x.float(), dim=dim)
    else:
        return F.log_softmax(x, dim=dim, dtype=torch.float32)


def log_softmax_from_bf16(log_softmax):
    """The decoders' log-probabilities from bfloat16 logits (the bf16 autocast's output
    projection) on a CPU: ``precision.log_softmax_from_bf16``, the same float32 values bit for
    bit and a bfloat16 gradient, faster. (A speed fix for the plugin's bf16; no fairseq issue.)

    Call site: ``FairseqDecoder.get_normalized_probs_scriptable`` calls ``utils.log_softmax``
    (every fairseq decoder's ``get_normalized_probs``).

    A stock ``transformer`` run: float32 logits (no --bf16), or a GPU, run fairseq's own lines
    (and TorchScript compiles them)."""
    return _log_softmax_in_blocks_from_bf16
