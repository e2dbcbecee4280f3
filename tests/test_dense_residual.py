"""Depth-weighted averages (--dense-residual dwa: DenseFormer): without them, today's model bit for
bit; a new model computes its backbone's outputs exactly; with trained weights, the equations
(tests/reference.py) on every residual-attention path, with value residual, dilation and period;
what the authors' code computes; decoding step by step and beam search give the full forward pass;
every weight is trained; LayerDrop, activation checkpointing, compiled layers and --bf16 compute
what they should; fairseq-train, checkpoint averaging, fairseq-interactive and the hub run it;
impossible flags are one line."""

import pytest
import torch
import torch.nn.functional as F

from fairseq_realformer.errors import RealformerConfigError
from fairseq_realformer.modules.dense_residual import DepthWeightedAverage
from fairseq_realformer.optim import precision

from . import compiled_steps
from .cli import load_script, train_and_average, train_losses, translate_with_the_average
from .helpers import (
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
)

# every backbone with one residual stream; ResiDual's second stream is refused
BACKBONES = ["post-ln", "pre-ln", "admin", "deepnorm", "rezero", "t-fixup"]


def dense_flags(dilation=1, period=1):
    return [
        "--dense-residual",
        "dwa",
        *f"--dense-residual-dilation {dilation} --dense-residual-period {period}".split(),
    ]


def layers_flags(layers):
    return ["--encoder-layers", str(layers), "--decoder-layers", str(layers)]


def dense_model(backbone="pre-ln", paths="all", dilation=1, period=1, *flags, perturb=True):
    """A tiny model with the averages, its parameters (the averages' weights too) moved off their
    initial values."""
    model = realformer(paths, "mean", backbone, *dense_flags(dilation, period), *flags, dictionary=DICT)
    return perturb_(model) if perturb else model


def assert_close_at(got, want, positions, layers):
    """*got* is *want* at *positions* to float32's rounding through the model of *layers* layers
    and its averages (each a sum of up to layers + 1 terms, after every layer of both stacks)."""
    index = tuple(torch.tensor(i) for i in zip(*positions))
    assert_within_rounding(got[index], want[index], layers, *[layers + 1] * (2 * layers))


def alphas(model):
    return {name: p for name, p in model.named_parameters() if ".dense_residual.alphas." in name}


# --- without them, and at the start ---------------------------------------------------------------------


@pytest.mark.parametrize("backbone", ["pre-ln", "admin"])
def test_none_is_todays_model_bit_for_bit(backbone):
    """--dense-residual none (and dilation and period at 1) builds the model the flags' absence
    builds: the same parameters from the same seed, the same outputs and gradients bit for bit."""
    results = []
    flags = ["--dense-residual", "none", "--dense-residual-dilation", "1", "--dense-residual-period", "1"]
    for more in ([], flags):
        model = realformer("all", "mean", backbone, *more, *VALUE_RESIDUAL["vr-learned"], dictionary=DICT)
        assert model.encoder.dense_residual is None and not alphas(model)
        model = perturb_(model).train()
        logits, extra = model(*random_batch(DICT, SRC_LENS, TGT_LENS))
        logits.sum().backward()
        results.append((model.state_dict(), logits, {n: p.grad for n, p in model.named_parameters()}))
    (state, logits, grads), (state1, logits1, grads1) = results
    assert list(state1) == list(state) and all(torch.equal(state1[k], v) for k, v in state.items())
    assert torch.equal(logits1, logits)
    assert grads1.keys() == grads.keys() and all(torch.equal(grads1[k], g) for k, g in grads.items())


