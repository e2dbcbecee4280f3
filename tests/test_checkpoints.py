"""Checkpoints load under torch.load(weights_only=True) with exactly fairseq's globals allowed."""

import argparse
import fractions
import os

import numpy
import pytest
import torch
from fairseq import checkpoint_utils

from fairseq_realformer.errors import RealformerConfigError
from fairseq_realformer.files.checkpoints import ALLOW_ENV, UntrustedCheckpointError, read_checkpoint


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo this must never run",))


def fairseq_like_state(**extra_state):
    """What fairseq's trainer saves: args/cfg with a Namespace, weights, numpy metrics."""
    model_args = argparse.Namespace(arch="realformer_wmt_en_de", residual_attention_paths="all")
    return {
        "args": None,
        "cfg": {"model": model_args, "common": {"seed": 1}, "task": {"_name": "translation"}},
        "model": {"encoder.embed_tokens.weight": torch.randn(4, 2)},
        "optimizer_history": [
            {
                "criterion_name": "LabelSmoothedCrossEntropyCriterion",
                "optimizer_name": "FairseqAdam",
                "lr_scheduler_state": {"best": numpy.float64(2.5)},
                "num_updates": 3,
            }
        ],
        "extra_state": {
            "train_iterator": {"epoch": 1, "iterations_in_epoch": 3},
            "metrics": {"valid": {"_bleu_counts_0": numpy.int64(17), "_bleu_totals": numpy.array([4, 3])}},
            "best": numpy.float64(1.5),
            **extra_state,
        },
    }


@pytest.fixture
def no_trust_env(monkeypatch):
    for name in ("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_WEIGHTS_ONLY_LOAD", ALLOW_ENV):
        monkeypatch.delenv(name, raising=False)


def test_fairseq_checkpoint_loads_without_environment_variables(tmp_path, no_trust_env):
    path = tmp_path / "checkpoint.pt"
    torch.save(fairseq_like_state(), path)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert state["cfg"]["model"].arch == "realformer_wmt_en_de"
    assert state["extra_state"]["metrics"]["valid"]["_bleu_counts_0"] == 17
    assert read_checkpoint(str(path))["extra_state"]["best"] == 1.5


def test_unknown_global_is_refused_with_how_to_opt_in(tmp_path, no_trust_env, monkeypatch):
    path = tmp_path / "odd.pt"
    torch.save(fairseq_like_state(ratio=fractions.Fraction(1, 3)), path)
    with pytest.raises(UntrustedCheckpointError) as error:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    message = str(error.value)
    assert str(path) in message and "fractions.Fraction" in message
    assert f"{ALLOW_ENV}=fractions.Fraction" in message  # how a user who trusts it opts in

    monkeypatch.setenv(ALLOW_ENV, "fractions.Fraction")
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert state["extra_state"]["ratio"] == fractions.Fraction(1, 3)


def test_code_in_a_pickle_never_runs(tmp_path, no_trust_env, capfd):
    path = tmp_path / "evil.pt"
    torch.save(fairseq_like_state(payload=_RunsCode()), path)
    with pytest.raises(UntrustedCheckpointError, match="system"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert "must never run" not in capfd.readouterr().out


def test_a_file_that_is_no_checkpoint_is_named_as_such(tmp_path, no_trust_env):
    path = tmp_path / "notes.pt"
    path.write_text("not a checkpoint\n")
    with pytest.raises(RealformerConfigError, match=f"{path} is not a readable torch checkpoint") as error:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert ALLOW_ENV not in str(error.value)


def test_allow_list_is_scoped_to_checkpoint_loading(tmp_path, no_trust_env):
    """Plain torch.load elsewhere in the process keeps torch's own, stricter defaults."""
    path = tmp_path / "namespace.pt"
    torch.save({"args": argparse.Namespace(a=1)}, path)
    with pytest.raises(Exception, match="Namespace"):
        torch.load(path)


# --- the guard asks of a file only what the guarded fairseq loader reads --------------------------


def test_an_ema_checkpoint_with_only_model_and_extra_state_loads(tmp_path, no_trust_env):
    """fairseq's load_ema_from_checkpoint (--ema-seed-model) reads the EMA weights from
    extra_state and hands them on as 'model'; no 'cfg' is needed, so none is asked for."""
    path = tmp_path / "ema.pt"
    ema = {"encoder.embed_tokens.weight": torch.randn(4, 2)}
    torch.save({"model": {"encoder.embed_tokens.weight": torch.zeros(4, 2)}, "extra_state": {"ema": ema}}, path)
    state = checkpoint_utils.load_ema_from_checkpoint(str(path))
    assert torch.equal(state["model"]["encoder.embed_tokens.weight"], ema["encoder.embed_tokens.weight"])


def test_a_checkpoint_without_cfg_loads_as_fairseq_loads_it(tmp_path, no_trust_env):
    """load_checkpoint_to_cpu reads optimizer_history and extra_state, not 'cfg': fairseq's
    Trainer resumes from such a file, so it comes back as fairseq returns it."""
    path = tmp_path / "checkpoint.pt"
    state = fairseq_like_state()
    del state["args"], state["cfg"]
    torch.save(state, path)
    loaded = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert "cfg" not in loaded and torch.equal(
        loaded["model"]["encoder.embed_tokens.weight"], state["model"]["encoder.embed_tokens.weight"]
    )
