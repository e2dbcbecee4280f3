"""Both fused residual attentions (one ``scaled_dot_product_attention`` call per layer: ``fused``,
the carried scores as its additive bias; ``concat``, the concatenated queries and keys of the
path's layers so far) compute what the eager score chain computes: outputs and every gradient in
float64, incremental decoding, beam search, LayerDrop, half-precision carries, and the same
dropout distribution. On a machine with CUDA the same checks also run there, in float32
(PyTorch's memory-efficient kernel, the one both are pinned to)."""

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_realformer.errors import RealformerConfigError
from fairseq_realformer.modules import ResidualMultiheadAttention
from fairseq_realformer.modules.residual_attention import Carried
from fairseq_realformer.modules.score_factors import ScoreFactors

from .helpers import BACKBONES, VALUE_RESIDUAL, make_dictionary, perturb_, random_batch, realformer

DICT = make_dictionary()
SRC_LENS, TGT_LENS = [6, 9, 4], [5, 7, 3]
CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))
DEVICES = ["cpu", CUDA]
# float64 on the CPU: equal to round-off. float32 on CUDA: the kernels sum in another order.
DTYPE = {"cpu": torch.float64, "cuda": torch.float32}
TOLERANCE = {"cpu": 1e-10, "cuda": 2e-5}
FUSED_KERNELS = ["fused", "concat"]


