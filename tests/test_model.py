"""The realformer model: equal to fairseq's transformer when switched off, equal to the
equations when on, and decoding, batching and gradients behave as a user relies on."""

import pytest
import torch
from fairseq.models.transformer import TransformerModel
from fairseq.sequence_generator import SequenceGenerator

from fairseq_realformer.errors import RealformerConfigError
from fairseq_realformer.modules import ResidualMultiheadAttention
from fairseq_realformer.modules.admin import closed_form_omega

from .helpers import (
    BACKBONES,
    HEADS,
    LAYERS,
    MODES,
    PATH_SETS,
    VALUE_RESIDUAL,
    assert_within_rounding,
    build_model,
    differs_beyond_rounding,
    layerdrop_draw,
    make_dictionary,
    paths_of,
    perturb_,
    random_batch,
    realformer,
    value_residual_of,
)
from .reference import reference_forward

DICT = make_dictionary()
SRC_LENS, TGT_LENS = [6, 9, 4], [5, 7, 3]


def real_positions(lengths, left):
    """(batch, position) pairs that hold real tokens."""
    width = max(lengths)
    return [(b, t) for b, n in enumerate(lengths) for t in (range(width - n, width) if left else range(n))]


def assert_close_at(got, want, positions, layers=LAYERS):
    """*got* is *want* at *positions*, to float32's rounding through the model (helpers.rounding)."""
    index = tuple(torch.tensor(i) for i in zip(*positions))
    assert_within_rounding(got[index], want[index], layers)


def forward(model, src, src_len, prev):
    encoder_out = model.encoder(src, src_lengths=src_len)
    logits, extra = model.decoder(prev, encoder_out=encoder_out)
    return encoder_out["encoder_out"][0].transpose(0, 1), logits, extra


# --- switched off, it is fairseq's transformer -------------------------------------------------


