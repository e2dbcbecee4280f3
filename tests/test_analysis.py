"""realformer-analyze: per-token attention entropy and adjacent-layer JSD, against the equations."""

import json
import math
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from fairseq import options
from fairseq.data import indexed_dataset
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import ARCH_MODEL_REGISTRY
from matplotlib.image import imread
from omegaconf import OmegaConf
from scipy.spatial.distance import jensenshannon
from scipy.stats import entropy as scipy_entropy

from fairseq_realformer.analysis import cli
from fairseq_realformer.analysis.capture import AttentionRecorder, attention_modules
from fairseq_realformer.analysis.measure import measure
from fairseq_realformer.analysis.statistics import (
    RESOLUTION,
    MedianHistogram,
    PathStatistics,
    TokenSample,
    entropy,
    jensen_shannon,
    path_masks,
)
from fairseq_realformer.options import PATHS

from .cli import BIN, clean_env
from .helpers import (
    HEADS,
    LAYERS,
    assert_within_rounding,
    build_model,
    make_dictionary,
    parse_args,
    paths_of,
    perturb_,
    random_batch,
)
from .reference import reference_forward
from .test_recipes import save_checkpoint

MEDIAN_TOLERANCE = RESOLUTION / 2 + 1e-4  # the histogram's bound, plus the JSON's 4 decimals
LOG = {"nats": math.log, "bits": math.log2}

# name: (arch, flags, residual paths, mode, backbone): a stock fairseq transformer and this
# plugin's model with both attention modules, both modes and several backbones
MODELS = {
    "transformer": ("transformer", (), "none", "sum", "post-ln"),
    "admin-none": (
        "realformer",
        ("--residual-attention-paths", "none", "--backbone", "admin"),
        "none",
        "mean",
        "admin",
    ),
    "realformer-all-mean": ("realformer", ("--residual-attention-paths", "all"), "all", "mean", "admin"),
    "encoder,cross-sum-pre-ln": (
        "realformer",
        ("--residual-attention-paths", "encoder,cross", "--residual-attention-mode", "sum", "--backbone", "pre-ln"),
        "encoder,cross",
        "sum",
        "pre-ln",
    ),
    "decoder-mean-deepnorm": (
        "realformer",
        ("--residual-attention-paths", "decoder", "--backbone", "deepnorm"),
        "decoder",
        "mean",
        "deepnorm",
    ),
}


def model_of(name, seed=0):
    arch, flags, *_ = MODELS[name]
    return perturb_(build_model(arch, *flags, seed=seed), seed=seed + 1)


