"""ReZero and T-Fixup: no LayerNorm anywhere, ReZero's layers start as the identity, T-Fixup's
weights have the standard deviations of its formula; impossible flags name themselves. ResiDual:
its dual stream starts from the embedding and the stack's LayerNorm normalises it. ADMIN's and
ReZero's join: addcmul's values and gradients."""

import math

import pytest
import torch
import torch.nn.functional as F

from fairseq_realformer.errors import RealformerConfigError
from fairseq_realformer.modules.backbones import tfixup_scales

from .helpers import EMBED, build_model, make_dictionary, perturb_, random_batch, realformer

DICT = make_dictionary()


@pytest.mark.parametrize("backbone", ["rezero", "t-fixup"])
def test_no_layer_norm_anywhere(backbone):
    model = realformer("all", "mean", backbone, dictionary=DICT)
    assert not [name for name, _ in model.named_parameters() if "norm" in name]
    assert not [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert model.encoder.layer_norm is None and model.decoder.layer_norm is None


@pytest.mark.parametrize("paths", ["none", "all"])
def test_rezero_layers_start_as_the_identity(paths):
    model = realformer(paths, "mean", "rezero", dictionary=DICT).train()  # dropout on: still the identity
    alphas = {n: p for n, p in model.named_parameters() if n.endswith("_resweight")}
    assert len(alphas) == 3 * 2 + 3 * 3 and all(p.shape == (1,) and p.item() == 0 for p in alphas.values())
    seen = []
    hooks = [
        layer.register_forward_hook(lambda m, args, out: seen.append((args[0], out[0])))
        for layer in (*model.encoder.layers, *model.decoder.layers)
    ]
    model(*random_batch(DICT, [6, 9, 4], [5, 7, 3]))
    for h in hooks:
        h.remove()
    assert len(seen) == 6
    for layer_input, layer_output in seen:
        assert torch.equal(layer_output, layer_input)


def test_tfixup_scales_value_output_and_ffn_weights_by_its_formula():
    """Xavier-uniform weights have std √(2 / (fan_in + fan_out)); T-Fixup multiplies the value,
    output and FFN weights by 0.67·N_e^(-1/4) (encoder) and (9·N_d)^(-1/4) (decoder); queries
    and keys keep fairseq's Xavier with gain 1/√2; the shared embedding N(0, d^-1/2) is scaled
    once, by the encoder's (9·N_e)^(-1/4)."""
    d, ffn, enc, dec = 512, 2048, 6, 4
    dictionary = make_dictionary(4000)
    model = build_model(
        "realformer",
        "--backbone",
        "t-fixup",
        "--encoder-embed-dim",
        str(d),
        "--decoder-embed-dim",
        str(d),
        "--encoder-ffn-embed-dim",
        str(ffn),
        "--decoder-ffn-embed-dim",
        str(ffn),
        "--encoder-layers",
        str(enc),
        "--decoder-layers",
        str(dec),
        "--share-all-embeddings",
        dictionary=dictionary,
    )
    xavier = lambda fan_in, fan_out: math.sqrt(2 / (fan_in + fan_out))  # noqa: E731
    checked = 0
    for side, layers in (("encoder", model.encoder.layers), ("decoder", model.decoder.layers)):
        scale = tfixup_scales(enc, dec, side)[0]
        for layer in layers:
            attentions = [layer.self_attn] + ([layer.encoder_attn] if side == "decoder" else [])
            expected = [(layer.fc1.weight, scale * xavier(d, ffn)), (layer.fc2.weight, scale * xavier(ffn, d))]
            for attention in attentions:
                expected += [
                    (attention.v_proj.weight, scale * xavier(d, d)),
                    (attention.out_proj.weight, scale * xavier(d, d)),
                    (attention.q_proj.weight, xavier(d, d) / math.sqrt(2)),
                    (attention.k_proj.weight, xavier(d, d) / math.sqrt(2)),
                ]
            for weight, std in expected:
                assert float(weight.std()) == pytest.approx(std, rel=0.03)
                checked += 1
            assert not layer.fc1.bias.any() and not layer.fc2.bias.any()
    assert checked == enc * 6 + dec * 10
    assert scale == (9 * dec) ** -0.25 and tfixup_scales(enc, dec, "encoder")[0] == 0.67 * enc**-0.25
    embedding = model.encoder.embed_tokens.weight[dictionary.nspecial :]
    assert model.decoder.embed_tokens is model.encoder.embed_tokens
    assert float(embedding.std()) == pytest.approx(d**-0.5 * (9 * enc) ** -0.25, rel=0.03)


def test_tfixup_scales_each_embedding_by_its_own_stack_when_not_shared():
    dictionary = make_dictionary(4000)
    d = 256
    model = build_model(
        "realformer",
        "--backbone",
        "t-fixup",
        "--encoder-embed-dim",
        str(d),
        "--decoder-embed-dim",
        str(d),
        "--encoder-layers",
        "6",
        "--decoder-layers",
        "2",
        dictionary=dictionary,
    )
    for side, layers in (("encoder", 6), ("decoder", 2)):
        weight = getattr(model, side).embed_tokens.weight[dictionary.nspecial :]
        assert float(weight.std()) == pytest.approx(d**-0.5 * (9 * layers) ** -0.25, rel=0.03)


@pytest.mark.parametrize("backbone", ["rezero", "t-fixup"])
@pytest.mark.parametrize(
    "flags, names",
    [
        (["--layernorm-embedding"], "--layernorm-embedding adds a LayerNorm, but --backbone {} has none"),
        (
            ["--encoder-normalize-before"],
            "--encoder-normalize-before/--decoder-normalize-before contradict --backbone {}",
        ),
        (
            ["--decoder-normalize-before"],
            "--encoder-normalize-before/--decoder-normalize-before contradict --backbone {}",
        ),
        (
            ["--admin-init", "profile"],
            "--admin-init profile / --admin-init-path set ADMIN's omega, but --backbone is {}",
        ),
        (
            ["--admin-init-path", "x.init"],
            "--admin-init profile / --admin-init-path set ADMIN's omega, but --backbone is {}",
        ),
    ],
)
def test_flags_that_contradict_the_backbone_name_the_flags(backbone, flags, names):
    with pytest.raises(RealformerConfigError) as error:
        realformer("all", "mean", backbone, *flags, dictionary=DICT)
    assert str(error.value).startswith(names.format(backbone))


# --- ResiDual ------------------------------------------------------------------------------------------


def _silence_every_branch_(model):
    """Zero every sublayer's last projection (attention output, FFN fc2): every f(x) is 0."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".out_proj." in name or ".fc2." in name:
                p.zero_()
    return model


def test_resi_dual_stream_starts_from_the_embedding_and_the_stack_layer_norm_is_applied_to_it():
    """With every branch f(x) = 0 the dual stream stays the embedded input d₀, so the stack's
    output minus its last layer's x is exactly LN(d₀), with the stack's LayerNorm (eps 1e-7)."""
    model = _silence_every_branch_(perturb_(realformer("all", "mean", "resi-dual", dictionary=DICT)))
    enc, dec = model.encoder, model.decoder
    assert enc.layer_norm.eps == dec.layer_norm.eps == 1e-7
    src, src_len, prev = random_batch(DICT, [6, 9, 4], [5, 7, 3])
    encoder_out = enc(src, src_lengths=src_len, return_all_hiddens=True)
    embedded = (enc.embed_scale * enc.embed_tokens(src) + enc.embed_positions(src)) * src.ne(DICT.pad()).unsqueeze(-1)
    last_x = encoder_out["encoder_states"][-1].transpose(0, 1)
    got = encoder_out["encoder_out"][0].transpose(0, 1) - last_x
    want = F.layer_norm(embedded, (EMBED,), enc.layer_norm.weight, enc.layer_norm.bias, eps=1e-7)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)

    features, extra = dec(prev, encoder_out=encoder_out, features_only=True)
    embedded = dec.embed_scale * dec.embed_tokens(prev) + dec.embed_positions(prev)
    got = features - extra["inner_states"][-1].transpose(0, 1)
    want = F.layer_norm(embedded, (EMBED,), dec.layer_norm.weight, dec.layer_norm.bias, eps=1e-7)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_resi_dual_layers_are_post_ln_and_add_only_the_stack_layer_norms():
    """The layers are fairseq's Post-LN layers (same parameters); the stacks gain one
    LayerNorm each, over the dual stream."""
    post_ln = set(realformer("all", "mean", "post-ln", dictionary=DICT).state_dict())
    resi_dual = realformer("all", "mean", "resi-dual", dictionary=DICT)
    assert set(resi_dual.state_dict()) - post_ln == {
        f"{side}.layer_norm.{p}" for side in ("encoder", "decoder") for p in ("weight", "bias")
    }
    assert not any(layer.normalize_before for layer in (*resi_dual.encoder.layers, *resi_dual.decoder.layers))
