"""studies/deepnorm_vs_torchscale.py's mapping of the plugin's DeepNorm model onto torchscale's:
with the plugin's weights copied in, torchscale's EncoderDecoder(deepnorm=True) computes the plugin's
forward pass, in eval mode and with dropout on from one seed, and the same gradients. torchscale is
a study tool, not a requirement: without it (CI) these tests skip."""

import pytest
import torch

pytest.importorskip(
    "torchscale", reason="torchscale is not installed (pip install --no-deps torchscale fairscale==0.4.0)"
)
pytest.importorskip("fairscale", reason="torchscale imports fairscale (pip install --no-deps fairscale==0.4.0)")

from studies.deepnorm_vs_torchscale import build_torchscale, copy_weights, parameter_pairs

from .helpers import (
    assert_within_rounding,
    build_model,
    make_dictionary,
    model_sums,
    perturb_,
    random_batch,
    rounding,
)

LAYERS = 2
DEEPNORM = ("--residual-attention-paths", "none", "--backbone", "deepnorm", "--share-all-embeddings")
DEPTH = ("--encoder-layers", str(LAYERS), "--decoder-layers", str(LAYERS))


def pair(*flags):
    """The plugin's tiny DeepNorm model (weights moved off their initial values) and torchscale's,
    with the plugin's weights copied in; both in eval mode."""
    dictionary = make_dictionary()
    plugin = perturb_(build_model("realformer", *DEEPNORM, *DEPTH, *flags, dictionary=dictionary))
    torchscale = build_torchscale(plugin.args, dictionary)
    pairs = parameter_pairs(plugin, torchscale)
    copy_weights(plugin, torchscale, pairs)
    return plugin, torchscale.eval(), pairs, dictionary


def sample(dictionary):
    src, lengths, prev = random_batch(dictionary, [7, 5, 3], [6, 4, 2])
    target = prev.roll(-1, dims=1)  # any tokens; padding where the decoder input has it
    target[prev.eq(dictionary.pad())] = dictionary.pad()
    return {
        "net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
        "target": target,
        "ntokens": int(target.ne(dictionary.pad()).sum()),
    }


def test_every_parameter_is_paired_once_and_alpha_is_the_plugins():
    plugin, torchscale, pairs, _ = pair()
    assert len(pairs) == len(list(plugin.parameters())) == len(list(torchscale.parameters()))
    for side in ("encoder", "decoder"):
        ours = [layer.residual_alpha for layer in getattr(plugin, side).layers]
        theirs = [layer.alpha for layer in getattr(torchscale.ts, side).layers]
        assert ours == pytest.approx(theirs, rel=1e-12) and ours[0] > 1


def test_the_copied_weights_give_the_plugins_logits():
    plugin, torchscale, _, dictionary = pair()
    batch = sample(dictionary)
    real = batch["target"].ne(dictionary.pad())
    with torch.no_grad():
        ours = plugin(**batch["net_input"])[0]
        theirs = torchscale(**batch["net_input"])[0]
        encoded = [m.encoder(batch["net_input"]["src_tokens"])["encoder_out"][0] for m in (plugin, torchscale)]
    assert_within_rounding(theirs[real], ours[real], LAYERS)
    src_real = batch["net_input"]["src_tokens"].ne(dictionary.pad()).t()
    assert_within_rounding(encoded[1][src_real], encoded[0][src_real], LAYERS)


def test_with_dropout_on_one_seed_drops_the_same_units_and_gives_the_same_gradients():
    plugin, torchscale, pairs, dictionary = pair("--dropout", "0.3")
    batch = sample(dictionary)
    real = batch["target"].ne(dictionary.pad())
    outputs = []
    for model in (plugin, torchscale):
        model.train()
        torch.manual_seed(3)
        logits = model(**batch["net_input"])[0]
        lprobs = model.get_normalized_probs((logits, None), log_probs=True)
        torch.nn.functional.nll_loss(lprobs[real], batch["target"][real], reduction="sum").backward()
        outputs.append(logits.detach())
    with torch.no_grad():
        torch.manual_seed(3)
        plugin.eval()
        assert (plugin(**batch["net_input"])[0] - outputs[0])[real].abs().max() > 1e-3  # dropout did drop
    assert_within_rounding(outputs[1][real], outputs[0][real], LAYERS)
    # to rounding of the largest gradient: some are 0 but for rounding (the keys' biases)
    scale = max(float(mine.grad.abs().max()) for _, mine, _, _ in pairs)
    tolerance = rounding(*model_sums(LAYERS), *model_sums(LAYERS), scale=scale)  # forward, then back
    worst = max((float((theirs.grad - mine.grad).abs().max()), name) for name, mine, _, theirs in pairs)
    assert worst[0] <= tolerance, worst