def net_input(src, lengths, prev):
    return {"net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}}


def reference_probabilities(model, name, src, prev):
    """Every layer's attention probabilities (layers, B, H, T, S) per path, recomputed from the
    reference's carried scores S_n: softmax(mask(S_n / n)) for running mean on a residual path,
    softmax(mask(S_n)) otherwise."""
    _, _, paths, mode, backbone = MODELS[name]
    paths = paths_of(paths)
    ref = reference_forward(model, src, prev, paths=paths, mode=mode, backbone=backbone, heads=HEADS)
    pad = model.encoder.padding_idx
    length = prev.size(1)
    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    masks = {
        "encoder": src.eq(pad)[:, None, None, :],
        "cross": src.eq(pad)[:, None, None, :],
        "decoder": prev.eq(pad)[:, None, None, :] | future,
    }
    probabilities = {}
    for path in PATHS:
        layers = []
        for n, scores in enumerate(ref[f"{path}_scores"], start=1):
            logits = scores / n if (mode == "mean" and path in paths) else scores
            layers.append(torch.softmax(logits.masked_fill(masks[path], float("-inf")), dim=-1))
        probabilities[path] = torch.stack(layers)
    return probabilities


# --- what is recorded -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_recorder_gives_each_layers_per_head_probabilities(name):
    """Equal to an independent recomputation from the equations, for fairseq's attention (whose
    fused self-attention path would average heads) and the plugin's; the model's output does
    not change while recording, and afterwards the fused path and no hooks are left."""
    model = model_of(name)
    src, lengths, prev = random_batch(make_dictionary(), [6, 3, 8], [5, 7, 2], seed=3)
    expected = reference_probabilities(model, name, src, prev)
    received = {path: [] for path in PATHS}

    def consume(path, layer, probabilities):
        assert layer == len(received[path])  # in order, as the layers run
        received[path].append(probabilities)

    with torch.no_grad():
        plain = model(src, lengths, prev)[0]
        with AttentionRecorder(model, consume) as recorder:
            recorded = model(src, lengths, prev)[0]
    assert_within_rounding(recorded, plain)  # recording leaves the fused path: other kernels
    for path in PATHS:
        got = torch.stack(received[path]).transpose(1, 2)  # (layers, B, H, T, S)
        assert (
            got.shape
            == expected[path].shape
            == (LAYERS, 3, HEADS, prev.size(1) if path != "encoder" else 8, 8 if path != "decoder" else prev.size(1))
        )
        assert_within_rounding(got, expected[path])  # of the probabilities, through the model
    for modules in recorder.modules.values():
        for module in modules:
            assert not module.skip_embed_dim_check and not module._forward_hooks and not module._forward_pre_hooks


# --- the measures, from the equations -------------------------------------------------------------


def test_entropy_and_jsd_of_known_distributions():
    everywhere = torch.tensor(True)
    p = torch.tensor([0.5, 0.25, 0.25])
    assert entropy(p, everywhere, "bits").item() == pytest.approx(1.5)
    assert entropy(p, everywhere, "nats").item() == pytest.approx(1.5 * math.log(2))
    one_hot = torch.tensor([0.0, 1.0, 0.0])
    assert entropy(one_hot, everywhere, "nats").item() == 0.0
    # JSD(P, Q) = H(M) - (H(P) + H(Q)) / 2, M = (P + Q) / 2, in bits
    q = torch.tensor([0.5, 0.5, 0.0])
    expected = -sum(m * math.log2(m) for m in (0.5, 0.375, 0.125)) - (1.5 + 1.0) / 2
    assert jensen_shannon(p, q, everywhere).item() == pytest.approx(expected, abs=1e-6)
    assert jensen_shannon(one_hot, torch.tensor([1.0, 0.0, 0.0]), everywhere).item() == pytest.approx(1.0, abs=1e-7)
    assert jensen_shannon(p, p, everywhere).item() == 0.0


def test_one_hot_attention_has_entropy_0_and_disjoint_layers_jsd_1():
    """Hand-made probabilities of two layers through the statistics the command uses: layer 1
    attends to each token's first visible key, layer 2 to its last one. Entropy 0 everywhere;
    JSD 1 wherever the two keys differ, 0 for tokens that see a single key."""
    src, _, prev = random_batch(make_dictionary(), [4, 2], [3, 5], seed=1)
    pad = make_dictionary().pad()
    for path, (queries, visible) in path_masks(src, prev, pad, pad).items():
        visible = visible.expand(len(src), queries.size(1), visible.size(-1))
        first = torch.nn.functional.one_hot(visible.int().argmax(-1), visible.size(-1)).float()
        last = torch.nn.functional.one_hot(
            visible.size(-1) - 1 - visible.int().flip(-1).argmax(-1), visible.size(-1)
        ).float()
        layers = [p.unsqueeze(0).expand(HEADS, *p.shape) for p in (first, last)]  # (H, B, T, S)
        stats = PathStatistics(2, HEADS, max_keys=16, unit="nats", sample_size=100, generator=torch.Generator())
        stats.start_batch(queries, visible)
        for layer, probabilities in enumerate(layers):
            stats.add_layer(layer, probabilities)
        stats.end_batch()
        single_key = (visible.sum(-1) == 1)[queries]
        assert stats.tokens == int(queries.sum())
        assert torch.equal(stats.entropy_sample, torch.zeros(2, stats.tokens, HEADS))
        assert sorted(stats.jsd_sample[0, :, 0].tolist()) == sorted((~single_key).float().tolist()), path
        assert stats.entropy.median().tolist() == [[0.0] * HEADS] * 2
        assert stats.jsd.median().tolist() == [[float(single_key.float().mean() < 0.5)] * HEADS]


def uniform_model(name):
    """All query projections zero: every score is 0, so every layer (with or without the carried
    sum, which stays 0) attends uniformly to the keys a token may see."""
    model = model_of(name)
    with torch.no_grad():
        for modules in attention_modules(model).values():
            for module in modules:
                module.q_proj.weight.zero_()
                module.q_proj.bias.zero_()
    return model


@pytest.mark.parametrize("unit", ["nats", "bits"])
@pytest.mark.parametrize("name", ["transformer", "realformer-all-mean"])
def test_uniform_attention_has_entropy_log_visible_keys_and_jsd_0(name, unit):
    """Padding never counts (left-padded sources, right-padded decoder inputs), nor do future
    positions of decoder self-attention: a source token of a sentence of n tokens sees n keys,
    decoder position t sees t + 1, a target token's cross-attention sees its source's n."""
    src_lengths, tgt_lengths = [5, 7, 3], [4, 6, 2]
    src, lengths, prev = random_batch(make_dictionary(), src_lengths, tgt_lengths, seed=2)
    stats = measure(uniform_model(name), [net_input(src, lengths, prev)], unit=unit, sample_size=1000)
    log = LOG[unit]
    expected = {
        "encoder": [log(n) for n in src_lengths for _ in range(n)],
        "decoder": [log(t + 1) for m in tgt_lengths for t in range(m)],
        "cross": [log(n) for n, m in zip(src_lengths, tgt_lengths) for _ in range(m)],
    }
    for path in PATHS:
        s = stats[path]
        assert s.tokens == len(expected[path]), path
        for layer in range(LAYERS):
            for head in range(HEADS):
                got = sorted(s.entropy_sample[layer, :, head].tolist())
                assert got == pytest.approx(sorted(expected[path]), abs=1e-5), (path, layer, head)
        assert s.entropy.median() == pytest.approx(
            np.full((LAYERS, HEADS), np.median(expected[path])), abs=RESOLUTION / 2
        )
        assert torch.equal(s.jsd_sample, torch.zeros(LAYERS - 1, s.tokens, HEADS)), path
        assert s.jsd.median().tolist() == [[0.0] * HEADS] * (LAYERS - 1)


@pytest.mark.parametrize("name", ["transformer", "realformer-all-mean"])
def test_a_sentence_alone_measures_as_inside_a_padded_batch(name):
    model = model_of(name)
    src, lengths, prev = random_batch(make_dictionary(), [6, 2, 9], [3, 8, 5], seed=4)
    pad = make_dictionary().pad()
    alone = []
    for i in range(3):  # each sentence unpadded, in a batch of its own
        s, p = src[i][src[i].ne(pad)], prev[i][prev[i].ne(pad)]
        alone.append(net_input(s[None], lengths[i : i + 1], p[None]))
    separately = measure(model, alone, sample_size=1000)
    together = measure(model, [net_input(src, lengths, prev)], sample_size=1000)
    for path in PATHS:
        for a, b in (
            (separately[path].entropy_sample, together[path].entropy_sample),
            (separately[path].jsd_sample, together[path].jsd_sample),
        ):
            # through the model, then entropy's or JSD's sum over at most 9 keys
            assert_within_rounding(a.sort(dim=1).values, b.sort(dim=1).values, LAYERS, 9)
        for a, b in ((separately[path].entropy, together[path].entropy), (separately[path].jsd, together[path].jsd)):
            # values float32's rounding apart may still fall into neighbouring bins
            torch.testing.assert_close(a.median(), b.median(), atol=RESOLUTION, rtol=0, msg=path)


def test_median_histogram_is_within_half_a_bin_of_the_exact_median():
    g = torch.Generator().manual_seed(0)
    values = torch.rand(3, 1001, 2, generator=g) * 4  # (layers, tokens, heads)
    histogram = MedianHistogram((3, 2), upper=4.0)
    histogram.add(values[:, :500])
    histogram.add(values[:, 500:])
    exact = values.median(dim=1).values.double()  # odd count: the middle value
    assert (histogram.median() - exact).abs().max() <= RESOLUTION / 2 + 1e-9
    pooled = np.median(values.permute(0, 2, 1).reshape(3, -1).numpy(), axis=1)  # even count: mean of two
    assert np.abs(histogram.median(pool_heads=True).numpy() - pooled).max() <= RESOLUTION / 2 + 1e-7


def test_token_sample_is_bounded_and_keeps_a_token_for_every_layer():
    sample = TokenSample(50, torch.Generator().manual_seed(0))
    for start in range(0, 400, 100):
        tokens = torch.arange(start, start + 100, dtype=torch.float32)
        layer_values = torch.stack([tokens, tokens + 1000]).unsqueeze(-1)  # (2 layers, tokens, 1 head)
        sample.add(layer_values, -layer_values)
    first, second = sample.values
    assert first.shape == (2, 50, 1) and len(set(first[0, :, 0].tolist())) == 50
    assert torch.equal(first[1], first[0] + 1000) and torch.equal(second, -first)
    assert first[0].max() >= 300  # the last batch was not ignored


# --- the command ----------------------------------------------------------------------------------

SENTENCES = 12
DPI = 50
LSTM_REFUSAL = "LSTMModel has no Transformer encoder and decoder layers to read attention from"


def write_data_bin(folder: Path, dictionary, seed=0):
    """Binarized src-tgt valid split of random sentences, as fairseq-preprocess writes it."""
    folder.mkdir()
    dictionary.save(str(folder / "dict.src.txt"))
    dictionary.save(str(folder / "dict.tgt.txt"))
    g = torch.Generator().manual_seed(seed)
    for lang in ("src", "tgt"):
        prefix = str(folder / f"valid.src-tgt.{lang}")
        builder = indexed_dataset.make_builder(prefix + ".bin", impl="mmap", vocab_size=len(dictionary))
        for _ in range(SENTENCES):
            words = torch.randint(
                dictionary.nspecial, len(dictionary), (int(torch.randint(2, 9, (1,), generator=g)),), generator=g
            )
            builder.add_item(torch.cat([words, torch.tensor([dictionary.eos()])]).int())
        builder.finalize(prefix + ".idx")
    return folder


def lstm_model():
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            "/no/data",
            "--arch",
            "lstm",
            "--encoder-embed-dim",
            "8",
            "--encoder-hidden-size",
            "8",
            "--decoder-embed-dim",
            "8",
            "--decoder-hidden-size",
            "8",
            "--decoder-out-embed-dim",
            "8",
        ],
    )

    class Task:
        source_dictionary = target_dictionary = make_dictionary()

    return ARCH_MODEL_REGISTRY["lstm"].build_model(args, Task()).eval(), args


