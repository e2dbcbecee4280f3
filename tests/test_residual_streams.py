"""Residual streams (--residual-streams N: Hyper-Connections, --residual-streams-mix mhc: mHC): one
stream is today's model bit for bit; n streams compute the equations (tests/reference.py) on every
residual-attention path, with value residual, static and dynamic weights; they start as copies of
the embedded input, the stack sums them, and the model starts as Pre-LN; decoding step by step and
beam search give the full forward pass; the mix is trained; LayerDrop, activation checkpointing,
compiled layers and --bf16 compute what they should; fairseq-train, checkpoint averaging,
fairseq-interactive and the hub run it; impossible flags are one line. (Against the authors' code:
tests/test_hyper_connections_vs_references.py.)"""

import pytest
import torch
import torch.nn.functional as F

from fairseq_realformer.errors import RealformerConfigError
from fairseq_realformer.modules import hyper_connections
from fairseq_realformer.modules.hyper_connections import SINKHORN_ITERATIONS, HyperConnection
from fairseq_realformer.optim import precision

from . import compiled_steps
from .cli import load_script, train_and_average, train_losses, translate_with_the_average
from .helpers import (
    EMBED,
    HEADS,
    LAYERS,
    USER_DIR,
    VALUE_RESIDUAL,
    assert_within_rounding,
    build_model,
    differs_beyond_rounding,
    layerdrop_draw,
    parse_args,
    paths_of,
    perturb_,
    random_batch,
    realformer,
    value_residual_of,
)
from .reference import reference_forward
from .test_compat import FIXTURES, SMALL
from .test_compiled_layers import traced  # noqa: F401  (a fixture)
from .test_model import (
    DICT,
    SRC_LENS,
    TGT_LENS,
    assert_activation_checkpointing_changes_nothing,
    assert_beam_search_scores_are_the_models,
    assert_incremental_decoding_equals_full_forward,
    forward,
    forward_under_layerdrop,
    real_positions,
    some_dropped,
)

RUN_SECONDS = 35  # tests/conftest.py: 31 s measured beside two trainings, a third of it the fairseq commands

MIXES = ["hc", "mhc"]
TWO_LAYERS = ["--encoder-layers", "2", "--decoder-layers", "2"]
WEIGHTS = ["dynamic", "static"]


def streams_flags(n=4, mix="hc", weights="dynamic", *more):
    return ["--residual-streams", str(n), "--residual-streams-mix", mix, "--residual-streams-weights", weights, *more]


def hyper_model(paths="all", n=4, mix="hc", weights="dynamic", *flags, perturb=True):
    """A tiny Pre-LN model with n residual streams, its parameters moved off their initial values."""
    model = realformer(paths, "mean", "pre-ln", *streams_flags(n, mix, weights), *flags, dictionary=DICT)
    return perturb_(model) if perturb else model


def connections(model):
    return [m for m in model.modules() if isinstance(m, HyperConnection)]


# The sums each connection adds to a path through the model (tests.helpers.rounding): its
# LayerNorm and the dynamic weights' products over C, the read and the mix over n streams, and
# Sinkhorn-Knopp's column and row sums; 5 connections per encoder + decoder layer.
def stream_sums(n=4, iterations=SINKHORN_ITERATIONS):
    return 5 * LAYERS * [EMBED, EMBED, n, n, 2 * iterations * n]


def reference(model, src, prev, paths="all", n=4, mix="hc", iterations=SINKHORN_ITERATIONS, **kwargs):
    """tests/reference.py's forward pass of a Pre-LN model with *n* streams."""
    return reference_forward(
        model,
        src,
        prev,
        paths=paths_of(paths),
        mode="mean",
        backbone="pre-ln",
        heads=HEADS,
        streams=n,
        stream_mix=mix,
        sinkhorn_iterations=iterations,
        **kwargs,
    )


def assert_close_at(got, want, positions, n=4):
    index = tuple(torch.tensor(i) for i in zip(*positions))
    assert_within_rounding(got[index], want[index], LAYERS, *stream_sums(n))


