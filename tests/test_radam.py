"""``--optimizer radam``: torch's RAdam under fairseq's optimizer interface, Adam's flags, fairseq's
half-precision wrapper, and exact resumption from its state."""

import copy

import pytest
import torch
from fairseq import optim, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

import fairseq_realformer  # noqa: F401  (registers radam)

from .helpers import USER_DIR

FLAGS = [
    "--optimizer",
    "radam",
    "--adam-betas",
    "(0.9, 0.98)",
    "--adam-eps",
    "1e-6",
    "--weight-decay",
    "0.01",
    "--lr",
    "3e-3",
]


def config(*extra):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, ["/no/data", "--arch", "transformer", "--user-dir", USER_DIR, *FLAGS, *extra]
    )
    return convert_namespace_to_omegaconf(args)


def parameters(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g).to(dtype)) for shape in ((5, 3), (7,))]


def gradients(step, params):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=g).to(p.dtype) for p in params]


def torch_radam(params):
    return torch.optim.RAdam(
        params, lr=3e-3, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01, decoupled_weight_decay=True
    )


def test_radam_takes_adams_flags_and_updates_as_torch_radam():
    ours, theirs = parameters(), parameters()
    fairseq_radam = optim.build_optimizer(config().optimizer, ours)
    reference = torch_radam(theirs)
    assert type(fairseq_radam.optimizer) is torch.optim.RAdam
    for step in range(12):  # through ρ_t > 5: the first momentum-only steps, then rectified ones
        for p, q, g in zip(ours, theirs, gradients(step, ours)):
            p.grad, q.grad = g.clone(), g.clone()
        fairseq_radam.step()
        reference.step()
        for p, q in zip(ours, theirs):
            assert torch.equal(p, q)
    assert not torch.equal(ours[0], parameters()[0])


def test_resumed_radam_continues_exactly():
    """fairseq-train saves optimizer.state_dict() in the checkpoint and, on --restore-file,
    builds a new optimizer and loads it: the updates go on as if never interrupted."""
    straight = parameters()
    uninterrupted = optim.build_optimizer(config().optimizer, straight)
    first = parameters()
    before = optim.build_optimizer(config().optimizer, first)
    for step in range(10):
        if step == 6:  # save and resume, as a checkpoint does
            state, first = copy.deepcopy(before.state_dict()), [torch.nn.Parameter(p.detach().clone()) for p in first]
            before = optim.build_optimizer(config().optimizer, first)
            before.load_state_dict(state)
        for params, opt in ((straight, uninterrupted), (first, before)):
            for p, g in zip(params, gradients(step, params)):
                p.grad = g
            opt.step()
        for p, q in zip(straight, first):
            assert torch.equal(p, q), step


# fairseq flattens fp16 master weights on a CUDA device; on this CPU the per-parameter mode runs
@pytest.mark.parametrize("flags", [["--bf16"], ["--fp16", "--fp16-no-flatten-grads"]], ids=["bf16", "fp16"])
def test_radam_under_fairseqs_half_precision_wrapper_updates_float32_master_weights(flags):
    dtype = torch.bfloat16 if "--bf16" in flags else torch.float16
    half = parameters(dtype=dtype)
    wrapper = optim.FP16Optimizer.build_optimizer(config(*flags), half)
    master = [torch.nn.Parameter(p.detach().float()) for p in half]
    reference = torch_radam(master)
    for step in range(8):
        grads = gradients(step, half)
        wrapper.zero_grad()  # as fairseq's trainer: also sets the loss scale's inverse for step()
        wrapper.backward(sum((p * g).sum() for p, g in zip(half, grads)).float())  # d loss / d p = g
        wrapper.step()
        for q, g in zip(master, grads):
            q.grad = g.float()
        reference.step()
    fp32 = wrapper.fp32_params  # a flat tensor per device, or one tensor per parameter
    fp32 = list(fp32.values()) if isinstance(fp32, dict) else fp32 if isinstance(fp32, list) else [fp32]
    torch.testing.assert_close(
        torch.cat([t.detach().flatten() for t in fp32]),
        torch.cat([q.detach().flatten() for q in master]),
        rtol=0,
        atol=1e-6,
    )
    for p, q in zip(half, master):  # the half weights are the master weights, rounded
        assert torch.equal(p, q.detach().to(dtype))