def trainer_cfg(args) -> dict:
    """The configuration fairseq-train saves in a checkpoint, from its parsed arguments."""
    with warnings.catch_warnings():  # hydra's deprecation notes about fairseq's config files
        warnings.simplefilter("ignore", UserWarning)
        return OmegaConf.to_container(convert_namespace_to_omegaconf(args))


def resave(path: Path, cfg: dict, params=None) -> None:
    """Replace a checkpoint's configuration (and parameters); ours, so plain torch.load."""
    state = torch.load(path, weights_only=False)
    state["cfg"] = cfg
    if params is not None:
        state["model"] = params
    torch.save(state, path)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A data-bin and checkpoints of a stock transformer, a RealFormer and an LSTM, with the
    whole configuration fairseq-train saves."""
    root = tmp_path_factory.mktemp("analysis")
    data = write_data_bin(root / "bin", make_dictionary())
    checkpoints = {}
    for name, seed in (("transformer", 1), ("realformer-all-mean", 2)):
        arch, flags, *_ = MODELS[name]
        path = root / f"{arch}.pt"
        checkpoints[name] = save_checkpoint(path, seed=seed, arch=arch, flags=flags)
        resave(path, trainer_cfg(parse_args(arch, *flags)))
    lstm, lstm_args = lstm_model()
    save_checkpoint(root / "lstm.pt", seed=3, arch="transformer")
    resave(root / "lstm.pt", trainer_cfg(lstm_args), lstm.state_dict())
    return root, data, checkpoints


@pytest.fixture(scope="module")
def analysed(workspace):
    """One run of the command on both checkpoints, with several batches (padding) of the split."""
    root, data, _ = workspace
    out, report = root / "figures", root / "report.json"
    cli.main(
        [
            str(data),
            "--checkpoints",
            str(root / "transformer.pt"),
            str(root / "realformer.pt"),
            "--source-lang",
            "src",
            "--target-lang",
            "tgt",
            "--max-tokens",
            "40",
            "--cpu",
            "--out",
            str(out),
            "--json",
            str(report),
            "--dpi",
            str(DPI),
        ]
    )
    return out, json.loads(report.read_text())


def sentences_of(data: Path, lang: str):
    dataset = indexed_dataset.make_dataset(str(data / f"valid.src-tgt.{lang}"), impl="mmap")
    return [dataset[i].long() for i in range(len(dataset))]


def expected_medians(name, params, data, eos):
    """Medians over all tokens of the split, from the reference's probabilities of each sentence
    alone, with scipy's entropy and Jensen-Shannon distance (squared: divergence, base 2)."""
    model = build_model(MODELS[name][0], *MODELS[name][1])
    model.load_state_dict(params)
    per_token = {path: ([], []) for path in PATHS}  # entropies, JSDs: lists of (layers, heads)
    for src, tgt in zip(sentences_of(data, "src"), sentences_of(data, "tgt")):
        prev = torch.cat([tgt[-1:].new_tensor([eos]), tgt[:-1]])  # EOS first, as fairseq's collater
        with torch.no_grad():
            probabilities = reference_probabilities(model, name, src[None], prev[None])
        for path in PATHS:
            p = probabilities[path][:, 0].double().numpy()  # (layers, heads, T, S)
            for t in range(p.shape[2]):
                visible = slice(0, t + 1) if path == "decoder" else slice(None)
                rows = p[:, :, t, visible]
                per_token[path][0].append([[scipy_entropy(h) for h in layer] for layer in rows])
                per_token[path][1].append(
                    [
                        [jensenshannon(u, v, base=2) ** 2 for u, v in zip(upper, lower)]
                        for lower, upper in zip(rows, rows[1:])
                    ]
                )
    return {
        path: (np.median(np.array(e), axis=0), np.median(np.array(j), axis=0)) for path, (e, j) in per_token.items()
    }


