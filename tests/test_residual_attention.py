"""The attention core: what it computes, what it hands on, and that it is fairseq's when off."""

import math

import pytest
import torch
from fairseq.modules import MultiheadAttention

from fairseq_realformer.modules import ResidualMultiheadAttention
from fairseq_realformer.modules.residual_attention import Attended, Carried, PlainMultiheadAttention
from fairseq_realformer.optim.precision import autocast

from .helpers import rounding

EMBED, HEADS, B, T, S = 16, 4, 3, 5, 7


def assert_same_attention(got, want, msg=None, scale=None):
    """*got* is *want* (tensors, or an answer's tuples of them) to float32's rounding through one
    attention (tests.helpers.rounding) of values of size *scale* (by default *want*'s): the
    projections, the scores, softmax and weighted sum over at most S keys, the output projection."""
    if isinstance(want, tuple):  # Attended, Carried
        for g, w in zip(got, want, strict=True):
            assert_same_attention(g, w, msg)
    elif want is None:
        assert got is None, msg
    else:
        atol = rounding(EMBED, EMBED // HEADS, S, S, EMBED, scale=want.abs().max() if scale is None else scale)
        torch.testing.assert_close(got, want, rtol=0, atol=atol, msg=msg)


def pair(seed=0, **kwargs):
    """fairseq's attention and ours, with the same (perturbed) weights."""
    torch.manual_seed(seed)
    theirs = MultiheadAttention(EMBED, HEADS, **kwargs).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    ours = ResidualMultiheadAttention(EMBED, HEADS, **kwargs).eval()
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def padding(lengths, width, left=True):
    """Key padding mask (True = pad): encoder sources are left-padded, decoder inputs right-padded."""
    positions = torch.arange(width).unsqueeze(0)
    lengths = torch.tensor(lengths).unsqueeze(1)
    return positions < width - lengths if left else positions >= lengths


def future_mask(n):
    return torch.full((n, n), float("-inf")).triu(1)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_self_attention_without_prev_is_fairseqs(train):
    theirs, ours = pair(self_attention=True)
    theirs.train(train), ours.train(train)
    x = torch.randn(T, B, EMBED)
    kpm = padding([5, 3, 4], T, left=False)
    mask = future_mask(T)
    want, _ = theirs(x, x, x, key_padding_mask=kpm, attn_mask=mask.clone(), need_weights=False)
    got, _, _ = ours(x, x, x, key_padding_mask=kpm, attn_mask=mask.clone())
    assert_same_attention(got, want)


@pytest.mark.parametrize("need_head_weights", [False, True], ids=["head-averaged", "per-head"])
def test_cross_attention_without_prev_is_fairseqs(need_head_weights):
    theirs, ours = pair(encoder_decoder_attention=True)
    q, enc = torch.randn(T, B, EMBED), torch.randn(S, B, EMBED)
    kpm = padding([7, 2, 5], S)
    want, want_w = theirs(
        q, enc, enc, key_padding_mask=kpm, static_kv=True, need_weights=True, need_head_weights=need_head_weights
    )
    got, got_w, _ = ours(
        q, enc, enc, key_padding_mask=kpm, static_kv=True, need_weights=True, need_head_weights=need_head_weights
    )
    assert_same_attention(got, want)
    assert_same_attention(got_w, want_w)
    assert got_w.shape == ((HEADS, B, T, S) if need_head_weights else (B, T, S))


@pytest.mark.parametrize("kind", ["self", "cross"])
def test_incremental_steps_without_prev_are_fairseqs(kind):
    kwargs = {"self_attention": True} if kind == "self" else {"encoder_decoder_attention": True}
    theirs, ours = pair(**kwargs)
    enc, kpm = torch.randn(S, B, EMBED), padding([7, 2, 5], S)
    state_theirs, state_ours = {}, {}
    for t in range(T):
        x = torch.randn(1, B, EMBED)
        if kind == "self":
            want, _ = theirs(x, x, x, incremental_state=state_theirs)
            got, _, carried = ours(x, x, x, incremental_state=state_ours)
            assert carried.scores.shape == (B * HEADS, 1, t + 1)
        else:
            want, _ = theirs(x, enc, enc, key_padding_mask=kpm, incremental_state=state_theirs, static_kv=True)
            got, _, carried = ours(x, enc, enc, key_padding_mask=kpm, incremental_state=state_ours, static_kv=True)
            assert carried.scores.shape == (B * HEADS, 1, S)
        assert_same_attention(got, want)


def test_beamable_cross_attention_equals_per_hypothesis():
    """fairseq's beamable mode (``set_beam_size``) keeps one copy of the encoder keys per
    sentence; with carried scores it must give what per-hypothesis attention gives."""
    _, ours = pair(encoder_decoder_attention=True)
    beam, sentences = 4, 2
    enc = torch.randn(S, sentences, EMBED).repeat_interleave(beam, dim=1)
    kpm = padding([7, 3], S).repeat_interleave(beam, dim=0)
    results = []
    for beam_size in (1, beam):
        ours.set_beam_size(beam_size)
        torch.manual_seed(0)
        state, step_results = {}, []
        for _ in range(2):  # first step projects the encoder states, the second reads the cache
            q = torch.randn(1, sentences * beam, EMBED)
            prev = torch.randn(sentences * beam * HEADS, 1, S)
            step_results.append(
                ours(
                    q,
                    enc,
                    enc,
                    key_padding_mask=kpm,
                    incremental_state=state,
                    static_kv=True,
                    carried=Carried(prev),
                    depth=2,
                    need_weights=True,
                )
            )
        results.append(step_results)
    for per_hypothesis, beamable in zip(*results):
        for want, got in zip(per_hypothesis, beamable):
            assert_same_attention(got, want)


def raw_scores(module, query, key):
    """Q Kᵀ / √d per head, written out: (B*H, Tq, Tk) in fairseq's batch-major head order."""
    d = EMBED // HEADS
    q = (query @ module.q_proj.weight.T + module.q_proj.bias).view(query.size(0), -1, d)
    k = (key @ module.k_proj.weight.T + module.k_proj.bias).view(key.size(0), -1, d)
    return torch.einsum("qnd,knd->nqk", q, k) / math.sqrt(d)


@pytest.mark.parametrize("running_mean", [False, True], ids=["sum", "mean"])
def test_hands_on_the_unmasked_sum_out_of_place(running_mean):
    _, ours = pair(self_attention=True)
    ours.running_mean = running_mean
    x = torch.randn(T, B, EMBED)
    prev = torch.randn(B * HEADS, T, T)
    prev_before = prev.clone()
    kpm, mask = padding([5, 3, 4], T, left=False), future_mask(T)
    depth = 3
    _, weights, (scores, *_) = ours(
        x, x, x, key_padding_mask=kpm, attn_mask=mask, carried=Carried(prev), need_head_weights=True, depth=depth
    )

    expected = raw_scores(ours, x, x) + prev_before
    torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(scores).all(), "masked entries must not enter the carried sum"
    assert torch.equal(prev, prev_before), "the previous layer's scores were modified in place"
    assert scores.data_ptr() != prev.data_ptr()

    # this layer's own softmax: masked, and divided by n for the running mean
    logits = (expected / depth if running_mean else expected).view(B, HEADS, T, T)
    logits = logits + mask
    logits = logits.masked_fill(kpm.view(B, 1, 1, T), float("-inf"))
    torch.testing.assert_close(weights, logits.softmax(-1).transpose(0, 1), rtol=1e-5, atol=1e-6)


def test_carried_scores_are_not_aliased_by_the_next_layer():
    """The second layer masks in place only its own tensors, never the carry it received."""
    _, first = pair(self_attention=True, seed=0)
    _, second = pair(self_attention=True, seed=1)
    x, kpm, mask = torch.randn(T, B, EMBED), padding([5, 3, 4], T, left=False), future_mask(T)
    for running_mean in (False, True):
        second.running_mean = running_mean
        _, _, (s1, *_) = first(x, x, x, key_padding_mask=kpm, attn_mask=mask)
        s1_before = s1.clone()
        second(x, x, x, key_padding_mask=kpm, attn_mask=mask, carried=Carried(s1), depth=2)
        assert torch.equal(s1, s1_before)


def test_float16_carry_is_float32_and_does_not_overflow():
    _, ours = pair(self_attention=True)
    ours = ours.half()
    x = torch.randn(T, B, EMBED).half()
    # a carried sum already beyond float16's range (65504)
    prev = torch.full((B * HEADS, T, T), 70000.0)
    try:
        out, _, (scores, *_) = ours(x, x, x, carried=Carried(prev), depth=2)
    except RuntimeError as e:  # pragma: no cover - CPU builds without float16 GEMM
        pytest.skip(f"float16 matmul unavailable on this CPU build: {e}")
    assert scores.dtype == torch.float32 and out.dtype == torch.float16
    assert torch.isfinite(scores).all() and torch.isfinite(out).all()
    _, _, (first, *_) = ours(x, x, x)
    assert first.dtype == torch.float32, "the first layer must start the carry in float32"


def test_bfloat16_carry_is_float32():
    """A bfloat16 model (fairseq's own bf16) carries in float32 too, as under --bf16's autocast
    (tests/test_bf16.py: why)."""
    _, ours = pair(self_attention=True)
    ours = ours.to(torch.bfloat16)
    x = torch.randn(T, B, EMBED, dtype=torch.bfloat16)
    out1, _, (s1, *_) = ours(x, x, x)
    out2, _, (s2, *_) = ours(x, x, x, carried=Carried(s1), depth=2)
    assert s1.dtype == s2.dtype == torch.float32 and out1.dtype == out2.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("running_mean", [False, True], ids=["sum", "mean"])
def test_half_precision_gradients_match_float32(dtype, running_mean):
    """In half precision the softmax saves only its half output for backward; the gradients
    still equal float32's to half precision."""
    _, reference = pair(self_attention=True)
    reference.running_mean = running_mean
    half = ResidualMultiheadAttention(EMBED, HEADS, self_attention=True, running_mean=running_mean)
    half.load_state_dict(reference.state_dict())
    half = half.to(dtype)
    x = torch.randn(T, B, EMBED)
    prev = torch.randn(B * HEADS, T, T)
    kpm, mask = padding([5, 3, 4], T, left=False), future_mask(T)
    grads = []
    for module, inputs in ((reference, x), (half, x.to(dtype))):
        try:
            out, _, (scores, *_) = module(
                inputs,
                inputs,
                inputs,
                key_padding_mask=kpm,
                attn_mask=mask,
                carried=Carried(prev if dtype == torch.float16 or module is reference else prev.to(dtype)),
                depth=2,
            )
            (out.float().square().sum() + scores.float().sum()).backward()
        except RuntimeError as e:  # pragma: no cover - CPU builds without half GEMM backward
            pytest.skip(f"{dtype} backward unavailable on this CPU build: {e}")
        grads.append([p.grad.float() for p in (module.q_proj.weight, module.k_proj.weight, module.v_proj.weight)])
    for want, got in zip(*grads):
        torch.testing.assert_close(got, want, rtol=0.05, atol=0.05 * want.abs().max().item())


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("kind", ["self", "cross"])
def test_fairseqs_attention_off_the_path_answers_as_ours_and_computes_as_fairseqs(kind, train):
    """PlainMultiheadAttention: fairseq's module (same parameters, fused path in training
    self-attention, there with the projections packed into one GEMM), called and answering as
    ResidualMultiheadAttention is; it carries nothing. Outputs, weights and gradients are
    fairseq's."""
    kwargs = dict(self_attention=True) if kind == "self" else dict(encoder_decoder_attention=True)
    torch.manual_seed(0)
    theirs = MultiheadAttention(EMBED, HEADS, **kwargs).train(train)
    torch.manual_seed(0)
    plain = PlainMultiheadAttention(EMBED, HEADS, **kwargs).train(train)
    assert plain.state_dict().keys() == theirs.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), theirs.state_dict().values()))
    x, kv = torch.randn(T, B, EMBED, requires_grad=True), torch.randn(S if kind == "cross" else T, B, EMBED)
    kv = x if kind == "self" else kv
    asked = dict(
        key_padding_mask=padding([7, 2, 5] if kind == "cross" else [5, 3, 4], kv.size(0)),
        need_weights=True,
        static_kv=kind == "cross",
    )
    torch.manual_seed(1)
    want, want_weights = theirs(x, kv, kv, **asked)
    fused = train and kind == "self"  # where fairseq runs F.multi_head_attention_forward
    assert not plain._packs_projections(x, kv, kv, asked)  # float32: no casts to save
    with autocast("cpu"):
        assert plain._packs_projections(x, kv, kv, asked) == fused
    plain._packs_projections = lambda *args: fused  # the packed GEMM, in float32, against fairseq's three
    torch.manual_seed(1)
    got = plain(x, kv, kv, **asked, carried=Carried(), depth=3)
    assert isinstance(got, Attended) and got.carried == Carried()
    torch.testing.assert_close(got.output, want, rtol=0, atol=0)
    torch.testing.assert_close(got.weights, want_weights, rtol=0, atol=0)
    grad = torch.randn_like(want)
    for module, output in ((theirs, want), (plain, got.output)):
        torch.autograd.backward(output, grad, inputs=[x, *module.parameters()])
    # k_proj's bias: zero in exact arithmetic (a softmax ignores a shift of its row), rounding in both
    largest = max(p.grad.abs().max() for p in theirs.parameters())
    for name, a, b in zip(dict(plain.named_parameters()), plain.parameters(), theirs.parameters()):
        assert_same_attention(a.grad, b.grad, msg=name, scale=largest)