@pytest.mark.parametrize("backbone", ["post-ln", "pre-ln"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_paths_none_is_fairseq_transformer(backbone, train):
    ln = ["--encoder-normalize-before", "--decoder-normalize-before"] if backbone == "pre-ln" else []
    fairseq_model = perturb_(build_model("transformer", *ln, dictionary=DICT))
    ours = realformer("none", "sum", backbone, dictionary=DICT, seed=1)
    assert isinstance(fairseq_model, TransformerModel)
    ours.load_state_dict(fairseq_model.state_dict(), strict=True)  # same parameters, same names
    fairseq_model.train(train), ours.train(train)

    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    want_enc, want_logits, want_extra = forward(fairseq_model, src, src_len, prev)
    got_enc, got_logits, got_extra = forward(ours, src, src_len, prev)
    assert_close_at(got_enc, want_enc, real_positions(SRC_LENS, left=True))
    assert_close_at(got_logits, want_logits, real_positions(TGT_LENS, left=False))
    if not train:
        assert_within_rounding(got_extra["attn"][0], want_extra["attn"][0])


def test_admin_adds_only_omega_to_fairseqs_parameters():
    fairseq_names = set(build_model("transformer", dictionary=DICT).state_dict())
    admin_names = set(realformer("all", "mean", "admin", dictionary=DICT).state_dict())
    extra = admin_names - fairseq_names
    assert fairseq_names <= admin_names
    per_encoder_layer, per_decoder_layer = 2, 3
    assert len(extra) == LAYERS * (per_encoder_layer + per_decoder_layer)
    assert all(name.endswith("_omega") for name in extra)


@pytest.mark.parametrize("layers", [(6, 6), (18, 18), (60, 12)])
def test_admin_closed_form_omega(layers):
    enc, dec = layers
    model = realformer(
        "all", "mean", "admin", "--encoder-layers", str(enc), "--decoder-layers", str(dec), dictionary=DICT
    )
    omegas = {name: p for name, p in model.named_parameters() if name.endswith("_omega")}
    for name, omega in omegas.items():
        n = 2 * enc if name.startswith("encoder.") else 3 * dec
        torch.testing.assert_close(omega, torch.full_like(omega, closed_form_omega(n)))
    assert closed_form_omega(12) == pytest.approx(2.017, abs=1e-3)
    assert closed_form_omega(36) == pytest.approx(3.041, abs=1e-3)


# --- switched on, it computes the paper's equations --------------------------------------------


@pytest.mark.parametrize("value_residual", VALUE_RESIDUAL)
@pytest.mark.parametrize("backbone", BACKBONES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("paths", PATH_SETS)
def test_matches_reference(paths, mode, backbone, value_residual):
    model = perturb_(realformer(paths, mode, backbone, *VALUE_RESIDUAL[value_residual], dictionary=DICT))
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    enc, logits, extra = forward(model, src, src_len, prev)
    ref = reference_forward(
        model,
        src,
        prev,
        paths=paths_of(paths),
        mode=mode,
        backbone=backbone,
        heads=HEADS,
        **value_residual_of(value_residual),
    )
    assert_close_at(enc, ref["encoder_out"], real_positions(SRC_LENS, left=True))
    assert_close_at(logits, ref["logits"], real_positions(TGT_LENS, left=False))
    # the alignment fairseq reports: last layer's cross-attention probabilities, head-averaged
    assert_close_at(extra["attn"][0], ref["cross_probs"].mean(dim=1), real_positions(TGT_LENS, left=False))


def test_residual_attention_modules_sit_exactly_on_the_chosen_paths():
    model = realformer("encoder,cross", dictionary=DICT)
    for layer in model.encoder.layers:
        assert isinstance(layer.self_attn, ResidualMultiheadAttention)
    for layer in model.decoder.layers:
        assert not isinstance(layer.self_attn, ResidualMultiheadAttention)
        assert isinstance(layer.encoder_attn, ResidualMultiheadAttention)


# --- decoding -------------------------------------------------------------------------------------


@pytest.mark.parametrize("value_residual", VALUE_RESIDUAL)
@pytest.mark.parametrize("backbone", BACKBONES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("paths", PATH_SETS)
def test_incremental_decoding_equals_full_forward(paths, mode, backbone, value_residual):
    assert_incremental_decoding_equals_full_forward(
        perturb_(realformer(paths, mode, backbone, *VALUE_RESIDUAL[value_residual], dictionary=DICT))
    )


def assert_incremental_decoding_equals_full_forward(model):
    """Every step of incremental decoding gives the full forward pass's logits and alignment."""
    src, src_len, prev = random_batch(DICT, SRC_LENS, [7, 7, 7])
    encoder_out = model.encoder(src, src_lengths=src_len)
    full, full_extra = model.decoder(prev, encoder_out=encoder_out)
    state = {}
    for t in range(prev.size(1)):
        step, step_extra = model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
        # the same sums on other shapes: other GEMM blockings, float32's rounding apart
        assert_within_rounding(step[:, 0], full[:, t])
        assert_within_rounding(step_extra["attn"][0][:, 0], full_extra["attn"][0][:, t])


@pytest.mark.parametrize(
    "paths, mode, backbone, value_residual",
    [
        ("all", "mean", "admin", "no-vr"),
        ("all", "sum", "post-ln", "no-vr"),
        ("cross", "mean", "pre-ln", "no-vr"),
        ("none", "sum", "admin", "no-vr"),
        ("all", "mean", "rezero", "no-vr"),
        ("decoder,cross", "sum", "t-fixup", "no-vr"),
        ("all", "mean", "resi-dual", "no-vr"),
        ("all", "mean", "admin", "vr-learned"),
        ("none", "sum", "post-ln", "vr-half"),
        ("all", "mean", "resi-dual", "vr-learned"),
    ],
)
def test_beam_search_scores_are_the_models_probabilities(paths, mode, backbone, value_residual):
    """Beam 4 through fairseq's generator (beam reordering of the incremental state): every
    hypothesis' token scores equal the full teacher-forced forward pass on that hypothesis."""
    model = realformer(paths, mode, backbone, *VALUE_RESIDUAL[value_residual], dictionary=DICT)
    assert_beam_search_scores_are_the_models(perturb_(model, scale=0.5 if model.options.layer_norm else None))


def assert_beam_search_scores_are_the_models(model):
    """Beam 4 through fairseq's generator: each hypothesis' token scores and alignment are the
    teacher-forced forward pass's on that hypothesis."""
    src, src_len, _ = random_batch(DICT, SRC_LENS, TGT_LENS)
    generator = SequenceGenerator([model], DICT, beam_size=4, max_len_a=0, max_len_b=8)
    hypos = generator.forward({"net_input": {"src_tokens": src, "src_lengths": src_len}})
    assert len(hypos) == len(SRC_LENS) and all(len(h) == 4 for h in hypos)
    for i, sentence_hypos in enumerate(hypos):
        for hypo in sentence_hypos:
            tokens = hypo["tokens"].unsqueeze(0)
            prev = torch.cat([tokens.new_full((1, 1), DICT.eos()), tokens[:, :-1]], dim=1)
            n = src_len[i]
            _, logits, extra = forward(model, src[i : i + 1, -n:], src_len[i : i + 1], prev)
            logprobs = logits.log_softmax(-1)[0].gather(-1, tokens[0].unsqueeze(-1)).squeeze(-1)
            assert_within_rounding(hypo["positional_scores"], logprobs, LAYERS, len(DICT))  # and log_softmax's sum
            # alignment reported by the generator = head-averaged cross-attention probabilities
            assert_within_rounding(hypo["attention"][-n:], extra["attn"][0][0].T)


# --- batching -------------------------------------------------------------------------------------


@pytest.mark.parametrize("paths, mode", [("all", "mean"), ("all", "sum"), ("encoder,decoder", "mean")])
def test_output_does_not_change_with_padding(paths, mode):
    """A sentence alone, and batched with longer, padded sentences (source and target side)."""
    model = perturb_(realformer(paths, mode, "admin", dictionary=DICT))
    src, src_len, prev = random_batch(DICT, [4, 9, 6], [3, 8, 5], seed=3)
    enc, logits, _ = forward(model, src, src_len, prev)
    for i, (n, m) in enumerate(zip([4, 9, 6], [3, 8, 5])):
        enc_i, logits_i, _ = forward(model, src[i : i + 1, -n:], src_len[i : i + 1], prev[i : i + 1, :m])
        assert_within_rounding(enc[i, -n:], enc_i[0])
        assert_within_rounding(logits[i, :m], logits_i[0])


# --- each path changes exactly what it should ------------------------------------------------------


def outputs(paths, mode, layers=LAYERS):
    flags = ["--encoder-layers", str(layers), "--decoder-layers", str(layers)]
    model = perturb_(realformer(paths, mode, "admin", *flags, dictionary=DICT))
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    enc, logits, extra = forward(model, src, src_len, prev)
    return enc, logits, extra["inner_states"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("path", ["encoder", "decoder", "cross"])
def test_toggling_one_path_changes_exactly_its_outputs(path, mode):
    enc_off, logits_off, inner_off = outputs("none", mode)
    enc_on, logits_on, inner_on = outputs(path, mode)
    if path == "encoder":
        assert differs_beyond_rounding(enc_on, enc_off)
    else:  # decoder-side paths never touch the encoder
        assert torch.equal(enc_on, enc_off)
        # the first decoder layer has nothing to carry yet: same output either way
        assert_within_rounding(inner_on[1], inner_off[1])
        assert differs_beyond_rounding(inner_on[2], inner_off[2])
    assert differs_beyond_rounding(logits_on, logits_off)


@pytest.mark.parametrize("mode", MODES)
def test_single_layer_has_nothing_to_carry(mode):
    enc_off, logits_off, _ = outputs("none", mode, layers=1)
    enc_on, logits_on, _ = outputs("all", mode, layers=1)
    assert_within_rounding(enc_on, enc_off, layers=1)
    assert_within_rounding(logits_on, logits_off, layers=1)


# --- gradients: the paper's "direct path" to the first layer's scores ------------------------------


def _attention_modules(model, path):
    if path == "encoder":
        return [layer.self_attn for layer in model.encoder.layers]
    attr = "self_attn" if path == "decoder" else "encoder_attn"
    return [getattr(layer, attr) for layer in model.decoder.layers]


def _scores_and_grads(model, path, cut_carry):
    """Scores S_1, S_2 of the first two layers on *path* and d loss / d S_1, d loss / d S_2.
    With *cut_carry*, layer 2 receives S_1 detached: only the carry's edge is removed."""
    first, second = _attention_modules(model, path)[:2]
    captured = []
    hooks = [
        m.register_forward_hook(lambda m, a, k, out: captured.append(out[2].scores), with_kwargs=True)
        for m in (first, second)
    ]
    if cut_carry:

        def detach_prev(module, args, kwargs):
            kwargs["carried"] = kwargs["carried"]._replace(scores=kwargs["carried"].scores.detach())
            return args, kwargs

        hooks.append(second.register_forward_pre_hook(detach_prev, with_kwargs=True))
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    _, logits, _ = forward(model, src, src_len, prev)
    loss = logits.log_softmax(-1)[..., 5].sum()
    s1, s2 = captured
    g1, g2 = torch.autograd.grad(loss, [s1, s2])
    for h in hooks:
        h.remove()
    return g1, g2


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("path", ["encoder", "decoder", "cross"])
def test_gradient_reaches_first_layer_scores_through_the_carry(path, mode):
    """S_2 = S_1 + Q_2 K_2ᵀ/√d, so the carry adds exactly dL/dS_2 to dL/dS_1."""
    model = perturb_(realformer(path, mode, "admin", dictionary=DICT))
    g1, g2 = _scores_and_grads(model, path, cut_carry=False)
    g1_without_carry, g2_same = _scores_and_grads(model, path, cut_carry=True)
    torch.testing.assert_close(g2_same, g2, rtol=0, atol=1e-7)  # downstream of S_2: unchanged
    assert g2.abs().sum() > 0
    torch.testing.assert_close(g1 - g1_without_carry, g2, rtol=1e-4, atol=1e-6)


# --- LayerDrop ------------------------------------------------------------------------------------


def forward_under_layerdrop(model, seed, kept_enc, kept_dec, paths="all", **reference_kwargs):
    """The training forward pass of *model* (mean mode) under LayerDrop's draw from *seed*, and the
    reference's with the layers that draw keeps: (encoder output, logits, the reference's outputs)."""
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    model.train()  # dropout is 0 in the tiny models: LayerDrop is the only randomness
    torch.manual_seed(seed)
    enc, logits, _ = forward(model, src, src_len, prev)
    ref = reference_forward(
        model,
        src,
        prev,
        paths=paths_of(paths),
        mode="mean",
        heads=HEADS,
        encoder_layers=kept_enc,
        decoder_layers=kept_dec,
        **reference_kwargs,
    )
    return enc, logits, ref


def some_dropped(layers):
    """What a LayerDrop test wants (``helpers.layerdrop_draw``): on each side, some layers dropped
    and at least two run."""
    return lambda kept_enc, kept_dec: 2 <= len(kept_enc) < layers and 2 <= len(kept_dec) < layers


def test_layerdrop_counts_the_layers_actually_run():
    """With LayerDrop, the carried scores skip a dropped layer and the running mean divides by
    the number of attention layers actually run."""
    layers, p = 4, 0.5
    model = perturb_(
        realformer(
            "all",
            "mean",
            "admin",
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
    seed, kept_enc, kept_dec = layerdrop_draw(layers, p, some_dropped(layers))
    enc, logits, ref = forward_under_layerdrop(model, seed, kept_enc, kept_dec, backbone="admin")
    assert_close_at(enc, ref["encoder_out"], real_positions(SRC_LENS, left=True))
    assert_close_at(logits, ref["logits"], real_positions(TGT_LENS, left=False))


# --- impossible flag combinations -------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, names",
    [
        (["--cross-self-attention"], "--cross-self-attention"),
        (["--no-cross-attention"], "--no-cross-attention"),
        (["--backbone", "post-ln", "--encoder-normalize-before"], "--encoder-normalize-before"),
        (["--backbone", "admin", "--decoder-normalize-before"], "--backbone admin"),
        (["--backbone", "resi-dual", "--encoder-normalize-before"], "--backbone resi-dual"),
        (["--residual-attention-paths", "encoder,self"], "--residual-attention-paths"),
        (["--base-layers", "1"], "--base-layers"),
    ],
)
def test_impossible_flag_combinations_name_the_flags(flags, names):
    with pytest.raises(RealformerConfigError, match=names):
        build_model("realformer_iwslt_de_en", *flags, dictionary=DICT)


def test_activation_checkpointing_gives_the_same_outputs_and_gradients():
    assert_activation_checkpointing_changes_nothing(
        lambda *flags: perturb_(realformer("all", "mean", "admin", *flags, dictionary=DICT))
    )


def assert_activation_checkpointing_changes_nothing(make_model):
    """*make_model(*flags)* with and without --checkpoint-activations: the same outputs and the same
    gradients of every parameter, from the same weights."""
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    results = []
    for flags in ([], ["--checkpoint-activations"]):
        model = make_model(*flags).train()
        logits, _ = model(src, src_len, prev)
        logits.sum().backward()
        results.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (want, want_grads), (got, got_grads) = results
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert got_grads.keys() == want_grads.keys()
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)
