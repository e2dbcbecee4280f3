"""End to end, as a user types it: fairseq-preprocess, fairseq-train --user-dir with a realformer
architecture, fairseq-generate (beam 4), fairseq-interactive and resuming, in subprocesses with
no environment variable set."""
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fairseq_realformer.checkpoints import allowed_globals

from .helpers import USER_DIR

BIN = Path(sys.executable).parent
N_TEST = 21  # not a multiple of 8: fairseq's batching would drop sentences without our fix
TINY = [
    "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
    "--encoder-layers", "2", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
    "--decoder-attention-heads", "2", "--decoder-layers", "2", "--share-all-embeddings",
]  # fmt: skip
TRAIN = [
    "--user-dir", USER_DIR, "--arch", "realformer_iwslt_de_en", *TINY,
    "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "2e-3",
    "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
    "--max-tokens", "1000", "--seed", "1", "--num-workers", "0",
    "--log-format", "json", "--log-interval", "5",
    # --eval-bleu puts numpy metrics into the checkpoints, which must load safely too
    "--eval-bleu", "--eval-bleu-args", '{"beam": 1, "max_len_a": 1.2, "max_len_b": 10}',
    "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric",
]  # fmt: skip


def run(tool, *args, cwd, stdin=None, check=True):
    """Run a fairseq console script with no torch.load override in the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FORCE", "REALFORMER_"))}
    result = subprocess.run(
        [str(BIN / tool), *args], cwd=cwd, env=env, input=stdin, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    if check and result.returncode != 0:
        raise AssertionError(f"{tool} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def write_corpus(folder: Path, seed: int = 0):
    """A toy language pair: target word i translates source word i."""
    rng = random.Random(seed)
    for split, count in (("train", 600), ("valid", 40), ("test", N_TEST)):
        with open(folder / f"{split}.src", "w") as src, open(folder / f"{split}.tgt", "w") as tgt:
            for _ in range(count):
                words = [rng.randrange(12) for _ in range(rng.randint(3, 8))]
                src.write(" ".join(f"s{i}" for i in words) + "\n")
                tgt.write(" ".join(f"t{i}" for i in words) + "\n")


def train_losses(log: str):
    return [float(json.loads(line.split("| train_inner | ", 1)[1])["loss"])
            for line in log.splitlines() if "| train_inner | " in line]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    work = tmp_path_factory.mktemp("cli")
    write_corpus(work)
    run("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", "train",
        "--validpref", "valid", "--testpref", "test", "--destdir", "bin", "--joined-dictionary",
        "--workers", "1", cwd=work)  # fmt: skip
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