@pytest.mark.parametrize("index,name", [(0, "transformer"), (1, "realformer-all-mean")])
def test_json_medians_equal_an_independent_computation(workspace, analysed, index, name):
    """A stock fairseq transformer checkpoint and a RealFormer one, batched with padding by the
    command; expected: scipy on the reference's probabilities of each sentence alone."""
    root, data, checkpoints = workspace
    _, report = analysed
    assert report["entropy_unit"] == "nats" and len(report["models"]) == 2
    model = report["models"][index]
    assert set(model) == {"checkpoint", "sentences", *PATHS}
    assert model["checkpoint"] == str(root / f"{MODELS[name][0]}.pt") and model["sentences"] == SENTENCES
    expected = expected_medians(name, checkpoints[name], data, make_dictionary().eos())
    for path in PATHS:
        assert set(model[path]) == {"entropy_median", "jsd_median"}
        entropy_median, jsd_median = np.array(model[path]["entropy_median"]), np.array(model[path]["jsd_median"])
        assert entropy_median.shape == (LAYERS, HEADS) and jsd_median.shape == (LAYERS - 1, HEADS)
        np.testing.assert_allclose(entropy_median, expected[path][0], atol=MEDIAN_TOLERANCE, rtol=0, err_msg=path)
        np.testing.assert_allclose(jsd_median, expected[path][1], atol=MEDIAN_TOLERANCE, rtol=0, err_msg=path)


