"""bfloat16 mixed precision (``--bf16`` without torch_xla; ``fairseq_realformer/optim/precision.py``): the
models under the autocast compute what they compute in float32, to bfloat16's rounding; residual
attention carries its sums in float32; fairseq-train, fairseq-generate, fairseq-interactive and the
hub run it on a CPU, keep float32 checkpoints, resume exactly, and refuse what cannot be in one line."""

import contextlib
import json
import re
import signal
import warnings
from pathlib import Path

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator
from fairseq.trainer import Trainer

from fairseq_realformer.errors import RealformerConfigError
from fairseq_realformer.modules import ResidualMultiheadAttention, residual_attention
from fairseq_realformer.modules.residual_attention import Carried
from fairseq_realformer.optim import precision

from . import cpu_report
from .cli import N_TEST, TINY, TRAIN, popen, preprocess, run
from .helpers import BACKBONES, REPO, USER_DIR, VALUE_RESIDUAL, perturb_, random_batch, realformer
from .interchange import LOSS_DIGIT, assert_same_as_printed
from .test_half_precision import training_config
from .test_model import DICT, SRC_LENS, TGT_LENS, forward


def relative_error(got, want) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


# bfloat16 keeps 8 bits of mantissa (relative rounding 2^-9 per product); through three layers
# of these perturbed tiny models the outputs differ from float32's by 0.3-2.6 % (measured), a
# computation that differs from float32's (a lost carry, a mask not applied) by tens of percent.
BF16_RELATIVE_TOLERANCE = 0.05

CASES = [
    (paths, mode, backbone, "no-vr") for backbone in BACKBONES for paths, mode in (("all", "mean"), ("none", "sum"))
]
CASES += [
    ("all", "sum", "admin", "no-vr"),
    ("encoder,cross", "mean", "post-ln", "no-vr"),
    ("decoder", "sum", "pre-ln", "no-vr"),
]
CASES += [
    (paths, "mean", backbone, vr)
    for vr in ("vr-half", "vr-learned")
    for paths, backbone in (("all", "admin"), ("none", "post-ln"), ("all", "resi-dual"))
]


@pytest.mark.parametrize("paths, mode, backbone, value_residual", CASES)
def test_bf16_outputs_match_float32(paths, mode, backbone, value_residual):
    model = perturb_(realformer(paths, mode, backbone, *VALUE_RESIDUAL[value_residual], dictionary=DICT))
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    with torch.no_grad():
        want_enc, want, _ = forward(model, src, src_len, prev)
        with precision.autocast("cpu"):
            got_enc, got, _ = forward(model, src, src_len, prev)
    assert got.dtype == torch.bfloat16, "the output projection ran in bfloat16"
    assert 0 < relative_error(got, want) < BF16_RELATIVE_TOLERANCE
    assert relative_error(got_enc, want_enc) < BF16_RELATIVE_TOLERANCE
    assert all(p.dtype == torch.float32 for p in model.parameters()), "the weights stay float32"


@pytest.mark.parametrize(
    "paths, mode, backbone, value_residual",
    [
        ("all", "mean", "admin", "no-vr"),
        ("all", "sum", "post-ln", "vr-learned"),
        ("none", "sum", "pre-ln", "no-vr"),
        ("decoder,cross", "mean", "resi-dual", "vr-half"),
        ("all", "sum", "deepnorm", "no-vr"),
    ],
)
def test_incremental_decoding_equals_full_forward_under_bf16(paths, mode, backbone, value_residual):
    model = perturb_(realformer(paths, mode, backbone, *VALUE_RESIDUAL[value_residual], dictionary=DICT))
    src, src_len, prev = random_batch(DICT, SRC_LENS, [7, 7, 7])
    with torch.no_grad(), precision.autocast("cpu"):
        encoder_out = model.encoder(src, src_lengths=src_len)
        full, _ = model.decoder(prev, encoder_out=encoder_out)
        state = {}
        for t in range(prev.size(1)):
            step, _ = model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
            # the same bfloat16 computation on other shapes: other GEMM blockings, same rounding
            assert relative_error(step[:, 0], full[:, t]) < BF16_RELATIVE_TOLERANCE / 2
            assert step[:, 0].argmax(-1).tolist() == full[:, t].argmax(-1).tolist()