def test_every_attention_module_of_a_plugin_layer_answers_attended():
    from .helpers import make_dictionary, random_batch, realformer

    dictionary = make_dictionary()
    model = realformer("encoder,cross", "mean", "admin", dictionary=dictionary)  # decoder self-attention: off
    answers = []
    modules = [m for m in model.modules() if isinstance(m, MultiheadAttention)]
    assert {type(m) for m in modules} == {ResidualMultiheadAttention, PlainMultiheadAttention}
    hooks = [m.register_forward_hook(lambda m, args, out: answers.append(type(out))) for m in modules]
    model(*random_batch(dictionary, [6, 9, 4], [5, 7, 3]))
    for hook in hooks:
        hook.remove()
    assert answers and set(answers) == {Attended}


@pytest.mark.parametrize("kind", ["self", "cross"])
def test_training_projects_with_one_gemm_and_computes_what_separate_projections_compute(kind):
    """In training the projections of one input run as one GEMM (q, k, v in self-attention; k,
    v in cross-attention): the parameters keep their names, and the output, the carried scores
    and every gradient are those of the three projections run one by one."""
    kwargs = {"self_attention": True} if kind == "self" else {"encoder_decoder_attention": True}
    _, ours = pair(**kwargs)
    ours.dropout_module.p = 0.0
    ours.train()
    x = torch.randn(T, B, EMBED, dtype=torch.float64, requires_grad=True)
    enc = x if kind == "self" else torch.randn(S, B, EMBED, dtype=torch.float64, requires_grad=True)
    prev = torch.randn(B * HEADS, T, enc.size(0), dtype=torch.float64)
    kpm = padding([5, 3, 4], T, left=False) if kind == "self" else padding([7, 2, 5], S)
    ours = ours.double()
    results = []
    for together in (True, False):
        ours.zero_grad(set_to_none=True)
        x.grad = enc.grad = None
        ours._projects_together = lambda: together  # the instance attribute shadows the method
        assert [name for name, _ in ours.named_parameters()] == [n for n, _ in pair(**kwargs)[1].named_parameters()]
        out, _, (scores, *_) = ours(x, enc, enc, key_padding_mask=kpm, carried=Carried(prev), depth=2)
        (out.square().sum() + scores.sin().sum()).backward()
        results.append([out, scores, x.grad, enc.grad, *(p.grad for p in ours.parameters())])
    for together, separate in zip(*results):
        torch.testing.assert_close(together, separate, rtol=0, atol=1e-12)


def test_only_training_under_an_autocast_projects_together():
    """One GEMM where it saves the autocast's casts (training, --bf16); separate projections in
    float32, in decoding, and under quant noise."""
    _, ours = pair(self_attention=True)
    with autocast("cpu"):
        assert not ours._projects_together()  # eval: pair() returns it in eval mode
        ours.train()
        assert ours._projects_together()
        with torch.no_grad():
            assert not ours._projects_together()
    assert not ours._projects_together()  # float32
    with autocast("cpu"):
        ours.k_proj.register_forward_pre_hook(lambda module, inputs: None)  # as fairseq's quant_noise does
        assert not ours._projects_together()