def pair(*flags, device="cpu", seed=0, kernel="fused"):
    """The same model (same weights) twice: residual attention eager, and run by *kernel*."""
    models = []
    for run_by in ("eager", kernel):
        model = perturb_(realformer(*flags, "--residual-attention-kernel", run_by, dictionary=DICT, seed=seed))
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
@pytest.mark.parametrize("kernel", FUSED_KERNELS)
@pytest.mark.parametrize("value_residual", VALUE_RESIDUAL)
@pytest.mark.parametrize("backbone", BACKBONES)
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_outputs_and_gradients_equal_the_eager_chain(mode, backbone, value_residual, kernel, device):
    eager, fused = pair("all", mode, backbone, *VALUE_RESIDUAL[value_residual], device=device, kernel=kernel)
    batch = on(device, *random_batch(DICT, SRC_LENS, TGT_LENS))
    assert_same_step(eager, fused, batch, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", FUSED_KERNELS)
@pytest.mark.parametrize("paths", ["encoder", "decoder", "cross", "encoder,cross", "none"])
def test_each_path_alone_and_paths_off(paths, kernel, device):
    """A path off keeps fairseq's own attention; value residual alone uses the fused kernel."""
    eager, fused = pair(paths, "mean", "admin", *VALUE_RESIDUAL["vr-learned"], device=device, kernel=kernel)
    batch = on(device, *random_batch(DICT, SRC_LENS, TGT_LENS))
    assert_same_step(eager, fused, batch, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", FUSED_KERNELS)
def test_layerdrop_drops_the_same_layers_and_counts_them_alike(kernel, device):
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
    eager, fused = pair("all", "mean", "admin", *flags, device=device, kernel=kernel)
    batch = on(device, *random_batch(DICT, SRC_LENS, TGT_LENS))
    for seed in range(3):  # different layers dropped each time
        assert_same_step(eager, fused, batch, device, seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", FUSED_KERNELS)
@pytest.mark.parametrize(
    "mode, backbone, value_residual", [("mean", "admin", "no-vr"), ("sum", "resi-dual", "vr-learned")]
)
def test_incremental_decoding_equals_the_full_forward_pass(mode, backbone, value_residual, kernel, device):
    """The eager model's full forward pass against *kernel*'s decoding steps (concat decodes
    eagerly: its steps carry the scores' rows)."""
    flags = ("all", mode, backbone, *VALUE_RESIDUAL[value_residual])
    eager, fused = (m.eval() for m in pair(*flags, device=device, kernel=kernel))
    src, src_len, prev = on(device, *random_batch(DICT, SRC_LENS, [7, 7, 7]))
    full, _ = eager.decoder(prev, encoder_out=eager.encoder(src, src_lengths=src_len))
    encoder_out = fused.encoder(src, src_lengths=src_len)
    state = {}
    for t in range(prev.size(1)):
        step, _ = fused.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
        torch.testing.assert_close(step[:, 0], full[:, t], rtol=0, atol=TOLERANCE[device] * full.abs().max().item())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", FUSED_KERNELS)
def test_beam_search_finds_the_same_hypotheses_with_the_same_scores(kernel, device):
    """Beam 4 (beamable cross-attention: a sentence's hypotheses share its keys) and the
    alignment, which the last cross-attention layer answers from the eager chain."""
    eager, fused = (m.eval() for m in pair("all", "mean", "admin", device=device, seed=3, kernel=kernel))
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


def module_pair(kernel="fused", **kwargs):
    torch.manual_seed(0)
    eager = ResidualMultiheadAttention(16, 4, self_attention=True, kernel="eager", **kwargs)
    fused = ResidualMultiheadAttention(16, 4, self_attention=True, kernel=kernel, **kwargs)
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
    mean, standard_error = assert_same_distribution(outputs, "fused")
    # and without dropout both give the one deterministic output, which the means estimate
    eager.eval()
    exact = eager(x, x, x, carried=Carried(prev), depth=2).output[:, 0].detach()
    assert ((mean - exact).abs() / standard_error).max() < 5


def assert_same_distribution(outputs, kernel):
    """Over the draws (dim 1), each output's mean and variance under *kernel* agree with the eager
    chain's within their sampling error. Returns *kernel*'s means and the eager ones' standard error."""
    draws = outputs["eager"].size(1)
    mean = {k: v.mean(dim=1) for k, v in outputs.items()}
    var = {k: v.var(dim=1) for k, v in outputs.items()}
    standard_error = (var["eager"] / draws).sqrt()
    assert ((mean[kernel] - mean["eager"]).abs() / standard_error).max() < 5
    ratio = var[kernel] / var["eager"]
    assert 0.8 < ratio.median() < 1.25 and ((ratio > 0.7) & (ratio < 1.4)).float().mean() > 0.95
    return mean[kernel], standard_error


def test_kernel_flag_reaches_every_residual_module_and_refuses_other_values():
    model = realformer("all", "mean", "admin", "--residual-attention-kernel", "fused", dictionary=DICT)
    kernels = {m.kernel for m in model.modules() if isinstance(m, ResidualMultiheadAttention)}
    assert kernels == {"fused"}
    assert {m.kernel for m in realformer(dictionary=DICT).modules() if isinstance(m, ResidualMultiheadAttention)} == {
        "auto"
    }
    with pytest.raises(
        RealformerConfigError, match="--residual-attention-kernel flash: choose from auto, fused, concat, eager"
    ):
        realformer("all", "mean", "admin", "--residual-attention-kernel", "flash", dictionary=DICT)


def test_auto_is_eager_until_the_fused_kernel_measures_faster():
    module = ResidualMultiheadAttention(16, 4, self_attention=True)
    assert module.kernel == "auto" and not module._fused()


def run_path(modules, x, **kwargs):
    """*modules* as consecutive self-attention layers of one path over the same input *x*: the
    outputs and the last ``Carried``."""
    carried, outputs = Carried(), []
    for depth, module in enumerate(modules, start=1):
        attended = module(x, x, x, carried=carried, depth=depth, **kwargs)
        outputs.append(attended.output)
        carried = attended.carried
    return outputs, carried


def path_pair(layers=3, path_layers=None, **kwargs):
    """*layers* eager modules and as many concat ones with the same weights, in float64."""
    torch.manual_seed(0)
    eager = [ResidualMultiheadAttention(16, 4, self_attention=True, kernel="eager", **kwargs) for _ in range(layers)]
    concat = [
        ResidualMultiheadAttention(16, 4, self_attention=True, kernel="concat", path_layers=path_layers, **kwargs)
        for _ in range(layers)
    ]
    for e, c in zip(eager, concat):
        c.load_state_dict(e.state_dict())
    return [m.double() for m in eager], [m.double() for m in concat]


PADDING = torch.tensor([[False] * 5, [False, False, False, True, True]])  # right-padded, as decoder inputs
FUTURE = torch.full((5, 5), float("-inf")).triu(1).double()


@pytest.mark.parametrize("running_mean", [False, True])
def test_concat_hands_on_factors_whose_product_is_the_unmasked_sum(running_mean):
    """Under concat a layer hands on [Q_1‖…‖Q_n] and [K_1‖…‖K_n]: their product is the eager
    chain's S_n, unmasked and undivided; the outputs and the input's gradient are the eager
    chain's; and every layer's factors are views of one buffer per factor (what keeps the memory
    O(N))."""
    eager, concat = path_pair(path_layers=3, running_mean=running_mean)
    x = torch.randn(5, 2, 16, dtype=torch.float64)
    masks = {"key_padding_mask": PADDING, "attn_mask": FUTURE}
    xs = [x.clone().requires_grad_() for _ in range(2)]
    want, want_carried = run_path(eager, xs[0], **masks)
    got, got_carried = run_path(concat, xs[1], **masks)
    factors = got_carried.factors
    assert got_carried.scores is None and isinstance(factors, ScoreFactors) and factors.layers == 3
    product = torch.bmm(factors.per_head(factors.queries), factors.per_head(factors.keys).transpose(1, 2))
    torch.testing.assert_close(product * concat[0].scaling, want_carried.scores, rtol=0, atol=1e-12)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    weights = torch.linspace(-1, 1, 16, dtype=torch.float64)
    for out in (got, want):
        sum((o * weights).sum() for o in out).backward()
    torch.testing.assert_close(xs[1].grad, xs[0].grad, rtol=0, atol=1e-12)
    carried, layers = Carried(), []
    for depth, module in enumerate(concat, start=1):
        carried = module(x, x, x, carried=carried, depth=depth).carried
        layers.append(carried.factors)
    for name in ("queries", "keys"):
        assert len({getattr(f, name).untyped_storage().data_ptr() for f in layers}) == 1  # one buffer per factor


@pytest.mark.parametrize("path_layers", [None, 1, 2])
def test_concat_buffers_grow_for_a_deeper_path_and_branch(path_layers):
    """A path deeper than its buffers were made for (or of unknown depth) grows them, and a
    layer's factors extended twice (a path that branches) give each branch its own: the same
    numbers as the eager chain either way."""
    eager, concat = path_pair(layers=4, path_layers=path_layers, running_mean=True)
    x = torch.randn(5, 2, 16, dtype=torch.float64)
    want, want_carried = run_path(eager, x, key_padding_mask=PADDING)
    got, got_carried = run_path(concat, x, key_padding_mask=PADDING)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    _, two = run_path(concat[:2], x, key_padding_mask=PADDING)
    first = concat[2](x, x, x, key_padding_mask=PADDING, carried=two, depth=3)
    second = concat[3](x, x, x, key_padding_mask=PADDING, carried=two, depth=3)  # the same layer 2 extended again
    _, eager_two = run_path(eager[:2], x, key_padding_mask=PADDING)
    for module, got_branch in ((eager[2], first), (eager[3], second)):
        want_branch = module(x, x, x, key_padding_mask=PADDING, carried=eager_two, depth=3)
        torch.testing.assert_close(got_branch.output, want_branch.output, rtol=0, atol=1e-12)


def test_concat_asked_for_the_probabilities_runs_the_eager_chain_over_the_factors():
    """need_head_weights under concat: the probabilities of softmax(S_n/n + mask), S_n the
    factors' product, and the output that goes with them."""
    eager, concat = path_pair(running_mean=True)
    x = torch.randn(5, 2, 16, dtype=torch.float64)
    want, want_carried = run_path(eager[:2], x, key_padding_mask=PADDING)
    got, got_carried = run_path(concat[:2], x, key_padding_mask=PADDING)
    want = eager[2](x, x, x, key_padding_mask=PADDING, carried=want_carried, depth=3, need_head_weights=True)
    got = concat[2](x, x, x, key_padding_mask=PADDING, carried=got_carried, depth=3, need_head_weights=True)
    torch.testing.assert_close(got.weights, want.weights, rtol=0, atol=1e-12)
    torch.testing.assert_close(got.output, want.output, rtol=0, atol=1e-12)
    assert got.carried.factors.layers == 3


def test_concat_attention_dropout_has_the_eager_distribution():
    """Dropout inside the kernel under concat, as under fused: over many draws of the same
    inputs, each output's mean and variance agree with the eager chain's."""
    eager, concat = path_pair(layers=2, running_mean=True, dropout=0.3)
    x = torch.randn(6, 1, 16, dtype=torch.float64)
    draws = 2000
    xs = x.expand(6, draws, 16)  # every batch row the same input: a draw per row
    outputs = {}
    with torch.no_grad():
        for name, (first, second) in (("eager", eager), ("concat", concat)):
            first.eval(), second.train()
            carried = first(xs, xs, xs, depth=1).carried
            torch.manual_seed(1)
            outputs[name] = second(xs, xs, xs, carried=carried, depth=2).output
    assert_same_distribution(outputs, "concat")


def saved_bytes(fn):
    """Bytes autograd keeps for backward while *fn* runs (distinct storages, held till the end: a
    freed one's address could be reused)."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storage.nbytes() for storage in storages.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the CPU's attention saves its own copies")
def test_concat_keeps_memory_linear_in_depth_on_cuda():
    """On CUDA the kernel saves the factors' views: twice the layers, about twice the saved
    bytes (concatenating afresh at every layer would keep N²/2 head widths: 3.6x from 4 to 8)."""

    def saved(layers):
        modules = [
            ResidualMultiheadAttention(64, 1, self_attention=True, kernel="concat", path_layers=layers).cuda()
            for _ in range(layers)
        ]
        x = torch.randn(64, 8, 64, device="cuda", requires_grad=True)
        return saved_bytes(lambda: run_path(modules, x))

    assert saved(8) / saved(4) < 2.3