# --- one stream is today's model ---------------------------------------------------------------------


@pytest.mark.parametrize("backbone", ["pre-ln", "admin"])
def test_one_stream_is_todays_model_bit_for_bit(backbone):
    """--residual-streams 1 (and the other stream flags at their defaults) builds the model the
    flags' absence builds: the same parameters, drawn from the same seed, the same outputs and
    gradients bit for bit, and no connection anywhere."""
    results = []
    for flags in ([], streams_flags(1, "hc", "dynamic", "--residual-streams-sinkhorn-iterations", "20")):
        model = realformer("all", "mean", backbone, *flags, *VALUE_RESIDUAL["vr-learned"], dictionary=DICT)
        assert not connections(model) and model.options.residual_streams == 1
        model = perturb_(model).train()
        logits, extra = model(*random_batch(DICT, SRC_LENS, TGT_LENS))
        logits.sum().backward()
        results.append(
            (model.state_dict(), logits, extra["inner_states"], {n: p.grad for n, p in model.named_parameters()})
        )
    (state, logits, inner, grads), (state1, logits1, inner1, grads1) = results
    assert list(state1) == list(state) and all(torch.equal(state1[k], v) for k, v in state.items())
    assert torch.equal(logits1, logits) and all(torch.equal(a, b) for a, b in zip(inner1, inner))
    assert grads1.keys() == grads.keys() and all(torch.equal(grads1[k], g) for k, g in grads.items())


# --- n streams compute the equations -------------------------------------------------------------------


@pytest.mark.parametrize("value_residual", ["no-vr", "vr-learned"])
@pytest.mark.parametrize("paths", ["all", "none"])
@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("mix", MIXES)
def test_matches_reference(mix, weights, paths, value_residual):
    model = hyper_model(paths, 4, mix, weights, *VALUE_RESIDUAL[value_residual])
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    enc, logits, extra = forward(model, src, src_len, prev)
    ref = reference(model, src, prev, paths, 4, mix, **value_residual_of(value_residual))
    assert_close_at(enc, ref["encoder_out"], real_positions(SRC_LENS, left=True))
    assert_close_at(logits, ref["logits"], real_positions(TGT_LENS, left=False))
    assert_close_at(extra["attn"][0], ref["cross_probs"].mean(dim=1), real_positions(TGT_LENS, left=False))


@pytest.mark.parametrize("n, mix, iterations", [(2, "hc", 20), (3, "mhc", 20), (4, "mhc", 3)])
def test_other_widths_and_sinkhorn_iterations_match_reference(n, mix, iterations):
    flags = ["--residual-streams-sinkhorn-iterations", str(iterations)] if iterations != 20 else []
    model = hyper_model("all", n, mix, "dynamic", *flags)
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    _, logits, _ = forward(model, src, src_len, prev)
    ref = reference(model, src, prev, "all", n, mix, iterations)
    assert_close_at(logits, ref["logits"], real_positions(TGT_LENS, left=False), n)
    assert {c.sinkhorn_iterations for c in connections(model)} == {iterations}