@pytest.mark.parametrize("backbone", BACKBONES)
def test_a_new_model_is_its_backbone_exactly(backbone):
    """The weights start at α_{i,i} = 1, the others 0 (the paper's and the authors' initialisation):
    with the backbone's other parameters, the outputs are the backbone's, bit for bit (adding zeros
    changes no float); with trained (here perturbed) weights they are not."""
    base = perturb_(realformer("all", "mean", backbone, *layers_flags(4), dictionary=DICT))
    model = realformer("all", "mean", backbone, *dense_flags(2, 1), *layers_flags(4), dictionary=DICT)
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected and missing == list(alphas(model))
    for side in ("encoder", "decoder"):
        weights = [alphas(model)[f"{side}.dense_residual.alphas.{i}"] for i in range(4)]
        # dilation 2: layer i averages X_j, j = i mod 2, ..., i
        assert [w.tolist() for w in weights] == [[1.0], [0.0, 1.0], [0.0, 1.0], [0.0, 0.0, 1.0]]
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    for got, want in zip(forward(model, src, src_len, prev)[:2], forward(base, src, src_len, prev)[:2]):
        assert torch.equal(got, want)
    perturb_(model)
    assert differs_beyond_rounding(forward(model, src, src_len, prev)[1], forward(base, src, src_len, prev)[1], 4)


# --- with trained weights: the equations ----------------------------------------------------------------


@pytest.mark.parametrize(
    "backbone, paths, value_residual, layers, dilation, period",
    [
        ("pre-ln", "all", "no-vr", 3, 1, 1),
        ("pre-ln", "none", "vr-learned", 3, 1, 1),
        ("post-ln", "all", "vr-half", 4, 2, 1),
        ("admin", "all", "no-vr", 4, 1, 2),
        ("pre-ln", "all", "vr-learned", 5, 2, 2),
        ("rezero", "decoder,cross", "no-vr", 4, 3, 1),
        ("deepnorm", "all", "no-vr", 3, 1, 3),
        ("t-fixup", "all", "no-vr", 3, 1, 1),
    ],
)
def test_matches_reference(backbone, paths, value_residual, layers, dilation, period):
    flags = [*layers_flags(layers), *VALUE_RESIDUAL[value_residual]]
    model = dense_model(backbone, paths, dilation, period, *flags)
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    enc, logits, extra = forward(model, src, src_len, prev)
    ref = reference_forward(
        model,
        src,
        prev,
        paths=paths_of(paths),
        mode="mean",
        backbone=backbone,
        heads=2,
        dense=(dilation, period),
        **value_residual_of(value_residual),
    )
    # the averages' sums: up to `layers` terms after each layer
    assert_close_at(enc, ref["encoder_out"], real_positions(SRC_LENS, left=True), layers)
    assert_close_at(logits, ref["logits"], real_positions(TGT_LENS, left=False), layers)


# --- against the authors' code -------------------------------------------------------------------------


def authors_dwa(blocks, x, weights, dilation, period):
    """What DenseFormer's ``DWAModules`` computes (epfml/DenseFormer at commit
    ff4aee83b6fff93b64af9f1c2e7b2b412425ef38, ``denseformer/denseformer.py``, read on 2026-12-05),
    written again here from that file, not copied: it keeps one accumulator per residue class
    (block_idx + 1) mod dilation, the embedded input in class 0's first slot; block_idx's output goes
    into slot (block_idx + 1) // dilation of its class, and when (block_idx + 1) % period == 0 the
    next block reads ``tensordot(alphas[block_idx].weight.view(-1), <that class's slots so far>)``,
    ``alphas[block_idx]`` a bias-free Linear((block_idx + 1 + dilation) // dilation, 1) whose weight
    starts as zeros with a 1 last. *weights*: those weights by block_idx, (1, m) each."""
    classes = [[] for _ in range(dilation)]
    classes[0].append(x)
    for block_idx, block in enumerate(blocks):
        x = block(x)
        group = classes[(block_idx + 1) % dilation]
        group.append(x)
        assert len(group) == (block_idx + 1) // dilation + 1
        if (block_idx + 1) % period == 0:
            x = torch.tensordot(weights[block_idx].view(-1), torch.stack(group), dims=1)
    return x


