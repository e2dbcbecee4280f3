"""End to end, as a user types it: fairseq-preprocess, fairseq-train --user-dir with a realformer
architecture, fairseq-generate (beam 4), fairseq-interactive and resuming, in subprocesses with
no environment variable set."""
import json
import re

import pytest
import torch

from fairseq_realformer.checkpoints import allowed_globals

from .cli import N_TEST, TRAIN, preprocess, run, train_losses
from .helpers import USER_DIR


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    work = tmp_path_factory.mktemp("cli")
    preprocess(work)
    result = run("fairseq-train", "bin", *TRAIN, "--max-update", "40", "--save-dir", "ckpt", cwd=work)
    return work, result.stdout + result.stderr


def test_train_loss_goes_down(trained):
    _, log = trained
    losses = train_losses(log)
    assert len(losses) >= 6, log[-2000:]
    assert losses[-1] < losses[0] - 1.0, losses


def test_generate_beam4_translates_every_sentence(trained):
    work, _ = trained
    result = run("fairseq-generate", "bin", "--user-dir", USER_DIR, "--path", "ckpt/checkpoint_last.pt",
                 "--beam", "4", "--batch-size", "8", "--print-alignment", cwd=work)  # fmt: skip
    hypotheses = re.findall(r"^H-(\d+)\t", result.stdout, re.M)
    assert sorted(map(int, hypotheses)) == list(range(N_TEST))
    assert len(re.findall(r"^A-\d+\t", result.stdout, re.M)) == N_TEST
    assert "BLEU4" in result.stdout


def test_interactive_translates_stdin(trained):
    work, _ = trained
    result = run("fairseq-interactive", "bin", "--user-dir", USER_DIR, "--path", "ckpt/checkpoint_best.pt",
                 "--beam", "4", "--source-lang", "src", "--target-lang", "tgt",
                 cwd=work, stdin="s1 s2 s3\ns4 s5\n")  # fmt: skip
    assert len(re.findall(r"^H-\d+\t", result.stdout, re.M)) == 2


def test_restore_file_resumes_training(trained):
    work, _ = trained
    result = run("fairseq-train", "bin", *TRAIN, "--max-update", "45", "--save-dir", "ckpt",
                 "--no-save", cwd=work)  # fmt: skip
    log = result.stdout + result.stderr
    assert re.search(r"Loaded checkpoint ckpt/checkpoint_last\.pt \(epoch \d+ @ 40 updates\)", log), log[-3000:]
    assert json.loads(log.rsplit("| train_inner | ", 1)[1].splitlines()[0])["num_updates"] == "45"


def test_checkpoints_hold_only_allowed_globals(trained):
    work, _ = trained
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in allowed_globals()}
    for name in ("checkpoint_last.pt", "checkpoint_best.pt", "checkpoint1.pt"):
        found = set(torch.serialization.get_unsafe_globals_in_checkpoint(str(work / "ckpt" / name)))
        assert "argparse.Namespace" in found and found <= allowed, found - allowed


def test_impossible_flags_fail_with_a_one_line_error(trained):
    work, _ = trained
    result = run("fairseq-train", "bin", *TRAIN, "--cross-self-attention", "--save-dir", "unused",
                 cwd=work, check=False)  # fmt: skip
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("fairseq-train: error: --cross-self-attention")