def test_streams_start_as_copies_of_the_embedded_input_and_the_stack_sums_them():
    """Every stack's first layer gets n equal copies of the embedded input (the encoder's with its
    padding zeroed); the stack outputs its LayerNorm of the last layer's streams summed, and
    reports every layer's state as that sum."""
    model = hyper_model("all", 4, "mhc")
    seen = {}
    for side in ("encoder", "decoder"):
        layers = getattr(model, side).layers
        layers[0].register_forward_pre_hook(lambda m, args, side=side: seen.__setitem__((side, "in"), args[0]))
        layers[-1].register_forward_hook(lambda m, args, out, side=side: seen.__setitem__((side, "out"), out[0]))
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    enc = model.encoder
    encoder_out = enc(src, src_lengths=src_len, return_all_hiddens=True)
    features, extra = model.decoder(prev, encoder_out=encoder_out, features_only=True)
    embedded = {
        "encoder": (
            (enc.embed_scale * enc.embed_tokens(src) + enc.embed_positions(src)) * src.ne(DICT.pad()).unsqueeze(-1)
        ),
        "decoder": model.decoder.embed_scale * model.decoder.embed_tokens(prev) + model.decoder.embed_positions(prev),
    }
    outputs = {"encoder": encoder_out["encoder_out"][0], "decoder": features.transpose(0, 1)}
    states = {"encoder": encoder_out["encoder_states"], "decoder": extra["inner_states"]}
    for side in ("encoder", "decoder"):
        streams = seen[side, "in"]
        assert streams.shape == (*embedded[side].transpose(0, 1).shape[:2], 4, EMBED)
        for i in range(4):
            torch.testing.assert_close(streams[:, :, i], embedded[side].transpose(0, 1), rtol=0, atol=1e-6)
        total = seen[side, "out"].sum(dim=2)
        assert torch.equal(states[side][-1], total) and all(s.shape == total.shape for s in states[side])
        layer_norm = getattr(model, side).layer_norm
        torch.testing.assert_close(outputs[side], layer_norm(total), rtol=0, atol=0)


@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("mix", MIXES)
def test_a_new_model_starts_as_pre_ln(mix, weights):
    """At initialisation the k-th sublayer of a stack reads stream k mod n, nothing is mixed and
    every stream receives the output (B = 1; mHC: 2·σ(0)), dynamic weights zero with scales 0.01:
    with Pre-LN's other parameters the model computes Pre-LN's outputs, up to what LayerNorm's ε
    does to n·x and to mHC's read (0.73 + 0.5·(n − 1) times x)."""
    pre_ln = perturb_(realformer("all", "mean", "pre-ln", dictionary=DICT))
    model = hyper_model("all", 4, mix, weights, perturb=False)
    missing, unexpected = model.load_state_dict(pre_ln.state_dict(), strict=False)
    assert not unexpected and missing == [name for name in model.state_dict() if "_hyper_connection." in name]
    for side, per_layer in (("encoder", 2), ("decoder", 3)):
        names = ["self_attn", "encoder_attn", "ffn"] if per_layer == 3 else ["self_attn", "ffn"]
        for i, layer in enumerate(getattr(model, side).layers):
            for j, name in enumerate(names):
                connection = getattr(layer, f"{name}_hyper_connection")
                read = torch.zeros(4)
                read[(i * per_layer + j) % 4] = 1
                assert torch.equal(connection.static_alpha, torch.cat([read[:, None], torch.eye(4)], dim=1))
                assert torch.equal(connection.static_beta, torch.full((4,), 1.0 if mix == "hc" else 0.0))
                if weights == "dynamic":
                    assert not connection.dynamic_alpha_fn.any() and not connection.dynamic_beta_fn.any()
                    scales = (connection.dynamic_alpha_scale, connection.dynamic_beta_scale)
                    assert all(torch.equal(s, torch.full_like(s, 0.01)) for s in scales)
                else:
                    assert connection.norm is None and not hasattr(connection, "dynamic_alpha_fn")
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    for got, want in zip(forward(model, src, src_len, prev)[:2], forward(pre_ln, src, src_len, prev)[:2]):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    # and with its weights trained (here perturbed), the streams make another model
    assert differs_beyond_rounding(
        forward(perturb_(model), src, src_len, prev)[1], forward(pre_ln, src, src_len, prev)[1]
    )


def test_mhc_mix_is_doubly_stochastic_and_keeps_the_sum_of_the_streams():
    """With trained-like (perturbed) weights: every token's mix has rows summing to 1 exactly and
    columns to 1 within Sinkhorn-Knopp's 20 iterations; the reads and writes are positive."""
    model = hyper_model("all", 4, "mhc")
    connection = model.decoder.layers[1].encoder_attn_hyper_connection
    streams = torch.randn(5, 3, 4, EMBED)
    alpha, beta = connection.weights(streams)
    mix = alpha[..., 1:]
    torch.testing.assert_close(mix.sum(dim=-1), torch.ones(5, 3, 4), rtol=0, atol=1e-6)
    torch.testing.assert_close(mix.sum(dim=-2), torch.ones(5, 3, 4), rtol=0, atol=1e-3)
    assert (alpha > 0).all() and (beta > 0).all() and (beta < 2).all()
    _, widened = connection.width_connection(streams)
    torch.testing.assert_close(widened.streams.sum(dim=2), streams.sum(dim=2), rtol=0, atol=1e-5)


