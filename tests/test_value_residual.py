"""Value residual (ResFormer): layer n ≥ 2 of a path reads λ·V_n + (1 − λ)·V_1. Its own paths,
gates where the equations put them, equal to the reference on any subset of paths, unchanged
for one layer, `learned` = `half` at initialisation, LayerDrop, activation checkpointing, float16
and the flags it cannot go with."""

import pytest
import torch

from fairseq_realformer.errors import RealformerConfigError
from fairseq_realformer.modules import ResidualMultiheadAttention
from fairseq_realformer.modules.residual_attention import Carried

from .helpers import (
    HEADS,
    MODES,
    assert_within_rounding,
    build_model,
    differs_beyond_rounding,
    layerdrop_draw,
    make_dictionary,
    paths_of,
    perturb_,
    random_batch,
    realformer,
)
from .reference import reference_forward
from .test_model import SRC_LENS, TGT_LENS, assert_close_at, forward, forward_under_layerdrop, real_positions

DICT = make_dictionary()


def value_residual(paths="all", mix="half"):
    return ["--value-residual-paths", paths, "--value-residual-mix", mix]


def attention_modules(model, path):
    if path == "encoder":
        return [layer.self_attn for layer in model.encoder.layers]
    return [getattr(layer, "self_attn" if path == "decoder" else "encoder_attn") for layer in model.decoder.layers]


@pytest.mark.parametrize("mix", ["half", "learned"])
@pytest.mark.parametrize("value_paths", ["encoder", "decoder", "cross", "encoder,cross"])
@pytest.mark.parametrize("score_paths", ["none", "all"])
def test_each_path_set_matches_reference(score_paths, value_paths, mix):
    """Value residual on a subset of the paths, with and without residual scores."""
    model = perturb_(realformer(score_paths, "mean", "admin", *value_residual(value_paths, mix), dictionary=DICT))
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    enc, logits, _ = forward(model, src, src_len, prev)
    ref = reference_forward(
        model,
        src,
        prev,
        paths=paths_of(score_paths),
        mode="mean",
        backbone="admin",
        heads=HEADS,
        value_paths=paths_of(value_paths),
        value_mix=mix,
    )
    assert_close_at(enc, ref["encoder_out"], real_positions(SRC_LENS, left=True))
    assert_close_at(logits, ref["logits"], real_positions(TGT_LENS, left=False))


@pytest.mark.parametrize("mix", ["half", "learned"])
def test_our_attention_and_gates_sit_exactly_where_the_flags_put_them(mix):
    """Value residual alone puts our attention on its paths (scores not carried there); learned
    mixing has one gate per layer n ≥ 2 of each value path, zero at construction."""
    model = realformer("encoder", "mean", "admin", *value_residual("decoder", mix), dictionary=DICT)
    for path in ("encoder", "decoder"):
        for n, module in enumerate(attention_modules(model, path), start=1):
            assert isinstance(module, ResidualMultiheadAttention)
            assert module.residual_scores == (path == "encoder")
            assert module.value_mix == (mix if path == "decoder" else None)
            has_gate = module.value_gate is not None
            assert has_gate == (mix == "learned" and path == "decoder" and n >= 2)
            if has_gate:
                assert not module.value_gate.weight.any() and not module.value_gate.bias.any()
                assert module.value_gate.weight.shape == (HEADS, 16)
    assert not any(isinstance(m, ResidualMultiheadAttention) for m in attention_modules(model, "cross"))


