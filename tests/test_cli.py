"""End to end, as a user types it: fairseq-preprocess, fairseq-train --user-dir with a realformer
architecture, fairseq-generate (beam 4), fairseq-interactive and resuming, in subprocesses with
no environment variable set."""

import json
import re
from pathlib import Path

import pytest
import torch

from fairseq_realformer.files.checkpoints import allowed_globals

from .cli import N_TEST, TRAIN, preprocess, run, train_losses
from .helpers import REPO, USER_DIR


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
    result = run(
        "fairseq-generate",
        "bin",
        "--user-dir",
        USER_DIR,
        "--path",
        "ckpt/checkpoint_last.pt",
        "--beam",
        "4",
        "--batch-size",
        "8",
        "--print-alignment",
        cwd=work,
    )
    hypotheses = re.findall(r"^H-(\d+)\t", result.stdout, re.M)
    assert sorted(map(int, hypotheses)) == list(range(N_TEST))
    assert len(re.findall(r"^A-\d+\t", result.stdout, re.M)) == N_TEST
    assert "BLEU4" in result.stdout


def test_interactive_translates_stdin(trained):
    work, _ = trained
    result = run(
        "fairseq-interactive",
        "bin",
        "--user-dir",
        USER_DIR,
        "--path",
        "ckpt/checkpoint_best.pt",
        "--beam",
        "4",
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        cwd=work,
        stdin="s1 s2 s3\ns4 s5\n",
    )
    assert len(re.findall(r"^H-\d+\t", result.stdout, re.M)) == 2


def test_restore_file_resumes_training(trained):
    work, _ = trained
    result = run("fairseq-train", "bin", *TRAIN, "--max-update", "45", "--save-dir", "ckpt", "--no-save", cwd=work)
    log = result.stdout + result.stderr
    assert re.search(r"Loaded checkpoint ckpt/checkpoint_last\.pt \(epoch \d+ @ 40 updates\)", log), log[-3000:]
    assert json.loads(log.rsplit("| train_inner | ", 1)[1].splitlines()[0])["num_updates"] == "45"


def test_checkpoints_hold_only_allowed_globals(trained):
    work, _ = trained
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in allowed_globals()}
    for name in ("checkpoint_last.pt", "checkpoint_best.pt", "checkpoint1.pt"):
        found = set(torch.serialization.get_unsafe_globals_in_checkpoint(str(work / "ckpt" / name)))
        assert "argparse.Namespace" in found and found <= allowed, found - allowed


@pytest.mark.parametrize(
    "flags, error",
    [
        (
            ["--cross-self-attention"],
            "--cross-self-attention is not supported by the realformer model: its decoder "
            "self-attention also attends over encoder states, which mixes the separate score paths",
        ),
        (
            ["--residual-attention-paths", "encoder,foo"],
            "--residual-attention-paths: unknown path 'foo'; give a comma "
            "list of encoder, decoder, cross, or all, or none",
        ),
        (
            ["--backbone", "postln"],
            "--backbone postln: choose from post-ln, pre-ln, admin, deepnorm, rezero, t-fixup, resi-dual",
        ),
        (["--admin-init-path", "missing.init"], "--admin-init-path missing.init: No such file or directory"),
        (
            ["--residual-attention-kernel", "fused"],
            "--residual-attention-kernel fused: retired: residual attention runs one implementation, the eager "
            "score chain (the fused and concat kernels were no faster on GPUs: benchmarks/RESULTS.md); for speed "
            "on a GPU, try --compile-layers",
        ),
    ],
)
def test_a_refused_flag_is_one_line_before_anything_is_logged_or_written(trained, flags, error):
    work, _ = trained
    before = sorted(p.name for p in work.iterdir())
    result = run("fairseq-train", "bin", *TRAIN, *flags, "--save-dir", "refused/ckpt", cwd=work, check=False)
    assert result.returncode != 0
    line = f"fairseq-train: error: {error}"
    assert (result.stdout + result.stderr).splitlines() == [line]  # no config dump, no usage
    if flags[0] in ("--residual-attention-paths", "--admin-init-path"):
        assert line in (Path(REPO) / "docs" / "usage.md").read_text()  # shown there as printed
    assert sorted(p.name for p in work.iterdir()) == before  # no save dir


def test_a_run_refused_after_fairseq_made_its_save_dir_takes_it_back(trained):
    work, _ = trained
    result = run(
        "fairseq-train",
        "bin",
        *TRAIN,
        "--restore-file",
        "missing.pt",
        "--save-dir",
        "refused/ckpt",
        cwd=work,
        check=False,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "fairseq-train: error: --restore-file missing.pt: no such checkpoint file (fairseq-train would train from scratch)"
    )
    assert "'save_dir': 'refused/ckpt'" in result.stdout + result.stderr  # logged once fairseq made the folder
    assert not (work / "refused").exists()


def test_compiled_layers_resume_an_eager_run_and_their_checkpoints_translate(trained):
    """--compile-layers continues the eager run's checkpoint, logs its compile time once (at the
    first validation) and saves a checkpoint that fairseq-generate, eager, translates. Traced by
    dynamo alone here (REALFORMER_COMPILE_BACKEND=eager: seconds, not inductor's minutes on a CPU;
    tests/test_compiled_layers.py runs inductor's code)."""
    work, _ = trained
    result = run(
        "fairseq-train",
        "bin",
        *TRAIN,
        "--compile-layers",
        *("--restore-file", "ckpt/checkpoint_last.pt", "--save-dir", "compiled", "--max-update", "50"),
        cwd=work,
        env={"REALFORMER_COMPILE_BACKEND": "eager"},
    )
    log = result.stdout + result.stderr
    assert re.search(r"Loaded checkpoint ckpt/checkpoint_last\.pt \(epoch \d+ @ 40 updates\)", log), log[-3000:]
    # 2+2 layers: the first layer of each stack, the encoder's second, the decoder's alignment layer
    reports = re.findall(r"--compile-layers: (\d+) graphs compiled in [\d.]+ s so far", log)
    assert reports == ["4"], log[-3000:]
    losses = train_losses(log)
    assert losses and losses[-1] < 8, losses
    result = run(
        "fairseq-generate",
        "bin",
        *("--user-dir", USER_DIR, "--path", "compiled/checkpoint_last.pt", "--beam", "4", "--batch-size", "8"),
        cwd=work,
    )
    assert sorted(map(int, re.findall(r"^H-(\d+)\t", result.stdout, re.M))) == list(range(N_TEST))


def test_a_checkpoint_that_stored_the_retired_kernel_flag_translates(trained):
    """Checkpoints made before --residual-attention-kernel was retired store its value: they load
    and translate (the value is dropped)."""
    work, _ = trained
    state = torch.load(work / "ckpt" / "checkpoint_last.pt", weights_only=False)
    state["cfg"]["model"].residual_attention_kernel = "concat"
    torch.save(state, work / "with-kernel.pt")
    args = ("--user-dir", USER_DIR, "--path", "with-kernel.pt", "--beam", "4", "--batch-size", "8")
    result = run("fairseq-generate", "bin", *args, cwd=work)
    assert sorted(map(int, re.findall(r"^H-(\d+)\t", result.stdout, re.M))) == list(range(N_TEST))