@pytest.mark.parametrize("dilation, period", [(1, 1), (2, 1), (1, 3), (4, 5), (3, 2)])
def test_the_averages_compute_what_the_authors_code_does(dilation, period):
    """Twelve stand-in blocks (a linear map and tanh) between the averages: the same initial
    weights as the authors' (their Linear's weight, zeros with a 1 last), then, with weights drawn
    at random and copied into both, the same output and the same gradients for the weights, the
    blocks and the input, to float32 rounding."""
    torch.manual_seed(0)
    blocks_count, shape = 12, (5, 3, 8)
    ours = DepthWeightedAverage(blocks_count, dilation, period)
    theirs = {}
    for block_idx in range(blocks_count):
        if (block_idx + 1) % period:
            assert str(block_idx) not in ours.alphas
            continue
        width = (block_idx + 1 + dilation) // dilation
        initial = torch.zeros(1, width)
        initial[0, -1] = 1.0
        assert torch.equal(ours.alphas[str(block_idx)].detach(), initial.view(-1))
        theirs[block_idx] = torch.randn(1, width, requires_grad=True)
        ours.alphas[str(block_idx)].data.copy_(theirs[block_idx].detach().view(-1))
    linears = [torch.nn.Linear(8, 8) for _ in range(blocks_count)]
    blocks = [lambda h, linear=linear: torch.tanh(linear(h)) for linear in linears]
    x = torch.randn(*shape, requires_grad=True)

    want = authors_dwa(blocks, x, theirs, dilation, period)
    probe = torch.randn(shape)
    (want * probe).sum().backward()
    want_grads = [x.grad.clone()] + [linear.weight.grad.clone() for linear in linears]
    want_alphas = {i: w.grad.view(-1) for i, w in theirs.items()}
    x.grad = None
    for linear in linears:
        linear.weight.grad = None

    states = ours.start(x)
    got = x
    for block_idx, block in enumerate(blocks):
        got = states.after(block_idx, block(got))
    (got * probe).sum().backward()
    got_grads = [x.grad] + [linear.weight.grad for linear in linears]

    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    for block_idx, grad in want_alphas.items():
        torch.testing.assert_close(ours.alphas[str(block_idx)].grad, grad, rtol=1e-4, atol=1e-5)


