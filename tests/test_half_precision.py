"""Half precision where fairseq cannot give it: fairseq-train's --fp16, --memory-efficient-fp16
and --amp on a machine without a CUDA GPU stop with one line naming the flag and what to do instead
(with a GPU nothing changes); --bf16 without torch_xla is the plugin's bfloat16 mixed precision on
a CPU or a GPU (tests/test_bf16.py), and with torch_xla fairseq's TPU run."""

from argparse import Namespace

import pytest
import torch
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.trainer import Trainer

from fairseq_realformer.errors import RealformerConfigError
from fairseq_realformer.patches.fixes.half_precision import half_precision_problem

from .cli import TRAIN, run
from .test_compat import FIXTURES

DATA = FIXTURES / "bin"
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="what happens without a CUDA GPU")

REFUSED_WITHOUT_GPU = {
    "--fp16": "--fp16 needs a CUDA GPU, and torch sees none on this machine: leave out --fp16 to train in float32",
    "--memory-efficient-fp16": "--memory-efficient-fp16 needs a CUDA GPU, and torch sees none on this machine: "
    "leave out --memory-efficient-fp16 to train in float32",
    "--amp": "--amp needs a CUDA GPU, and torch sees none on this machine: leave out --amp to train in float32",
}


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


@pytest.mark.parametrize(
    "flag, flags",
    [
        ("--fp16", dict(fp16=True)),
        ("--memory-efficient-fp16", dict(fp16=True, memory_efficient_fp16=True)),
        ("--amp", dict(amp=True)),
    ],
)
def test_nothing_changes_on_a_gpu(flag, flags):
    assert half_precision_problem(common(**flags), cuda=True, xla=False) is None
    assert half_precision_problem(common(**flags, cpu=True), cuda=True, xla=False) == (
        f"{flag} needs a CUDA GPU, and --cpu trains on the CPU: leave out {flag} to train in float32"
    )


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu", "gpu"])
@pytest.mark.parametrize("tpu", [False, True], ids=["hydra", "command-line"])  # fairseq-train's --bf16 sets --tpu
def test_bf16_is_mixed_precision_without_torch_xla_and_a_tpu_run_with_it(cuda, tpu):
    assert half_precision_problem(common(bf16=True, tpu=tpu), cuda=cuda, xla=False) is None
    assert half_precision_problem(common(bf16=True, tpu=tpu, cpu=True), cuda=cuda, xla=False) is None
    assert half_precision_problem(common(bf16=True, tpu=True), cuda=cuda, xla=True) is None  # fairseq's own
    refused = half_precision_problem(common(bf16=True, tpu=tpu, memory_efficient_bf16=True), cuda=cuda, xla=False)
    assert refused.startswith("--memory-efficient-bf16 keeps the weights themselves in bfloat16")


@NO_GPU
def test_fairseq_train_fp16_without_gpu_is_one_line(tmp_path):
    result = run("fairseq-train", DATA, *TRAIN, "--save-dir", tmp_path, "--fp16", check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == f"fairseq-train: error: {REFUSED_WITHOUT_GPU['--fp16']}"