def test_the_sublayer_input_does_not_keep_the_whole_mix_alive():
    """What a sublayer saves of its input h₀ for backward (a LayerNorm: the input itself) is h₀'s
    own C a token, not the (1 + n)·C product it was read from: a view of that product kept all of it
    until the backward pass (2.63x Pre-LN's saved bytes at 6L-6L and n = 4, 2.13x with h₀ copied)."""
    connection = HyperConnection(4, EMBED, index=1)
    streams = torch.randn(5, 3, 4, EMBED, requires_grad=True)
    h0, _ = connection.width_connection(streams)
    kept = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        torch.nn.LayerNorm(EMBED)(h0)  # the Pre-LN sublayer's first step
    h0_bytes = h0.numel() * h0.element_size()
    assert h0_bytes <= sum(kept.values()) < 2 * h0_bytes  # h₀; the weights, mean and 1/σ (the view: 5x)


# --- decoding -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("mix", MIXES)
def test_incremental_decoding_equals_full_forward(mix, weights):
    assert_incremental_decoding_equals_full_forward(hyper_model("all", 4, mix, weights, *VALUE_RESIDUAL["vr-learned"]))


@pytest.mark.parametrize("mix, paths", [("hc", "all"), ("mhc", "all"), ("mhc", "none")])
def test_beam_search_scores_are_the_models_probabilities(mix, paths):
    """Beam 4 through fairseq's generator, which reorders the cached keys and values the streams'
    reads produced: each hypothesis' scores are the teacher-forced forward pass's."""
    model = realformer(paths, "mean", "pre-ln", *streams_flags(4, mix), dictionary=DICT)
    assert_beam_search_scores_are_the_models(perturb_(model, scale=0.5))


# --- training ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("mix", MIXES)
def test_every_connection_weight_is_trained(mix, weights):
    """Every parameter of every connection, the stream mix's entries one by one, gets a finite,
    non-zero gradient (a Sinkhorn-Knopp that saturated to a permutation would give the mix none)."""
    model = hyper_model("all", 4, mix, weights).train()
    logits, _ = model(*random_batch(DICT, SRC_LENS, TGT_LENS))
    F.log_softmax(logits, dim=-1).mean().backward()
    for connection in connections(model):
        for name, p in connection.named_parameters():
            assert torch.isfinite(p.grad).all(), name
            assert p.grad.abs().sum() > 0, name
        assert (connection.static_alpha.grad[:, 1:] != 0).all(), "an entry of the stream mix is not trained"


def test_layerdrop_passes_the_streams_past_a_dropped_layer():
    """A dropped layer leaves the streams as they are (as a dropped residual layer leaves x); the
    layers that run keep their own connections."""
    layers, p = 4, 0.5
    drop = ["--encoder-layers", str(layers), "--decoder-layers", str(layers)]
    drop += ["--encoder-layerdrop", str(p), "--decoder-layerdrop", str(p)]
    model = hyper_model("all", 4, "mhc", "dynamic", *drop)
    seed, kept_enc, kept_dec = layerdrop_draw(layers, p, some_dropped(layers))
    enc, logits, ref = forward_under_layerdrop(
        model, seed, kept_enc, kept_dec, backbone="pre-ln", streams=4, stream_mix="mhc"
    )
    assert_close_at(enc, ref["encoder_out"], real_positions(SRC_LENS, left=True))
    assert_close_at(logits, ref["logits"], real_positions(TGT_LENS, left=False))


def test_activation_checkpointing_gives_the_same_outputs_and_gradients():
    assert_activation_checkpointing_changes_nothing(
        lambda *flags: hyper_model("all", 4, "mhc", "dynamic", *VALUE_RESIDUAL["vr-learned"], *flags)
    )