def test_the_averages_keep_one_copy_of_each_state():
    """Memory grows with the layers, not with their square: the states the averages of a forward
    pass keep for their backward are the L + 1 states' buffers (the authors' in-place slices), not
    a stacked copy for each average (L(L + 1)/2 states)."""
    layers, shape = 12, (7, 3, 8)
    average = DepthWeightedAverage(layers)
    kept = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(*shape, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        states, h = average.start(x), x
        for i in range(layers):
            h = states.after(i, h * 1.5)
    state_bytes = x.numel() * x.element_size()
    # the buffer of X_0 .. X_L, the multiplications' inputs (h, one state each) and the weights
    assert sum(kept.values()) < (layers + 1) * state_bytes + layers * state_bytes + 4096


# --- decoding ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backbone, dilation, period", [("pre-ln", 1, 1), ("post-ln", 2, 2)])
def test_incremental_decoding_equals_full_forward(backbone, dilation, period):
    model = dense_model(backbone, "all", dilation, period, *VALUE_RESIDUAL["vr-learned"])
    assert_incremental_decoding_equals_full_forward(model)


@pytest.mark.parametrize("backbone, paths", [("pre-ln", "all"), ("admin", "none")])
def test_beam_search_scores_are_the_models_probabilities(backbone, paths):
    """Beam 4 through fairseq's generator: the averages are position-wise and need no state of
    their own, so each hypothesis' scores are the teacher-forced forward pass's."""
    model = realformer(paths, "mean", backbone, *dense_flags(), dictionary=DICT)
    assert_beam_search_scores_are_the_models(perturb_(model, scale=0.5))


# --- training ---------------------------------------------------------------------------------------------


def test_every_weight_of_every_average_is_trained():
    model = dense_model("pre-ln", "all", 1, 1).train()
    logits, _ = model(*random_batch(DICT, SRC_LENS, TGT_LENS))
    F.log_softmax(logits, dim=-1).mean().backward()
    assert len(alphas(model)) == 6
    for name, p in alphas(model).items():
        assert torch.isfinite(p.grad).all() and (p.grad != 0).all(), name


def test_layerdrop_makes_a_dropped_layer_an_identity_averaged_after():
    """A dropped layer outputs its input and is averaged after as any other (reference), so each
    weight keeps its layer: here the encoder's last layer and the decoder's first are dropped."""
    layers, p = 4, 0.5
    drop = [*layers_flags(layers), "--encoder-layerdrop", str(p), "--decoder-layerdrop", str(p)]
    model = dense_model("pre-ln", "all", 2, 1, *drop)

    def wanted(kept_enc, kept_dec):
        return layers - 1 not in kept_enc and 0 not in kept_dec and len(kept_enc) >= 2 and len(kept_dec) >= 2

    seed, kept_enc, kept_dec = layerdrop_draw(layers, p, wanted, seeds=range(200))
    enc, logits, ref = forward_under_layerdrop(model, seed, kept_enc, kept_dec, backbone="pre-ln", dense=(2, 1))
    assert_close_at(enc, ref["encoder_out"], real_positions(SRC_LENS, left=True), layers)
    assert_close_at(logits, ref["logits"], real_positions(TGT_LENS, left=False), layers)


def test_activation_checkpointing_gives_the_same_outputs_and_gradients():
    assert_activation_checkpointing_changes_nothing(
        lambda *flags: dense_model("pre-ln", "all", 2, 1, *VALUE_RESIDUAL["vr-learned"], *flags)
    )


@pytest.mark.usefixtures("traced")  # dynamo's tracing alone, no graph kept from before or after
def test_compiled_layers_trace_the_eager_step_without_a_graph_break():
    """--compile-layers compiles the layers; the averages run between them, eager: a traced
    training step under --bf16's autocast computes the eager one, with the graphs of a model
    without averages and no graph break."""
    flags = [*dense_flags(), *layers_flags(2)]
    eager = perturb_(realformer("all", "mean", "pre-ln", *flags, dictionary=DICT))
    compiled_model = realformer("all", "mean", "pre-ln", *flags, "--compile-layers", dictionary=DICT)
    compiled_model.load_state_dict(eager.state_dict())
    with precision.autocast("cpu"):
        loss, grads = compiled_steps.train_step(eager, compiled_steps.BATCHES[0], seed=0)
        compiled_loss, compiled_grads = compiled_steps.train_step(compiled_model, compiled_steps.BATCHES[0], seed=0)
    assert compiled_loss == loss and all(torch.equal(compiled_grads[n], g) for n, g in grads.items())
    assert any(".dense_residual." in n for n in compiled_grads)
    assert compiled_steps.graphs() == 4 and compiled_steps.graph_breaks() == 0


@pytest.mark.parametrize("backbone", ["pre-ln", "post-ln"])
def test_bf16_keeps_the_averages_in_float32(backbone):
    """Under --bf16's autocast an average (a matrix product, which autocast would round to
    bfloat16) runs in float32, as the residual stream it replaces; the outputs are float32's to
    bfloat16's rounding (tests/test_bf16.py's tolerance)."""
    model = dense_model(backbone)
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    with torch.no_grad():
        _, want, _ = forward(model, src, src_len, prev)
        with precision.autocast("cpu"):
            _, got, extra = forward(model, src, src_len, prev)
    assert {state.dtype for state in extra["inner_states"][1:]} == {torch.float32}
    assert got.dtype == torch.bfloat16 and 0 < ((got.float() - want).norm() / want.norm()).item() < 0.05


# --- what cannot be -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--dense-residual", "dense"], "--dense-residual dense: choose from none, dwa"),
        (["--dense-residual-dilation", "2"], "--dense-residual-dilation 2 needs --dense-residual dwa"),
        (["--dense-residual-period", "5"], "--dense-residual-period 5 needs --dense-residual dwa"),
        ([*dense_flags(0, 1)], "--dense-residual-dilation 0: give a whole number >= 1"),
        (
            [*dense_flags(1, 4), "--encoder-layers", "6"],
            "--dense-residual-period 4 is more than --decoder-layers 3: that stack would average nowhere",
        ),
        (
            [*dense_flags(), "--backbone", "resi-dual"],
            "--dense-residual dwa: not with --backbone resi-dual, whose stack carries a second stream that the "
            "averages would leave out",
        ),
        (
            [*dense_flags(), "--backbone", "pre-ln", "--residual-streams", "4"],
            "--dense-residual dwa: not with --residual-streams 4: the averages are defined on one residual stream",
        ),
    ],
)
def test_impossible_flags_are_one_line_naming_them(flags, message):
    with pytest.raises(RealformerConfigError) as error:
        build_model("realformer_iwslt_de_en", *flags, dictionary=DICT)
    assert str(error.value) == message