def test_carried_scores_and_first_values_are_float32_under_bf16():
    model = perturb_(realformer("all", "sum", "admin", *VALUE_RESIDUAL["vr-half"], dictionary=DICT))
    carried = []
    for module in model.modules():
        if isinstance(module, ResidualMultiheadAttention):
            module.register_forward_hook(lambda _m, _i, output: carried.append(output[2]))
    with torch.no_grad(), precision.autocast("cpu"):
        forward(model, *random_batch(DICT, SRC_LENS, TGT_LENS))
    assert len(carried) == 9  # 3 encoder self, 3 decoder self, 3 cross
    assert {c.scores.dtype for c in carried} == {c.values.dtype for c in carried} == {torch.float32}


def _chain_of_attention(layers, seed, carry_in_float32: bool, monkeypatch):
    """S_n of *layers* self-attention layers in sum mode, in float32 and under the bf16 autocast
    (S_n carried in float32, or in bfloat16 as the products come out). Scores grow like a
    trained model's (|S_18| ~ 15): query and key weights x3."""
    embed, heads, length, batch = 64, 4, 20, 8
    torch.manual_seed(seed)
    modules = [ResidualMultiheadAttention(embed, heads, self_attention=True).eval() for _ in range(layers)]
    with torch.no_grad():
        for m in modules:
            m.q_proj.weight.mul_(3.0), m.k_proj.weight.mul_(3.0)
    inputs = [torch.randn(length, batch, embed) for _ in range(layers)]

    def run_chain(bf16):
        carried = Carried()
        with torch.no_grad(), precision.autocast("cpu") if bf16 else torch.autocast("cpu", enabled=False):
            for depth, (module, x) in enumerate(zip(modules, inputs), start=1):
                _, _, carried = module(x, x, x, carried=carried, depth=depth)
        return carried.scores.float()

    want = run_chain(bf16=False)
    monkeypatch.setattr(residual_attention, "HALF", residual_attention.HALF if carry_in_float32 else (torch.float16,))
    return (run_chain(bf16=True) - want).abs().max().item()


def test_18_layers_in_sum_mode_carry_their_scores_in_float32(monkeypatch):
    """The decision for bf16: the running sum S_18 carried in float32 is 2-3x closer to
    float32's than one carried in bfloat16 (measured 0.33-0.37 against 0.75-0.96, |S_18| ~ 15),
    at the cost of float32 score tensors, which the softmax reads in float32 anyway."""
    in_float32 = [_chain_of_attention(18, seed, True, monkeypatch) for seed in range(3)]
    in_bfloat16 = [_chain_of_attention(18, seed, False, monkeypatch) for seed in range(3)]
    assert sum(in_float32) < 0.6 * sum(in_bfloat16), (in_float32, in_bfloat16)


# --- decoding under bf16: what the speed-ups for a CPU (benchmarks/RESULTS.md) may not change -------


def test_the_decoding_cache_holds_contiguous_keys_and_values():
    """Every attention's cache, the encoder's keys and values included (projected once, as a
    transposed view), is contiguous after the first step: what a bfloat16 ``bmm`` on a CPU reads
    without a copy at every later step."""
    model = perturb_(realformer("all", "mean", "admin", dictionary=DICT)).eval()
    src, src_len, prev = random_batch(DICT, SRC_LENS, TGT_LENS)
    state = {}
    with torch.no_grad(), precision.autocast("cpu"):
        model.decoder(prev[:, :1], encoder_out=model.encoder(src, src_lengths=src_len), incremental_state=state)
    caches = [buffer for buffer in state.values() if "prev_key" in buffer]
    assert len(caches) == 2 * len(model.decoder.layers)  # self- and cross-attention of every layer
    assert all(c["prev_key"].is_contiguous() and c["prev_value"].is_contiguous() for c in caches)


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
@pytest.mark.parametrize("paths", ["all", "decoder"])
def test_beam_search_finds_what_it_found_with_the_cache_as_projected(paths, bf16, monkeypatch):
    """The contiguous cache changes no number: beam 4 through fairseq's generator finds the same
    hypotheses with the same scores and alignments, bit for bit, as with the encoder's keys and
    values cached as the projection gives them (the reference: ``_cacheable`` undone)."""
    model = perturb_(realformer(paths, "mean", "admin", dictionary=DICT), scale=0.5).eval()
    src, src_len, _ = random_batch(DICT, SRC_LENS, TGT_LENS)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src_len}}

    def search():
        generator = SequenceGenerator([model], DICT, beam_size=4, max_len_a=0, max_len_b=8)
        with precision.autocast("cpu") if bf16 else contextlib.nullcontext():
            return generator.forward(sample)

    found = search()
    monkeypatch.setattr(residual_attention, "_cacheable", lambda t: t)
    reference = search()
    for got_sentence, want_sentence in zip(found, reference, strict=True):
        for got, want in zip(got_sentence, want_sentence, strict=True):
            for key in ("tokens", "score", "positional_scores", "attention"):
                assert torch.equal(got[key], want[key]), key