@pytest.mark.parametrize("mix", ["half", "learned"])
@pytest.mark.parametrize("mode", MODES)
def test_one_layer_model_is_unchanged_by_value_residual(mode, mix):
    flags = ["--encoder-layers", "1", "--decoder-layers", "1"]
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    off = perturb_(realformer("all", mode, "admin", *flags, dictionary=DICT))
    on = realformer("all", mode, "admin", *flags, *value_residual("all", mix), dictionary=DICT)
    on.load_state_dict(off.state_dict())  # a one-layer model has no gate: the same parameters
    for got, want in zip(forward(on, src, src_len, prev)[:2], forward(off, src, src_len, prev)[:2]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_learned_equals_half_at_initialisation():
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    learned = realformer("all", "mean", "admin", *value_residual("all", "learned"), dictionary=DICT)
    half = perturb_(realformer("all", "mean", "admin", *value_residual("all", "half"), dictionary=DICT))
    missing, unexpected = learned.load_state_dict(half.state_dict(), strict=False)
    assert not unexpected and missing and all(".value_gate." in name for name in missing)
    enc_l, logits_l, _ = forward(learned, src, src_len, prev)
    enc_h, logits_h, _ = forward(half, src, src_len, prev)
    # cross-attention's learned λ mixes the two weighted sums, half the values: float32 rounding apart
    assert_within_rounding(enc_l, enc_h)
    assert_within_rounding(logits_l, logits_h)
    # and value residual changes the model: half is not the model without it
    plain = realformer("all", "mean", "admin", dictionary=DICT)
    plain.load_state_dict(half.state_dict())
    assert differs_beyond_rounding(forward(plain, src, src_len, prev)[1], logits_h)


def test_layerdrop_takes_v1_from_the_first_layer_run():
    """With LayerDrop, V_1 is the values of the first layer of the path that runs in this pass
    (its gate, if any, unused), as the running mean counts the layers run."""
    layers, p = 4, 0.5
    model = perturb_(
        realformer(
            "all",
            "mean",
            "admin",
            *value_residual("all", "learned"),
            "--encoder-layers",
            str(layers),
            "--decoder-layers",
            str(layers),
            "--encoder-layerdrop",
            str(p),
            "--decoder-layerdrop",
            str(p),
            dictionary=DICT,
        )
    )
    # the first layer dropped on both sides, at least two layers run
    seed, kept_enc, kept_dec = layerdrop_draw(
        layers, p, lambda enc, dec: len(enc) >= 2 and len(dec) >= 2 and enc[0] > 0 and dec[0] > 0
    )
    enc, logits, ref = forward_under_layerdrop(
        model, seed, kept_enc, kept_dec, backbone="admin", value_paths=paths_of("all"), value_mix="learned"
    )
    assert_close_at(enc, ref["encoder_out"], real_positions(SRC_LENS, left=True))
    assert_close_at(logits, ref["logits"], real_positions(TGT_LENS, left=False))


@pytest.mark.parametrize("backbone", ["admin", "resi-dual"])
def test_activation_checkpointing_gives_the_same_outputs_and_gradients(backbone):
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    results = []
    for flags in ([], ["--checkpoint-activations"]):
        model = perturb_(
            realformer("all", "mean", backbone, *value_residual("all", "learned"), *flags, dictionary=DICT)
        ).train()
        logits, _ = model(src, src_len, prev)
        logits.sum().backward()
        first, gate = model.decoder.layers[0].encoder_attn, model.decoder.layers[2].encoder_attn.value_gate
        results.append((logits.detach(), first.v_proj.weight.grad, gate.weight.grad))
    (want, *want_grads), (got, *got_grads) = results
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    for got_grad, want_grad in zip(got_grads, want_grads):
        assert want_grad.abs().sum() > 0  # V_1 and λ are trained through the carry
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_float16_values_are_carried_in_float32(cross):
    """As the scores: V_1 travels in float32 when the attention computes in float16."""
    kind = {"encoder_decoder_attention": True} if cross else {"self_attention": True}
    torch.manual_seed(0)
    first = ResidualMultiheadAttention(16, 4, value_mix="learned", **kind).half()
    second = ResidualMultiheadAttention(16, 4, value_mix="learned", value_gate=True, **kind).half()
    x, enc = torch.randn(5, 3, 16).half(), torch.randn(7, 3, 16).half()
    kv = enc if cross else x
    try:
        _, _, carried = first(x, kv, kv, static_kv=cross)
        out, _, handed_on = second(x, kv, kv, static_kv=cross, carried=carried, depth=2)
    except RuntimeError as e:  # pragma: no cover - CPU builds without float16 GEMM
        pytest.skip(f"float16 matmul unavailable on this CPU build: {e}")
    assert carried.values.dtype == torch.float32 and carried.values.shape == (3 * 4, kv.size(0), 4)
    assert handed_on.values is carried.values  # later layers hand V_1 on unchanged
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    # the same computation in float32 from the same weights
    first32, second32 = first.float(), second.float()
    _, _, carried32 = first32(x.float(), kv.float(), kv.float(), static_kv=cross)
    want, _, _ = second32(x.float(), kv.float(), kv.float(), static_kv=cross, carried=carried32, depth=2)
    torch.testing.assert_close(out.float(), want, rtol=0, atol=5e-3)


def test_values_alone_carry_no_scores():
    """On a path with value residual but no residual scores, nothing but V_1 is handed on."""
    module = ResidualMultiheadAttention(16, 4, self_attention=True, residual_scores=False, value_mix="half")
    x = torch.randn(5, 3, 16)
    _, _, carried = module(x, x, x, carried=Carried(scores=torch.randn(12, 5, 5)), depth=2)
    assert carried.scores is None and carried.values.shape == (12, 5, 4)


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--value-residual-paths", "cross", "--no-cross-attention"],
            "--value-residual-paths includes cross, but --no-cross-attention removes it",
        ),
        (["--value-residual-paths", "encoder,values"], "--value-residual-paths: unknown path 'values'"),
    ],
)
def test_impossible_flags_are_one_line_naming_them(flags, message):
    with pytest.raises(RealformerConfigError) as error:
        build_model("realformer_iwslt_de_en", "--residual-attention-paths", "encoder", *flags, dictionary=DICT)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