@pytest.mark.usefixtures("traced")  # dynamo's tracing alone, no graph kept from before or after
def test_compiled_layers_trace_the_eager_step_without_a_graph_break():
    """--compile-layers: a traced training step under --bf16's autocast (which the connections
    switch off inside the graph) computes the eager one, with the graphs of a model without streams
    and no graph break. mHC (hc's code and Sinkhorn-Knopp) of 2+2 layers with 3 iterations: dynamo
    traces each iteration, and 20 took as long again; a float32 step traced as long again too."""
    flags = [*streams_flags(4, "mhc"), "--residual-streams-sinkhorn-iterations", "3", *TWO_LAYERS]
    eager = perturb_(realformer("all", "mean", "pre-ln", *flags, dictionary=DICT))
    compiled_model = realformer("all", "mean", "pre-ln", *flags, "--compile-layers", dictionary=DICT)
    compiled_model.load_state_dict(eager.state_dict())
    with precision.autocast("cpu"):
        loss, grads = compiled_steps.train_step(eager, compiled_steps.BATCHES[0], seed=0)
        compiled_loss, compiled_grads = compiled_steps.train_step(compiled_model, compiled_steps.BATCHES[0], seed=0)
    assert compiled_loss == loss and all(torch.equal(compiled_grads[n], g) for n, g in grads.items())
    # each stack's first layer, the decoder's last (alignment) layer, the encoder's others
    assert compiled_steps.graphs() == 4 and compiled_steps.graph_breaks() == 0


def test_bf16_keeps_the_streams_in_float32():
    """Under --bf16's autocast the matrix products of the sublayers run in bfloat16, the streams
    and their connections in float32 (as Pre-LN's residual stream); the outputs are float32's to
    bfloat16's rounding (tests/test_bf16.py's tolerance)."""
    model = hyper_model("all", 4, "mhc")
    dtypes = []
    model.decoder.layers[1].register_forward_hook(lambda m, args, out: dtypes.append(out[0].dtype))
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    with torch.no_grad():
        _, want, _ = forward(model, src, src_len, prev)
        with precision.autocast("cpu"):
            _, got, _ = forward(model, src, src_len, prev)
    assert got.dtype == torch.bfloat16 and dtypes == [torch.float32, torch.float32]
    assert 0 < ((got.float() - want).norm() / want.norm()).item() < 0.05


# --- what cannot be -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--residual-streams", "0"], "--residual-streams 0: give a whole number >= 1"),
        (["--residual-streams", "two"], "--residual-streams two: give a whole number >= 1"),
        (
            ["--residual-streams", "4"],
            "--residual-streams 4 needs --backbone pre-ln, not --backbone admin: Hyper-Connections are defined on Pre-LN",
        ),
        (
            ["--residual-streams", "2", "--backbone", "post-ln"],
            "--residual-streams 2 needs --backbone pre-ln, not --backbone post-ln: Hyper-Connections are defined on Pre-LN",
        ),
        (["--residual-streams-mix", "sinkhorn"], "--residual-streams-mix sinkhorn: choose from hc, mhc"),
        (["--residual-streams-weights", "learned"], "--residual-streams-weights learned: choose from dynamic, static"),
        (
            ["--backbone", "pre-ln", "--residual-streams-mix", "mhc"],
            "--residual-streams-mix mhc needs --residual-streams N >= 2: one stream is the backbone's own residual",
        ),
        (
            ["--backbone", "pre-ln", "--residual-streams-weights", "static"],
            "--residual-streams-weights static needs --residual-streams N >= 2: one stream is the backbone's own residual",
        ),
        (
            ["--backbone", "pre-ln", "--residual-streams", "4", "--residual-streams-sinkhorn-iterations", "5"],
            "--residual-streams-sinkhorn-iterations 5 needs --residual-streams-mix mhc: hc's stream mix is not projected",
        ),
        (
            [*streams_flags(4, "mhc"), "--backbone", "pre-ln", "--residual-streams-sinkhorn-iterations", "0"],
            "--residual-streams-sinkhorn-iterations 0: give a whole number >= 1",
        ),
    ],
)
def test_impossible_flags_are_one_line_naming_them(flags, message):
    with pytest.raises(RealformerConfigError) as error:
        build_model("realformer_iwslt_de_en", *flags, dictionary=DICT)
    assert str(error.value) == message