def test_decodings_attention_softmax_is_the_training_ones_bit_for_bit():
    """Without gradients the attention's softmax skips its autograd Function (nothing to save):
    the same bfloat16 probabilities; with gradients it is that Function."""
    logits = torch.randn(12, 5, 9) * 4
    with torch.no_grad():
        decoding = residual_attention._softmax(logits, torch.bfloat16)
    training = residual_attention._softmax(logits.requires_grad_(), torch.bfloat16)
    assert type(training.grad_fn).__name__ == "_SoftmaxSavedInHalfBackward"
    assert decoding.dtype == torch.bfloat16 and torch.equal(decoding, training.detach())


# --- what bf16 replaces on a CPU: fairseq's dropout masks and the vocabulary's log_softmax -------


def test_fast_dropout_keeps_with_probability_1_minus_p_and_scales_like_fairseqs():
    torch.manual_seed(0)
    x = torch.ones(400, 500, dtype=torch.bfloat16, requires_grad=True)
    y = precision.dropout(x, 0.3)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.7) < 0.005  # 200,000 draws: 4 standard deviations
    assert torch.equal(y[kept], torch.full_like(y[kept], 1 / 0.7))  # the inverted-dropout scale, in bfloat16
    y.backward(torch.full_like(y, 2.0))
    assert torch.equal(
        x.grad, torch.where(kept, torch.tensor(2 / 0.7, dtype=torch.bfloat16), torch.tensor(0.0, dtype=torch.bfloat16))
    )


def test_fairseq_dropout_draws_fast_masks_only_under_bf16_on_a_cpu():
    """float32 runs draw exactly F.dropout's masks, as before the plugin; bf16 runs the fast ones."""
    from fairseq.modules.fairseq_dropout import FairseqDropout

    module = FairseqDropout(0.3).train()
    x = torch.randn(50, 60)
    for bf16, want in (
        (False, lambda: torch.nn.functional.dropout(x, 0.3, True)),
        (True, lambda: precision.dropout(x, 0.3)),
    ):
        with precision.autocast("cpu") if bf16 else torch.autocast("cpu", enabled=False):
            torch.manual_seed(1)
            got = module(x)
            torch.manual_seed(1)
            assert torch.equal(got, want())
    assert torch.equal(module.eval()(x), x)


def test_the_vocabulary_log_softmax_from_bf16_is_fairseqs_bit_for_bit():
    """Forward, label-smoothed loss and the bfloat16 gradient, without the float32 copies."""
    from fairseq import utils
    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

    from fairseq_realformer.patches.patching import MARKER

    assert getattr(utils.log_softmax, MARKER, False), "fairseq's decoders call the plugin's log_softmax"
    torch.manual_seed(0)
    logits = torch.randn(7, 150, 301, dtype=torch.bfloat16)  # more rows than one block of 512
    target = torch.randint(4, 301, (7 * 150, 1))
    results = []
    for log_softmax in (utils.log_softmax, lambda x, dim: torch.nn.functional.log_softmax(x, dim, dtype=torch.float32)):
        x = logits.clone().requires_grad_()
        lprobs = log_softmax(x, dim=-1)
        loss, _ = label_smoothed_nll_loss(lprobs.view(-1, 301), target, 0.1, ignore_index=1)
        loss.backward()
        results.append((lprobs.detach(), loss.detach(), x.grad))
    (lprobs, loss, grad), (want_lprobs, want_loss, want_grad) = results
    assert lprobs.dtype == torch.float32 and grad.dtype == torch.bfloat16
    assert torch.equal(lprobs, want_lprobs) and torch.equal(loss, want_loss) and torch.equal(grad, want_grad)


