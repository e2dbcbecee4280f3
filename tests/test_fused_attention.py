"""The fused residual attention (one ``scaled_dot_product_attention`` call per layer, the carried
scores as its additive bias) computes what the eager score chain computes: outputs and every
gradient in float64, incremental decoding, beam search, LayerDrop, half-precision carries, and the
same dropout distribution. On a machine with CUDA the same checks also run there, in float32
(PyTorch's memory-efficient kernel, the one the fused path is pinned to)."""

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_realformer.errors import RealformerConfigError
from fairseq_realformer.modules import ResidualMultiheadAttention
from fairseq_realformer.modules.residual_attention import Carried

from .helpers import BACKBONES, VALUE_RESIDUAL, make_dictionary, perturb_, random_batch, realformer

DICT = make_dictionary()
SRC_LENS, TGT_LENS = [6, 9, 4], [5, 7, 3]
CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))
DEVICES = ["cpu", CUDA]
# float64 on the CPU: equal to round-off. float32 on CUDA: the kernels sum in another order.
DTYPE = {"cpu": torch.float64, "cuda": torch.float32}
TOLERANCE = {"cpu": 1e-10, "cuda": 2e-5}


def pair(*flags, device="cpu", seed=0):
    """The same model (same weights) twice: residual attention eager, and fused."""
    models = []
    for kernel in ("eager", "fused"):
        model = perturb_(realformer(*flags, "--residual-attention-kernel", kernel, dictionary=DICT, seed=seed))
        models.append(model.to(device=device, dtype=DTYPE[device]))
    return models


def train_step(model, batch, seed=0):
    """Logits of one training forward pass, and every parameter's gradient of their sum."""
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # LayerDrop draws its layers from the global generator
    logits, _ = model(*batch)
    (logits * torch.linspace(-1, 1, logits.size(-1), device=logits.device, dtype=logits.dtype)).sum().backward()
    return logits.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def assert_same_step(eager, fused, batch, device, seed=0):
    want_logits, want_grads = train_step(eager, batch, seed)
    got_logits, got_grads = train_step(fused, batch, seed)
    tol = TOLERANCE[device]
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=tol * want_logits.abs().max().item())
    assert got_grads.keys() == want_grads.keys()
    # relative to the largest gradient: some are exactly zero in exact arithmetic (a key bias
    # shifts every score of a row alike), where either path leaves only its own round-off
    scale = max(g.abs().max().item() for g in want_grads.values())
    for name, want in want_grads.items():
        torch.testing.assert_close(got_grads[name], want, rtol=0, atol=tol * scale, msg=name)


def on(device, *tensors):
    return tuple(t.to(device) for t in tensors)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value_residual", VALUE_RESIDUAL)
