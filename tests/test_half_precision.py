"""Half precision where fairseq cannot give it: fairseq-train's --fp16, --bf16,
--memory-efficient-fp16/bf16 and --amp on a machine without a CUDA GPU stop with one line naming the
flag and what to do instead (with a GPU nothing changes); fairseq-generate says that it ignores
--bf16 and translates exactly as in float32."""
from argparse import Namespace

import pytest
import torch
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.trainer import Trainer

from fairseq_realformer.errors import RealformerConfigError
from fairseq_realformer.fairseq_patches import _half_precision_problem

from .cli import TRAIN, run
from .helpers import USER_DIR
from .test_compat import EXPECTED, FIXTURES, assert_same_translations

DATA = FIXTURES / "bin"
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="what happens without a CUDA GPU")

REFUSED_WITHOUT_GPU = {
    "--fp16": "--fp16 needs a CUDA GPU, and torch sees none on this machine: leave out --fp16 to train in float32",
    "--memory-efficient-fp16": "--memory-efficient-fp16 needs a CUDA GPU, and torch sees none on this machine: "
                               "leave out --memory-efficient-fp16 to train in float32",
    "--amp": "--amp needs a CUDA GPU, and torch sees none on this machine: leave out --amp to train in float32",
    # fairseq-train turns --bf16 into a TPU run
    "--bf16": "--bf16 makes fairseq-train train on a TPU (fairseq turns on --tpu with it), which needs torch_xla, "
              "not installed here: leave it out to train in float32",
    "--memory-efficient-bf16": "--memory-efficient-bf16 makes fairseq-train train on a TPU (fairseq turns on --tpu "
                               "with it), which needs torch_xla, not installed here: leave it out to train in float32",
}  # fmt: skip


def training_config(*flags):
    """fairseq-train's configuration for these flags, as fairseq_cli.train.main receives it."""
    return convert_namespace_to_omegaconf(
        options.parse_args_and_arch(options.get_training_parser(), [str(DATA), *TRAIN, *flags])
    )


@NO_GPU
@pytest.mark.parametrize("flag", REFUSED_WITHOUT_GPU)
def test_half_precision_without_gpu_is_refused_before_training(flag):
    """The Trainer (what fairseq-train and fairseq-hydra-train build) refuses before it builds anything."""
    with pytest.raises(RealformerConfigError) as error:
        Trainer(training_config(flag), task=None, model=None, criterion=None)
    assert str(error.value) == REFUSED_WITHOUT_GPU[flag]


def common(**flags):
    """fairseq's cfg.common with these precision flags on (and what fairseq derives from them)."""
    names = ("fp16", "memory_efficient_fp16", "bf16", "memory_efficient_bf16", "amp", "tpu", "cpu")
    return Namespace(**{name: flags.get(name, False) for name in names})


@pytest.mark.parametrize("flag, flags", [
    ("--fp16", dict(fp16=True)), ("--memory-efficient-fp16", dict(fp16=True, memory_efficient_fp16=True)),
    ("--amp", dict(amp=True)),
    # fairseq-hydra-train's common.bf16 (no --tpu): trains on a GPU
    ("--bf16", dict(bf16=True)), ("--memory-efficient-bf16", dict(bf16=True, memory_efficient_bf16=True)),
])  # fmt: skip
def test_nothing_changes_on_a_gpu(flag, flags):
    assert _half_precision_problem(common(**flags), cuda=True, xla=False) is None
    assert _half_precision_problem(common(**flags, cpu=True), cuda=True, xla=False) == (
        f"{flag} needs a CUDA GPU, and --cpu trains on the CPU: leave out {flag} to train in float32"
    )


def test_bf16_on_a_tpu_is_left_to_fairseq():
    assert _half_precision_problem(common(bf16=True, tpu=True), cuda=False, xla=True) is None
    on_gpu = _half_precision_problem(common(bf16=True, tpu=True), cuda=True, xla=False)
    assert on_gpu.endswith("not installed here: on a GPU use --fp16 or --amp instead")


@NO_GPU
def test_fairseq_train_fp16_without_gpu_is_one_line(tmp_path):
    result = run("fairseq-train", DATA, *TRAIN, "--save-dir", tmp_path, "--fp16", check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == f"fairseq-train: error: {REFUSED_WITHOUT_GPU['--fp16']}"


def test_fairseq_generate_says_it_ignores_bf16():
    result = run("fairseq-generate", DATA, "--user-dir", USER_DIR, "--path", FIXTURES / "ckpt-pre-ln" / "checkpoint_last.pt",
                 "--beam", "4", "--batch-size", "8", "--max-len-b", "12", "--bf16")  # fmt: skip
    assert ("fairseq-generate: warning: --bf16 is ignored: fairseq-generate translates in float32 "
            "(in float16 with --fp16, on a GPU or a CPU)") in result.stderr.splitlines()  # fmt: skip
    assert_same_translations(result.stdout, EXPECTED["pre-ln"]["generate"])  # float32's translations and scores