def test_fairseqs_transformer_still_scripts_with_torchscript():
    """fairseq scripts its models (its export, its own tests): the plugin's replacements of its
    dropout and log_softmax compile, and the scripted model computes the eager one's outputs."""
    from .helpers import build_model, make_dictionary

    dictionary = make_dictionary()
    model = build_model("transformer", dictionary=dictionary)
    scripted = torch.jit.script(model)
    src, src_len, prev = random_batch(dictionary, SRC_LENS, TGT_LENS)
    with torch.no_grad():
        want = model.get_normalized_probs(model(src, src_len, prev), log_probs=True)
        got = scripted.get_normalized_probs(scripted(src, src_len, prev), log_probs=True)
    torch.testing.assert_close(got, want)


# --- precision flags ---------------------------------------------------------------------------


REFUSED = {
    ("--memory-efficient-bf16",): "--memory-efficient-bf16 keeps the weights themselves in bfloat16, which only "
    "fairseq's TPU run (torch_xla) does: use --bf16 (bfloat16 mixed precision, float32 weights)",
    ("--bf16", "--amp"): "--bf16 and --amp exclude each other: choose one precision",
}


@pytest.mark.parametrize("flags", REFUSED, ids=" ".join)
def test_impossible_bf16_combinations_are_refused_before_training(flags):
    with pytest.raises(RealformerConfigError) as error:
        Trainer(training_config(*flags), task=None, model=None, criterion=None)
    assert str(error.value) == REFUSED[flags]


