"""studies/source_use.py: its NLLs equal each sentence scored alone with its own source and with its
neighbour's, a model cut off from its source scores both alike, its token spread is the definition's
on every encoder layer, and bad paths get one line."""

import json
import math
import shutil

import pytest
import torch

from studies import source_use as use

from .cli import REPO, STUDIES, cli_error
from .test_compat import FIXTURES

CHECKPOINT = FIXTURES / "ckpt-pre-ln" / "checkpoint_last.pt"  # 200 updates of the toy pair, 2+2 layers
DATA = FIXTURES / "bin"


@pytest.fixture()
def loaded():
    use.import_plugin()
    model, task, criterion, _, cfg = use.load(CHECKPOINT, DATA, "valid")
    return model.eval(), task, criterion, cfg


def the_batch(task):
    """The fixture's validation set: one batch of 40 sentences, in the order source_use.py scores it."""
    (sample,) = list(
        task.get_batch_iterator(dataset=task.dataset("valid"), max_tokens=4096).next_epoch_itr(shuffle=False)
    )
    return sample


def nll_alone(model, task, source, target) -> tuple[float, int]:
    """-log p(target | source) in nats, the sentence scored alone (no padding), and its token count."""
    eos = task.target_dictionary.eos()
    previous = torch.cat([target.new_tensor([eos]), target[:-1]])  # fairseq's teacher forcing
    logits, _ = model(source[None], torch.tensor([len(source)]), previous[None])
    return -float(torch.log_softmax(logits[0].double(), -1).gather(-1, target[:, None]).sum()), len(target)


def test_nll_is_each_sentence_alone_with_its_own_source_and_its_neighbours(loaded):
    model, task, criterion, _ = loaded
    sample = the_batch(task)
    pad = task.source_dictionary.pad()
    sources = [row[row.ne(pad)] for row in sample["net_input"]["src_tokens"]]  # left-padded
    targets = [row[row.ne(pad)] for row in sample["target"]]
    with torch.no_grad():
        own = [nll_alone(model, task, s, t) for s, t in zip(sources, targets)]
        impostor = [nll_alone(model, task, sources[(i + 1) % len(sources)], t) for i, t in enumerate(targets)]
        measured = use.measure(model, task, criterion, "valid", 4096)
    tokens = sum(n for _, n in own)
    assert (measured["sentences"], measured["target_tokens"]) == (40, tokens)
    assert measured["nll_own"] == pytest.approx(sum(v for v, _ in own) / tokens / math.log(2), abs=1e-5)
    assert measured["nll_impostor"] == pytest.approx(sum(v for v, _ in impostor) / tokens / math.log(2), abs=1e-5)
    assert measured["nll_impostor"] > measured["nll_own"] + 1  # the toy pair is word for word: it reads its source


def test_a_model_cut_off_from_its_source_scores_both_alike(loaded):
    model, task, criterion, _ = loaded
    with torch.no_grad():
        for layer in model.decoder.layers:  # cross-attention adds nothing to the decoder's stream
            layer.encoder_attn.out_proj.weight.zero_()
            layer.encoder_attn.out_proj.bias.zero_()
        measured = use.measure(model, task, criterion, "valid", 4096)
    assert measured["nll_impostor"] == pytest.approx(measured["nll_own"], abs=1e-6)


def spread_by_definition(vectors):
    return float(((vectors - vectors.mean(0)) ** 2).sum(1).mean() / (vectors**2).sum(1).mean())


def test_spread_is_the_definitions_after_every_encoder_layer(loaded):
    model, task, criterion, _ = loaded
    sample = the_batch(task)
    source = sample["net_input"]["src_tokens"]
    real = (source.ne(task.source_dictionary.pad()) & source.ne(task.source_dictionary.eos())).t()
    outputs = []
    hooks = [layer.register_forward_hook(lambda _, __, out: outputs.append(out[0])) for layer in model.encoder.layers]
    with torch.no_grad():
        embedded = model.encoder.forward_embedding(source)[0].transpose(0, 1)
        final = model.encoder(source, sample["net_input"]["src_lengths"])["encoder_out"][0]
        for hook in hooks:
            hook.remove()
        expected = [spread_by_definition(x[real].double()) for x in (embedded, *outputs, final)]
        measured = use.measure(model, task, criterion, "valid", 4096)["spread"]
        assert measured == pytest.approx(expected, abs=1e-9)
        assert len(measured) == 4  # embedding, 2 layers, the Pre-LN stack's final LayerNorm
        model.encoder.layer_norm.weight.zero_()  # every token leaves as the LayerNorm's bias
        collapsed = use.measure(model, task, criterion, "valid", 4096)["spread"]
    assert collapsed[:-1] == measured[:-1] and collapsed[-1] == pytest.approx(0, abs=1e-12)


def test_fresh_model_is_built_from_the_checkpoints_seed(loaded):
    model, task, _, cfg = loaded
    first, again = use.fresh_model(task, cfg), use.fresh_model(task, cfg)
    assert cfg.common.seed == 1
    for (name, weight), (_, same) in zip(first.named_parameters(), again.named_parameters()):
        assert torch.equal(weight, same), name
    assert not all(torch.equal(w, t) for w, t in zip(first.parameters(), model.parameters()))


def test_a_run_folder_reads_its_average_the_json_holds_the_printed_rows_and_a_figure_is_drawn(tmp_path, capsys):
    run = tmp_path / "admin-lr0.002" / "seed1"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(CHECKPOINT, run / "checkpoints" / "checkpoint_avg.pt")
    (run / "bin").symlink_to(DATA)
    figure = tmp_path / "figures" / "source_use.png"
    rows = use.main([str(run), "--fresh", "--json", str(tmp_path / "out" / "source_use.json"), "--figure", str(figure)])
    printed = capsys.readouterr().out
    record = json.loads((tmp_path / "out" / "source_use.json").read_text())
    assert [r["model"] for r in record["rows"]] == [
        str(run / "checkpoints" / "checkpoint_avg.pt"),
        f"{run / 'checkpoints' / 'checkpoint_avg.pt'} freshly initialised (seed 1)",
    ]
    assert [r["updates"] for r in record["rows"]] == [200, 0]
    assert [r["data"] for r in record["rows"]] == [str(DATA.resolve().relative_to(REPO))] * 2
    assert figure.stat().st_size > 10_000
    assert use.short_name(rows[1]["model"]) == "admin-lr0.002/seed1, untrained"
    assert record["command"].startswith("python studies/source_use.py ") and record["machine"] and record["date"]
    for row, kept in zip(rows, record["rows"]):
        assert kept["nll_own"] == round(row["nll_own"], 4)
        assert f"| {row['nll_own']:.3f} | {row['nll_impostor']:.3f} |" in printed
    assert "| layer 2 | " in printed and "| output | " in printed


@pytest.mark.parametrize(
    "argv, names",
    [
        (["missing-run"], "missing-run: no such run folder or checkpoint"),
        ([CHECKPOINT], "a checkpoint file needs --data"),
        ([CHECKPOINT, "--data", "missing-bin"], "missing-bin: no such data folder (--data)"),
        ([STUDIES], "no checkpoints/checkpoint_avg.pt in it"),
    ],
)
def test_bad_input_gets_one_line(capsys, argv, names):
    assert names in cli_error(capsys, use.main, *argv)