def test_figures_are_written_as_images_of_the_expected_size(analysed):
    """Violin grids: max(6, 1.6 + 0.6·heads) in wide, 1.5 + 1.1·rows in high; rows = 3 layers
    (entropy) or 2 adjacent pairs (JSD), 2 heads: 6 x 4.8 in and 6 x 3.7 in; the comparison
    11 x 6 in. At --dpi 50."""
    out, _ = analysed
    expected = {"entropy": (240, 300), "jsd": (185, 300)}
    for model in ("transformer", "realformer"):
        for path in PATHS:
            for measure_name, size in expected.items():
                stem = out / f"{model}.{path}.{measure_name}"
                assert imread(f"{stem}.png").shape[:2] == size, stem
                assert Path(f"{stem}.pdf").read_bytes().startswith(b"%PDF")
    assert imread(out / "comparison.png").shape[:2] == (300, 550)
    assert len(list(out.iterdir())) == 2 * 2 * 3 * 2 + 2


def error_of(capsys, *argv):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([str(a) for a in argv])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_bad_input_is_one_line_naming_it(workspace, capsys, tmp_path):
    root, data, _ = workspace
    out = tmp_path / "figures"
    langs = ("--source-lang", "src", "--target-lang", "tgt", "--out", out, "--json", tmp_path / "report" / "m.json")
    lstm = root / "lstm.pt"
    line = error_of(capsys, data, "--checkpoints", lstm, *langs)
    assert line == f"realformer-analyze: error: checkpoint {lstm}: {LSTM_REFUSAL}"
    line = error_of(capsys, data, "--checkpoints", root / "transformer.pt", "--gen-subset", "test", *langs)
    assert line == f"realformer-analyze: error: {data} has no split 'test' for src-tgt (--gen-subset)"
    other = write_data_bin(tmp_path / "bin30", make_dictionary(30))
    line = error_of(capsys, other, "--checkpoints", root / "realformer.pt", *langs)
    assert line == (
        f"realformer-analyze: error: checkpoint {root / 'realformer.pt'} does not match {other}: its source "
        f"vocabulary has 24 symbols, dict.src.txt has 34 (was it trained on this data?)"
    )
    line = error_of(capsys, data, "--checkpoints", root / "nope.pt", *langs)
    assert line == f"realformer-analyze: error: --checkpoints {root / 'nope.pt'}: no such file"
    line = error_of(
        capsys, data, "--checkpoints", root / "transformer.pt", "--entropy-thresholds", "4.5", "1.5", *langs
    )
    assert line == "realformer-analyze: error: --entropy-thresholds 4.5 1.5: LOW must be smaller than HIGH"
    line = error_of(capsys, data, "--checkpoints", root / "transformer.pt", "--labels", "a", "b", *langs)
    assert line == "realformer-analyze: error: --labels gives 2 names, --checkpoints 1 files: one name each"
    (tmp_path / "notes.pt").write_text("not a checkpoint")
    line = error_of(capsys, data, "--checkpoints", tmp_path / "notes.pt", *langs)
    assert line.startswith(f"realformer-analyze: error: {tmp_path / 'notes.pt'} is not a readable torch checkpoint")
    assert not out.exists() and not (tmp_path / "report").exists()  # made before the analysis, taken back


@pytest.mark.parametrize("command", [["realformer-analyze"], ["python", "-m", "fairseq_realformer.analysis"]])
def test_command_line_error_has_no_traceback(workspace, command):
    root, data, _ = workspace
    executable = [str(BIN / command[0])] + command[1:]
    result = subprocess.run(
        [
            *executable,
            str(data),
            "--checkpoints",
            str(root / "lstm.pt"),
            "--source-lang",
            "src",
            "--target-lang",
            "tgt",
            "--out",
            str(root / "unused"),
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"realformer-analyze: error: checkpoint {root / 'lstm.pt'}: {LSTM_REFUSAL}"
    ]
    assert not (root / "unused").exists()
