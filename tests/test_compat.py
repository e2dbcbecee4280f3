"""What version 0.1.0 computed, still computed: fixed-seed models give the stored outputs, and
checkpoints written by 0.1.0's fairseq-train translate identically and resume training exactly.

The fixtures in tests/data/compat-0.1.0 were made with the code of commit 96826a8 (see the README
there); nothing in this file may be regenerated with newer code.
"""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from .cli import run, train_losses
from .helpers import USER_DIR, assert_within_rounding, make_dictionary, perturb_, realformer
from .interchange import LOSS_DIGIT, SCORE_DIGIT, assert_same_as_printed

FIXTURES = Path(__file__).parent / "data" / "compat-0.1.0"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
STORED = torch.load(FIXTURES / "outputs.pt")
SMALL = "--encoder-embed-dim 16 --decoder-embed-dim 16 --encoder-ffn-embed-dim 32 --decoder-ffn-embed-dim 32".split()


@pytest.mark.parametrize("config", sorted(STORED["outputs"]))
def test_fixed_seed_model_gives_the_stored_outputs(config):
    paths, mode, backbone, *flags = config.split("|")
    batch = STORED["batch"]
    model = realformer(paths, mode, backbone, *flags, dictionary=make_dictionary(), seed=0)
    if flags:  # --admin-init profile: ω from the same batch
        model.initialize_admin(batch)
    model = perturb_(model)
    encoder_out = model.encoder(batch["src_tokens"], src_lengths=batch["src_lengths"])
    logits, extra = model.decoder(batch["prev_output_tokens"], encoder_out=encoder_out)
    want = STORED["outputs"][config]
    # computed then on another machine's kernels, with 2 threads: float32's rounding apart
    assert_within_rounding(encoder_out["encoder_out"][0], want["encoder_out"])
    assert_within_rounding(logits, want["logits"])
    assert_within_rounding(extra["attn"][0], want["attn"])


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The 0.1.0 data and checkpoints, copied: fairseq-train writes into its save dir."""
    work = tmp_path_factory.mktemp("compat")
    shutil.copytree(FIXTURES, work, dirs_exist_ok=True)
    return work


def hypotheses(stdout):
    """{(kind, id): (score, text)} of the H- and P- lines, scores as floats."""
    found = {}
    for kind, i, rest in re.findall(r"^([HP])-(\d+)\t(.*)$", stdout, re.M):
        if kind == "H":
            score, text = rest.split("\t")
            found[kind, i] = ([float(score)], text)
        else:
            found[kind, i] = ([float(x) for x in rest.split()], "")
    return found


def assert_same_translations(stdout, expected_lines):
    """The same words; the scores as fairseq prints them (P-lines to 4 decimals), where a value
    computed by another CPU's kernels may round to the neighbouring last digit."""
    got, want = hypotheses(stdout), hypotheses("\n".join(expected_lines))
    assert got.keys() == want.keys()
    for key, (scores, text) in want.items():
        assert got[key][1] == text, key
        assert got[key][0] == pytest.approx(scores, abs=1.5 * SCORE_DIGIT), key  # 0 or 1 digit apart


@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_old_checkpoint_generates_identically(work, variant):
    """A 0.1.0 checkpoint translates as it did then."""
    result = run(
        "fairseq-generate",
        "bin",
        "--user-dir",
        USER_DIR,
        "--path",
        f"ckpt-{variant}/checkpoint_last.pt",
        "--beam",
        "4",
        "--batch-size",
        "8",
        "--max-len-b",
        "12",
        cwd=work,
    )
    assert_same_translations(result.stdout, EXPECTED[variant]["generate"])


def test_old_pre_ln_checkpoint_translates_identically_in_interactive(work):
    """0.1.0 stored --encoder/decoder-normalize-before for a Pre-LN backbone in the checkpoint."""
    result = run(
        "fairseq-interactive",
        "bin",
        "--user-dir",
        USER_DIR,
        "--path",
        "ckpt-pre-ln/checkpoint_last.pt",
        "--beam",
        "4",
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--max-len-b",
        "12",
        cwd=work,
        stdin="s1 s2 s3\ns4 s5\ns7 s7 s0 s11\n",
    )
    assert_same_translations(result.stdout, EXPECTED["pre-ln"]["interactive"])


def test_old_admin_checkpoint_resumes_training_exactly(work):
    """--restore-file (checkpoint_last.pt of the save dir): the ω profiled by 0.1.0 are kept,
    nothing is profiled again, and the next updates' losses are 0.1.0's, on the batches of the run
    the checkpoint came from (the README there says how they were made)."""
    expected = EXPECTED["admin-profile"]
    result = run(
        "fairseq-train",
        "bin",
        "--user-dir",
        USER_DIR,
        "--arch",
        "realformer_iwslt_de_en",
        *expected["flags"],
        *_train_flags(),
        "--max-update",
        "204",
        "--save-dir",
        "ckpt-admin-profile",
        "--no-save",
        "--log-interval",
        "1",
        cwd=work,
    )
    log = result.stdout + result.stderr
    assert "Loaded checkpoint ckpt-admin-profile/checkpoint_last.pt" in log and "ADMIN omega initialised" not in log
    # as logged, to 3 decimals: 0.1.0's CPU rounded in its last bits as its kernels did
    want = [float(r["loss"]) for r in expected["resume_losses"]]
    assert_same_as_printed(train_losses(log), want, LOSS_DIGIT)


def _train_flags():
    """The flags 0.1.0's fixtures were trained with (tests/cli.TRAIN of that version, then SMALL)."""
    return [
        "--encoder-layers",
        "2",
        "--decoder-layers",
        "2",
        "--encoder-attention-heads",
        "2",
        "--decoder-attention-heads",
        "2",
        "--share-all-embeddings",
        *SMALL,
        "--optimizer",
        "adam",
        "--adam-betas",
        "(0.9,0.98)",
        "--lr",
        "5e-3",
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        "10",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--max-tokens",
        "1000",
        "--seed",
        "1",
        "--num-workers",
        "0",
        "--log-format",
        "json",
        "--eval-bleu",
        "--eval-bleu-args",
        '{"beam": 1, "max_len_a": 1.2, "max_len_b": 10}',
        "--best-checkpoint-metric",
        "bleu",
        "--maximize-best-checkpoint-metric",
    ]