# --- as a user runs it ---------------------------------------------------------------------------------

DENSE_TRAIN = [
    "--user-dir",
    USER_DIR,
    *"--arch realformer_iwslt_de_en --backbone pre-ln --value-residual-paths all".split(),
    *dense_flags(2, 1),
    *"--encoder-layers 3 --decoder-layers 3 --encoder-attention-heads 2 --decoder-attention-heads 2".split(),
    "--share-all-embeddings",
    *SMALL,
    *"--optimizer adam --lr 5e-3 --lr-scheduler inverse_sqrt --warmup-updates 4 --max-tokens 1500".split(),
    *"--criterion label_smoothed_cross_entropy --label-smoothing 0.1 --seed 1 --num-workers 0".split(),
    *"--max-epoch 2 --log-format json --log-interval 1 --save-dir ckpt --bf16".split(),
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two epochs (8 updates) of a 3+3-layer model with dilated averages, --bf16, on the toy corpus
    of tests/cli.py (binarised in tests/data/compat-0.1.0), its epoch checkpoints averaged."""
    work = tmp_path_factory.mktemp("dense")
    return work, train_and_average(work, FIXTURES / "bin", *DENSE_TRAIN)


def test_fairseq_train_trains_the_averages_and_the_checkpoints_average(trained):
    work, log = trained
    losses = [float(loss) for loss in train_losses(log)]
    assert len(losses) >= 6 and losses[-1] < losses[0], log[-2000:]
    states = [torch.load(work / "ckpt" / f"checkpoint{e}.pt", weights_only=False)["model"] for e in (1, 2)]
    averaged = torch.load(work / "ckpt" / "avg.pt", weights_only=False)["model"]
    name = "decoder.dense_residual.alphas.2"  # after layer 3: X_1 and X_3 (dilation 2)
    assert states[0][name].shape == (2,) and not torch.equal(states[0][name], states[1][name])
    torch.testing.assert_close(averaged[name], (states[0][name] + states[1][name]) / 2)


def test_checkpoints_of_another_dilation_are_not_averaged():
    average = load_script("average_checkpoints")
    states = [{"cfg": {"model": parse_args("realformer", "--backbone", "pre-ln", *dense_flags(k, 1))}} for k in (2, 3)]
    params = {"w": torch.zeros(1)}
    settings = [average.model_settings(state) for state in states]
    with pytest.raises(average.UserError, match="dense_residual_dilation is '2' in the first, '3'"):
        average.check_same_model("b.pt", params, settings[1], "a.pt", params, settings[0])


def test_interactive_and_the_hub_translate_with_the_averaged_checkpoint(trained):
    work, _ = trained
    options = translate_with_the_average(work, FIXTURES / "bin").options
    assert (options.dense_residual, options.dense_dilation, options.dense_period) == ("dwa", 2, 1)