def test_sinkhorn_scales_a_row_far_below_the_others_and_trains_it():
    """Logits 200 apart: exp() underflows to 0 and divisions leave a row of zeros (with NaN
    gradients); the log domain gives the doubly stochastic matrix, and finite gradients."""
    logits = torch.tensor([[0.0, 0.0], [-200.0, -200.0]], requires_grad=True)
    matrix = hyper_connections.sinkhorn(logits, SINKHORN_ITERATIONS)
    assert torch.equal(matrix, torch.full((2, 2), 0.5))
    (matrix * torch.tensor([[1.0, 2.0], [3.0, 4.0]])).sum().backward()
    assert torch.isfinite(logits.grad).all()


# --- as a user runs it ---------------------------------------------------------------------------------

STREAMS_TRAIN = [
    "--user-dir",
    USER_DIR,
    *"--arch realformer_iwslt_de_en --backbone pre-ln --value-residual-paths all".split(),
    *streams_flags(4, "mhc"),
    *"--encoder-layers 2 --decoder-layers 2 --encoder-attention-heads 2 --decoder-attention-heads 2".split(),
    "--share-all-embeddings",
    *SMALL,
    *"--optimizer adam --lr 5e-3 --lr-scheduler inverse_sqrt --warmup-updates 4 --max-tokens 1500".split(),
    *"--criterion label_smoothed_cross_entropy --label-smoothing 0.1 --seed 1 --num-workers 0".split(),
    *"--max-epoch 2 --log-format json --log-interval 1 --save-dir ckpt --bf16".split(),
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two epochs (8 updates) of a 2+2-layer mHC model, --bf16, on the toy corpus of tests/cli.py
    (binarised in tests/data/compat-0.1.0), its epoch checkpoints averaged."""
    work = tmp_path_factory.mktemp("streams")
    return work, train_and_average(work, FIXTURES / "bin", *STREAMS_TRAIN)


def test_fairseq_train_trains_and_the_checkpoints_average(trained):
    work, log = trained
    losses = [float(loss) for loss in train_losses(log)]
    assert len(losses) >= 6 and losses[-1] < losses[0], log[-2000:]
    states = [torch.load(work / "ckpt" / f"checkpoint{e}.pt", weights_only=False)["model"] for e in (1, 2)]
    averaged = torch.load(work / "ckpt" / "avg.pt", weights_only=False)["model"]
    name = "decoder.layers.1.encoder_attn_hyper_connection.static_alpha"
    assert states[0][name].shape == (4, 5) and not torch.equal(states[0][name], states[1][name])
    torch.testing.assert_close(averaged[name], (states[0][name] + states[1][name]) / 2)


def test_checkpoints_of_other_stream_settings_are_not_averaged():
    """Two mHC models with the same parameters but another number of Sinkhorn-Knopp iterations
    compute different things: averaging them is refused, naming the setting."""
    average = load_script("average_checkpoints")
    flags = ["--backbone", "pre-ln", *streams_flags(4, "mhc")]
    states = [
        {"cfg": {"model": parse_args("realformer", *flags, "--residual-streams-sinkhorn-iterations", t)}}
        for t in ("20", "5")
    ]
    params = {"w": torch.zeros(1)}
    settings = [average.model_settings(state) for state in states]
    with pytest.raises(average.UserError, match="residual_streams_sinkhorn_iterations is '20' in the first, '5'"):
        average.check_same_model("b.pt", params, settings[1], "a.pt", params, settings[0])


def test_interactive_and_the_hub_translate_with_the_averaged_checkpoint(trained):
    work, _ = trained
    options = translate_with_the_average(work, FIXTURES / "bin").options
    assert options.residual_streams == 4 and options.residual_streams_mix == "mhc"