@pytest.mark.parametrize("backbone", BACKBONES)
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_outputs_and_gradients_equal_the_eager_chain(mode, backbone, value_residual, device):
    eager, fused = pair("all", mode, backbone, *VALUE_RESIDUAL[value_residual], device=device)
    batch = on(device, *random_batch(DICT, SRC_LENS, TGT_LENS))
    assert_same_step(eager, fused, batch, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paths", ["encoder", "decoder", "cross", "encoder,cross", "none"])
def test_each_path_alone_and_paths_off(paths, device):
    """A path off keeps fairseq's own attention; value residual alone uses the fused kernel."""
    eager, fused = pair(paths, "mean", "admin", *VALUE_RESIDUAL["vr-learned"], device=device)
    batch = on(device, *random_batch(DICT, SRC_LENS, TGT_LENS))
    assert_same_step(eager, fused, batch, device)


@pytest.mark.parametrize("device", DEVICES)
def test_layerdrop_drops_the_same_layers_and_counts_them_alike(device):
    flags = [
        "--encoder-layers",
        "4",
        "--decoder-layers",
        "4",
        "--encoder-layerdrop",
        "0.5",
        "--decoder-layerdrop",
        "0.5",
    ]
    eager, fused = pair("all", "mean", "admin", *flags, device=device)
    batch = on(device, *random_batch(DICT, SRC_LENS, TGT_LENS))
    for seed in range(3):  # different layers dropped each time
        assert_same_step(eager, fused, batch, device, seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "mode, backbone, value_residual", [("mean", "admin", "no-vr"), ("sum", "resi-dual", "vr-learned")]
)
def test_incremental_decoding_equals_the_full_forward_pass(mode, backbone, value_residual, device):
    eager, fused = (m.eval() for m in pair("all", mode, backbone, *VALUE_RESIDUAL[value_residual], device=device))
    src, src_len, prev = on(device, *random_batch(DICT, SRC_LENS, [7, 7, 7]))
    full, _ = eager.decoder(prev, encoder_out=eager.encoder(src, src_lengths=src_len))
    encoder_out = fused.encoder(src, src_lengths=src_len)
    state = {}
    for t in range(prev.size(1)):
        step, _ = fused.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
        torch.testing.assert_close(step[:, 0], full[:, t], rtol=0, atol=TOLERANCE[device] * full.abs().max().item())


@pytest.mark.parametrize("device", DEVICES)
def test_beam_search_finds_the_same_hypotheses_with_the_same_scores(device):
    """Beam 4 (beamable cross-attention: a sentence's hypotheses share its keys) and the
    alignment, which the last cross-attention layer answers from the eager chain."""
    eager, fused = (m.eval() for m in pair("all", "mean", "admin", device=device, seed=3))
    src, src_len, _ = on(device, *random_batch(DICT, SRC_LENS, TGT_LENS))
    sample = {"net_input": {"src_tokens": src, "src_lengths": src_len}}
    found = []
    for model in (eager, fused):
        generator = SequenceGenerator([model], DICT, beam_size=4, max_len_a=0, max_len_b=8)
        found.append(generator.forward(sample))
    for want_sentence, got_sentence in zip(*found):
        for want, got in zip(want_sentence, got_sentence):
            assert torch.equal(got["tokens"], want["tokens"])
            atol = 1e-6 if device == "cpu" else 1e-5  # float32 on CUDA: 1.4e-6 seen on an H100
            torch.testing.assert_close(got["positional_scores"], want["positional_scores"], rtol=0, atol=atol)
            torch.testing.assert_close(got["attention"], want["attention"], rtol=0, atol=atol)


def module_pair(**kwargs):
    torch.manual_seed(0)
    eager = ResidualMultiheadAttention(16, 4, self_attention=True, kernel="eager", **kwargs)
    fused = ResidualMultiheadAttention(16, 4, self_attention=True, kernel="fused", **kwargs)
    fused.load_state_dict(eager.state_dict())
    return eager, fused


def test_asking_for_the_probabilities_takes_the_eager_chain():
    """need_weights / need_head_weights (the alignment, the analysis tool) get the probabilities
    the layer used, from the eager chain, whatever the kernel."""
    eager, fused = module_pair(running_mean=True)
    x, prev = torch.randn(5, 2, 16), torch.randn(8, 5, 5)
    want = eager(x, x, x, carried=Carried(prev), depth=3, need_head_weights=True)
    got = fused(x, x, x, carried=Carried(prev), depth=3, need_head_weights=True)
    assert got.weights is not None and torch.equal(got.weights, want.weights)
    assert torch.equal(got.output, want.output) and torch.equal(got.carried.scores, want.carried.scores)


@pytest.mark.parametrize("running_mean", [False, True])
def test_hands_on_the_unmasked_sum(running_mean):
    """S_n, handed on, is the unmasked, undivided sum, as the eager chain hands it on; the
    carried tensor is not modified."""
    eager, fused = module_pair(running_mean=running_mean)
    x, prev = torch.randn(5, 2, 16, dtype=torch.float64), torch.randn(8, 5, 5, dtype=torch.float64)
    eager, fused = eager.double(), fused.double()
    padding = torch.tensor([[False] * 5, [False, False, False, True, True]])  # right-padded, as decoder inputs
    mask = torch.full((5, 5), float("-inf")).triu(1).double()
    before = prev.clone()
    want = eager(x, x, x, key_padding_mask=padding, attn_mask=mask, carried=Carried(prev), depth=2)
    got = fused(x, x, x, key_padding_mask=padding, attn_mask=mask, carried=Carried(prev), depth=2)
    assert torch.equal(prev, before)
    assert torch.isfinite(got.carried.scores).all()
    torch.testing.assert_close(got.carried.scores, want.carried.scores, rtol=0, atol=1e-12)
    torch.testing.assert_close(got.output, want.output, rtol=0, atol=1e-12)


def test_float16_bias_beyond_float16s_range_stays_finite():
    """A carried sum beyond float16's 65504 (kept in float32) still gives finite outputs: the bias
    is shifted per row, which softmax does not see."""
    eager, fused = (m.half() for m in module_pair())
    x = torch.randn(5, 2, 16).half()
    prev = torch.full((8, 5, 5), 70000.0)
    prev[:, :, 0] += 1.0  # a real difference on top of the huge common part
    want = eager(x, x, x, carried=Carried(prev), depth=2)
    got = fused(x, x, x, carried=Carried(prev), depth=2)
    assert got.carried.scores.dtype == torch.float32 and torch.isfinite(got.output).all()
    torch.testing.assert_close(got.output.float(), want.output.float(), rtol=0, atol=2e-2)


def test_attention_dropout_has_the_eager_distribution():
    """Dropout inside the fused kernel draws other masks than the eager chain, from the same
    distribution: over many draws of the same inputs, the mean and the variance of each output
    agree (within their sampling error) with the eager chain's."""
    eager, fused = module_pair(running_mean=True, dropout=0.3)
    eager.train(), fused.train()
    x, prev = torch.randn(6, 1, 16, dtype=torch.float64), torch.randn(4, 6, 6, dtype=torch.float64)
    eager, fused = eager.double(), fused.double()
    draws = 2000
    outputs = {}
    with torch.no_grad():
        for name, module in (("eager", eager), ("fused", fused)):
            torch.manual_seed(1)
            xs = x.expand(6, draws, 16)  # every batch row the same input: a draw per row
            outputs[name] = module(xs, xs, xs, carried=Carried(prev.repeat(draws, 1, 1)), depth=2).output
    mean = {k: v.mean(dim=1) for k, v in outputs.items()}
    var = {k: v.var(dim=1) for k, v in outputs.items()}
    standard_error = (var["eager"] / draws).sqrt()
    assert ((mean["fused"] - mean["eager"]).abs() / standard_error).max() < 5
    ratio = var["fused"] / var["eager"]
    assert 0.8 < ratio.median() < 1.25 and ((ratio > 0.7) & (ratio < 1.4)).float().mean() > 0.95
    # and without dropout both give the one deterministic output, which the means estimate
    eager.eval()
    exact = eager(x, x, x, carried=Carried(prev), depth=2).output[:, 0].detach()
    assert ((mean["fused"] - exact).abs() / standard_error).max() < 5


def test_kernel_flag_reaches_every_residual_module_and_refuses_other_values():
    model = realformer("all", "mean", "admin", "--residual-attention-kernel", "fused", dictionary=DICT)
    kernels = {m.kernel for m in model.modules() if isinstance(m, ResidualMultiheadAttention)}
    assert kernels == {"fused"}
    assert {m.kernel for m in realformer(dictionary=DICT).modules() if isinstance(m, ResidualMultiheadAttention)} == {
        "auto"
    }
    with pytest.raises(
        RealformerConfigError, match="--residual-attention-kernel flash: choose from auto, fused, eager"
    ):
        realformer("all", "mean", "admin", "--residual-attention-kernel", "flash", dictionary=DICT)


def test_auto_is_eager_until_the_fused_kernel_measures_faster():
    module = ResidualMultiheadAttention(16, 4, self_attention=True)
    assert module.kernel == "auto" and not module._fused()