@pytest.mark.parametrize("program", ["fairseq-train", "fairseq-generate"])
def test_bf16_with_fp16_is_one_line(program, tmp_path):
    """fairseq's parser refuses --fp16 with --tpu, which --bf16 turned on: said as the user typed it."""
    from .test_compat import FIXTURES

    flags = (
        [*TRAIN, "--save-dir", tmp_path]
        if program == "fairseq-train"
        else ["--user-dir", USER_DIR, "--path", FIXTURES / "ckpt-pre-ln" / "checkpoint_last.pt"]
    )
    result = run(program, FIXTURES / "bin", *flags, "--bf16", "--fp16", check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line == f"{program}: error: --bf16 and --fp16 exclude each other: choose one precision"
    if program == "fairseq-train":
        assert line in (Path(REPO) / "docs" / "usage.md").read_text()  # shown there as printed


def emulated(program: str) -> str:
    """The line a command prints where --bf16 runs on a CPU without bfloat16 units."""
    return (
        f"{program}: warning: --bf16 on a CPU without bfloat16 units (no AVX512-BF16 or AMX, as PyTorch reports): "
        "it runs, but slower than float32"
    )


@pytest.mark.parametrize(
    "avx512_bf16, amx", [(False, False), (True, False), (False, True)], ids=["no-units", "avx512-bf16", "amx"]
)
def test_only_a_cpu_without_bf16_units_gets_a_warning(avx512_bf16, amx, monkeypatch, capsys):
    """Whatever this machine has: PyTorch's report is forced either way."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    assert precision.native_on_cpu() == (avx512_bf16 or amx)
    precision.warn_if_emulated("cpu", "fairseq-train")
    precision.warn_if_emulated("cuda", "fairseq-train")  # a GPU: nothing to say
    warned = not (avx512_bf16 or amx)
    assert capsys.readouterr().err.splitlines() == ([emulated("fairseq-train")] if warned else [])


HUB_EMULATED = (
    "bf16=True on a CPU without bfloat16 units (no AVX512-BF16 or AMX, as PyTorch reports): "
    "it translates, but slower than float32"
)


# --- fairseq's commands ------------------------------------------------------------------------

BF16_TRAIN = [*TRAIN, "--bf16", "--max-update", "30", "--log-interval", "1"]


def per_update_losses(log: str):
    """{num_updates: the loss fairseq logged for that update} from ``--log-interval 1`` json lines."""
    entries = [
        json.loads(line.split("| train_inner | ", 1)[1]) for line in log.splitlines() if "| train_inner | " in line
    ]
    return {int(e["num_updates"]): e["loss"] for e in entries}


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("bf16")
    preprocess(work)
    result = run("fairseq-train", "bin", *BF16_TRAIN, "--save-dir", "ckpt", cwd=work)
    return work, result.stdout + result.stderr


def test_fairseq_train_bf16_trains_on_a_cpu(bf16_run):
    _, log = bf16_run
    losses = per_update_losses(log)
    assert sorted(losses) == list(range(1, 31)), log[-2000:]
    assert float(losses[30]) < float(losses[1]) - 1.0
    # one warning where PyTorch reports no bf16 units, none where it reports them (either forced:
    # tests/cpu_report, and test_fairseqs_transformer_trains_in_bf16_with_and_without_bf16_units)
    assert log.count(emulated("fairseq-train")) == (0 if precision.native_on_cpu() else 1), log[-2000:]


def test_a_bf16_checkpoint_is_float32_and_translates_without_bf16(bf16_run):
    work, _ = bf16_run
    state = torch.load(work / "ckpt" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert {t.dtype for t in state["model"].values() if t.is_floating_point()} == {torch.float32}
    exp_avg = [s["exp_avg"] for s in state["last_optimizer_state"]["state"].values()]
    assert exp_avg and {t.dtype for t in exp_avg} == {torch.float32}, "Adam's state is float32"
    assert "loss_scale" not in state["extra_state"].get("train_meters", {}), "no loss scaler"
    generate = ["fairseq-generate", "bin", "--user-dir", USER_DIR, "--path", "ckpt/checkpoint_last.pt"]
    # as on a CPU with bf16 units, whatever this one has: no warning (interactive's test: without them)
    fp32, bf16 = (
        run(*generate, *"--beam 4 --batch-size 8".split(), *flags, cwd=work, env=cpu_report.environment("native"))
        for flags in ([], ["--bf16"])
    )
    assert "warning: --bf16" not in fp32.stderr + bf16.stderr
    hypotheses = [dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", r.stdout, re.M)) for r in (fp32, bf16)]
    assert sorted(map(int, hypotheses[0])) == sorted(map(int, hypotheses[1])) == list(range(N_TEST))
    scores = [[float(s) for s in re.findall(r"^H-\d+\t(\S+)\t", r.stdout, re.M)] for r in (fp32, bf16)]
    assert scores[0] != scores[1], "--bf16 translated in bfloat16"
    same = sum(hypotheses[0][i] == hypotheses[1][i] for i in hypotheses[0])
    assert same >= 0.8 * N_TEST, f"only {same} of {N_TEST} translations agree"


def test_interactive_and_the_hub_translate_in_bf16(bf16_run, monkeypatch):
    work, _ = bf16_run
    result = run(
        "fairseq-interactive",
        "bin",
        "--user-dir",
        USER_DIR,
        "--path",
        "ckpt/checkpoint_last.pt",
        "--beam",
        "4",
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--bf16",
        cwd=work,
        stdin="s1 s2 s3\ns4 s5\n",
        env=cpu_report.environment("none"),  # as on a CPU without bf16 units: it says so once, and translates
    )
    assert len(re.findall(r"^H-\d+\t", result.stdout, re.M)) == 2, result.stderr[-2000:]
    assert result.stderr.count(emulated("fairseq-interactive")) == 1, result.stderr[-2000:]

    from fairseq_realformer.models.realformer import RealformerModel

    hubs = [
        RealformerModel.from_pretrained(
            str(work / "ckpt"), checkpoint_file="checkpoint_last.pt", data_name_or_path=str(work / "bin"), **kwargs
        ).eval()
        for kwargs in ({}, {"bf16": True})
    ]
    sentence = "s1 s2 s3 s4"
    fp32, bf16 = (hub.generate(hub.encode(sentence), beam=4)[0] for hub in hubs)
    assert not torch.equal(fp32["positional_scores"], bf16["positional_scores"]), "bf16=True translated in bfloat16"
    torch.testing.assert_close(bf16["positional_scores"], fp32["positional_scores"], rtol=0, atol=0.1)
    assert {p.dtype for p in hubs[1].parameters()} == {torch.float32}

    # the hub says it too, as a Python warning, where the CPU has no bf16 units (either forced)
    for units in (False, True):
        with monkeypatch.context() as forced, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            forced.setattr(precision, "native_on_cpu", lambda: units)
            hubs[1].translate(sentence, beam=4)
            hubs[0].translate(sentence, beam=4)  # float32: nothing to say
        said = [
            str(w.message) for w in caught if issubclass(w.category, RuntimeWarning) and "bf16=True" in str(w.message)
        ]
        assert said == ([] if units else [HUB_EMULATED]), said


def test_ctrl_c_and_resume_reproduce_an_uninterrupted_bf16_run(bf16_run, tmp_path):
    """Ctrl-C loses nothing: the epoch checkpoints written before it are the uninterrupted run's, bit
    for bit (weights, Adam's state), and the resumed run trains on from the last of them to the end
    as if it had never stopped: the same loss at every update and the same final weights, bit for
    bit (fairseq alone resumes on other batches: patches.fixes.same_batches_after_resuming)."""
    work, uninterrupted = bf16_run
    (tmp_path / "bin").symlink_to(work / "bin")
    first = popen("fairseq-train", "bin", *BF16_TRAIN, "--save-dir", "ckpt", cwd=tmp_path)
    interrupted_log = []
    for line in first.stdout:  # Ctrl-C once update 12 is logged: after two epochs (5 updates each)
        interrupted_log.append(line)
        if "| train_inner | " in line and int(json.loads(line.split("| train_inner | ", 1)[1])["num_updates"]) >= 12:
            first.send_signal(signal.SIGINT)
            break
    interrupted_log += first.stdout.readlines()
    first.wait()
    assert max(per_update_losses("".join(interrupted_log))) < 30, "Ctrl-C stopped the run before its end"
    saved = sorted(p.name for p in (tmp_path / "ckpt").glob("checkpoint[0-9]*.pt"))
    assert saved, "an epoch checkpoint was written before Ctrl-C"
    for name in saved:
        got, want = (
            torch.load(folder / name, map_location="cpu", weights_only=False)
            for folder in (tmp_path / "ckpt", work / "ckpt")
        )
        assert all(torch.equal(got["model"][k], want["model"][k]) for k in want["model"]), name
        moments = [
            [t for s in c["last_optimizer_state"]["state"].values() for t in s.values() if torch.is_tensor(t)]
            for c in (got, want)
        ]
        assert all(torch.equal(a, b) for a, b in zip(*moments)), name

    resumed = run("fairseq-train", "bin", *BF16_TRAIN, "--save-dir", "ckpt", cwd=tmp_path)
    log = resumed.stdout + resumed.stderr
    start = int(re.search(r"Loaded checkpoint \S+ \(epoch \d+ @ (\d+) updates\)", log).group(1))
    assert start >= 5
    want, got = per_update_losses(uninterrupted), per_update_losses(log)
    assert sorted(got) == list(range(start + 1, 31))
    assert got == {u: want[u] for u in got}
    final = [
        torch.load(f / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
        for f in (tmp_path / "ckpt", work / "ckpt")
    ]
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[1])


def test_fairseqs_transformer_trains_in_bf16_with_and_without_bf16_units(tmp_path):
    """As on a CPU that PyTorch reports without bfloat16 units, fairseq-train says once that bf16
    is slower there, and trains; with them, it says nothing. Only the report is forced
    (tests/cpu_report), not the kernels: both runs log the same losses (to the digit fairseq prints)."""
    from .test_compat import FIXTURES

    losses = {}
    for units in ("none", "native"):
        result = run(
            "fairseq-train",
            FIXTURES / "bin",
            "--user-dir",
            USER_DIR,
            "--arch",
            "transformer",
            *TINY,
            "--optimizer",
            "adam",
            "--lr",
            "2e-3",
            "--criterion",
            "label_smoothed_cross_entropy",
            "--max-tokens",
            "1000",
            "--max-update",
            "6",
            "--log-format",
            "json",
            "--log-interval",
            "1",
            "--save-dir",
            tmp_path / units,
            "--bf16",
            "--cpu",
            env=cpu_report.environment(units),
        )
        log = result.stdout + result.stderr
        assert log.count(emulated("fairseq-train")) == (1 if units == "none" else 0), log[-2000:]
        losses[units] = per_update_losses(log)
        assert sorted(losses[units]) == list(range(1, 7)), log[-2000:]
        state = torch.load(tmp_path / units / "checkpoint_last.pt", map_location="cpu", weights_only=False)
        model_cfg = state["cfg"]["model"]
        assert getattr(model_cfg, "arch", None) == "transformer" or getattr(model_cfg, "_name", None) == "transformer"
        assert {t.dtype for t in state["model"].values() if t.is_floating_point()} == {torch.float32}
    assert sorted(losses["none"]) == sorted(losses["native"])
    assert_same_as_printed(list(losses["none"].values()), list(losses["native"].values()), LOSS_DIGIT)
