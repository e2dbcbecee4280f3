"""The plugin's changes to fairseq (``patches``: ``model_support``, what the model needs, and ``fixes``,
fairseq's defects): installed once, each where fairseq's callers look it up, and a patch whose call
site fairseq changed fails loudly instead of silently doing nothing."""

import sys
import time
import types
from unittest.mock import MagicMock

import fairseq_cli.generate
import fairseq_cli.interactive
import numpy as np
import pytest
from fairseq import checkpoint_utils, hub_utils
from fairseq.data import data_utils
from fairseq.data.fairseq_dataset import FairseqDataset
from fairseq.dataclass.configs import CheckpointConfig
from fairseq.logging import meters, metrics
from fairseq.trainer import Trainer
from omegaconf import OmegaConf

from common import fairseq_log
from fairseq_realformer import patches
from fairseq_realformer.patches.fixes.wall_clock import restart_wall_clock
from fairseq_realformer.patches.patching import MARKER, patch

from .cli import SCRIPTS, TINY, preprocess, run
from .helpers import USER_DIR


@pytest.mark.parametrize("n", [1, 7, 20, 21, 1003])
@pytest.mark.parametrize("max_tokens, max_sentences", [(None, 1), (None, 8), (None, 20), (120, None), (300, 16)])
def test_every_index_is_batched_exactly_once_in_order(n, max_tokens, max_sentences):
    """fairseq #5036, through the call site every dataset uses: FairseqDataset.batch_by_size."""
    lengths = np.random.default_rng(n).integers(1, 30, n)
    indices = np.argsort(lengths, kind="mergesort")
    dataset = FairseqDataset()
    dataset.num_tokens = lambda i: lengths[i]
    dataset.num_tokens_vec = lambda i: lengths[i]
    batches = dataset.batch_by_size(
        indices, max_tokens=max_tokens, max_sentences=max_sentences, required_batch_size_multiple=8
    )
    assert np.array_equal(np.concatenate(batches), indices)
    for batch in batches:
        if max_sentences:
            assert len(batch) <= max_sentences
        if max_tokens:
            assert len(batch) * lengths[batch].max() <= max_tokens


def patched_attributes():
    return [
        data_utils.batch_by_size,
        checkpoint_utils.load_checkpoint_to_cpu,
        checkpoint_utils.load_ema_from_checkpoint,
        checkpoint_utils.load_model_ensemble_and_task,
        hub_utils.from_pretrained,
        checkpoint_utils.load_checkpoint,
        Trainer.__init__,
        fairseq_cli.generate.main,
        fairseq_cli.interactive.main,
        checkpoint_utils.verify_checkpoint_directory,
        sys.excepthook,
    ]


def test_every_patch_is_installed_once():
    patched = patched_attributes()
    assert all(getattr(f, MARKER, False) for f in patched)
    patches.install()  # a second import of the plugin
    assert patched_attributes() == patched
    assert data_utils.batch_by_size.__wrapped__.__name__ == "batch_by_size"  # wraps fairseq's, not ours


def test_a_call_site_that_no_longer_calls_the_patched_function_fails_loudly():
    fairseq_module = types.ModuleType("fake_fairseq_module")
    fairseq_module.load = lambda path: path
    caller_globals = {"fake_fairseq_module": fairseq_module}
    still_calls = eval("lambda path: fake_fairseq_module.load(path)", caller_globals)
    imported_it_directly = eval("lambda path: load(path)", {"load": fairseq_module.load})
    patch(fairseq_module, "load", lambda f: lambda path: f(path) + "!", call_sites=[still_calls])
    assert still_calls("x") == "x!"
    with pytest.raises(ImportError, match="no longer calls fake_fairseq_module.load"):
        patch(fairseq_module, "load", lambda f: f, call_sites=[imported_it_directly])
    with pytest.raises(ImportError, match="fake_fairseq_module.gone no longer exists"):
        patch(fairseq_module, "gone", lambda f: f, call_sites=[])


def test_call_sites_that_import_the_module_inside_or_call_the_class_are_recognised(monkeypatch):
    """hub_utils.from_pretrained is reached through ``from fairseq import hub_utils`` inside the
    calling function; a Trainer's __init__ by calling ``Trainer(...)``."""
    package, module = types.ModuleType("fake_package"), types.ModuleType("fake_package.fairseq_module")
    module.load, package.fairseq_module = (lambda path: path), module
    monkeypatch.setitem(sys.modules, "fake_package", package)
    monkeypatch.setitem(sys.modules, "fake_package.fairseq_module", module)
    patch(module, "load", lambda f: lambda path: f(path) + "!", call_sites=[_imports_the_module_inside])
    assert _imports_the_module_inside("x") == "x!"

    patch(_Built, "__init__", lambda init: lambda self: setattr(self, "how", "patched"), call_sites=[_builds])
    assert _builds().how == "patched"
    with pytest.raises(ImportError, match="_does_not_build no longer calls _Built.__init__"):
        patch(_Built, "__init__", lambda init: init, call_sites=[_does_not_build])


def _imports_the_module_inside(path):
    from fake_package import fairseq_module

    return fairseq_module.load(path)


class _Built:
    def __init__(self):
        self.how = "original"


def _builds():
    return _Built()


def _does_not_build():
    return None


def test_a_stand_in_trainer_and_model_pass_through_load_checkpoint_untouched(tmp_path):
    """fairseq's own tests drive load_checkpoint with MagicMock trainers and models, which answer
    every attribute: ADMIN's start-up asks nothing of a model that is not ours, and fairseq's
    result comes back as it is."""
    trainer, epoch_itr = MagicMock(), MagicMock(epoch=1)
    trainer.checkpoint_suffix = ""
    trainer.load_checkpoint.return_value = None  # no checkpoint_last.pt: a first launch
    trainer.get_train_iterator.return_value = epoch_itr
    extra_state, itr = checkpoint_utils.load_checkpoint(
        OmegaConf.structured(CheckpointConfig(save_dir=str(tmp_path))), trainer
    )
    assert extra_state is None and itr is epoch_itr
    assert epoch_itr.mock_calls == [] and trainer.get_model.return_value.mock_calls == []
    assert {name for name, _, _ in trainer.mock_calls} <= {
        "load_checkpoint",
        "get_train_iterator",
        "lr_step",
        "get_model",
    }


@pytest.mark.parametrize("restart", [False, True])
def test_a_resumed_runs_wall_clock_runs_again(restart):
    """fairseq's own defect: its "wall" meter, started when the trainer is made, reads 0 forever
    once a checkpoint's meters are loaded (Trainer.load_checkpoint); the plugin restarts it right
    after fairseq-train's checkpoint_utils.load_checkpoint."""
    metrics.reset()  # the "default" aggregator the trainer logs "wall" to, fresh
    try:
        metrics.log_start_time("wall", priority=790, round=0)  # as Trainer.__init__
        saved = metrics.state_dict()

        def load_checkpoint(*args, **kwargs):  # what Trainer.load_checkpoint does to the meters
            metrics.load_state_dict(saved)
            for meter in metrics.get_meters("default"):
                if isinstance(meter, meters.TimeMeter):
                    meter.reset()
            return "extra state", "epoch iterator"

        load = restart_wall_clock(load_checkpoint) if restart else load_checkpoint
        assert load("cfg", "trainer") == ("extra state", "epoch iterator")
        time.sleep(0.05)
        wall = metrics.get_meter("default", "wall").elapsed_time
        assert wall >= 0.05 if restart else wall == 0
    finally:
        metrics.reset()


# A run whose validation loss never improves (lr 1e-9: the loss fairseq rounds to 3 decimals stays
# the same), so --patience 2 stops it after its third epoch.
STALLED = [
    *TINY,
    *"--arch realformer_iwslt_de_en --optimizer adam --lr 1e-9 --lr-scheduler fixed --dropout 0".split(),
    *"--criterion cross_entropy --max-tokens 1000 --seed 1 --num-workers 0 --patience 2".split(),
    *"--log-format json --log-interval 100 --no-epoch-checkpoints".split(),
]


def test_a_resumed_run_stops_early_where_an_uninterrupted_one_stops(tmp_path):
    """fairseq's own defect: --patience counts on a function attribute no checkpoint saves, so a run
    resumed after epoch 2 counts from zero again (fairseq alone stops at epoch 5, not 3); with the
    plugin it goes on counting from the checkpoint."""
    preprocess(tmp_path)

    def train(save_dir, max_epoch, env=None):
        flags = ["--user-dir", USER_DIR, *STALLED, "--save-dir", save_dir, "--max-epoch", max_epoch]
        result = run("fairseq-train", "bin", *flags, cwd=tmp_path, env=env)
        output = result.stdout + result.stderr
        return [int(f["epoch"]) for _, f in fairseq_log.records(output.splitlines(), "valid")], output

    epochs, output = train("whole", 10)
    assert epochs == [1, 2, 3] and "early stop" in output  # the uninterrupted run
    assert train("resumed", 2)[0] == [1, 2]
    (tmp_path / "fairseq-alone").mkdir()
    (tmp_path / "fairseq-alone" / "checkpoint_last.pt").write_bytes(
        (tmp_path / "resumed" / "checkpoint_last.pt").read_bytes()
    )
    epochs, output = train("resumed", 10)
    assert epochs == [3] and "early stop" in output  # where the uninterrupted run stopped
    assert train("fairseq-alone", 10, env={"REALFORMER_FAIRSEQ_FIXES": "0"})[0] == [3, 4, 5]  # the defect


PROBE = f"""
import os
import unittest

from fairseq import checkpoint_utils
from fairseq.data import data_utils


def test_load_checkpoint_is_fairseqs_own():
    assert not hasattr(checkpoint_utils.load_checkpoint, {MARKER!r})


def test_batching_is_fairseqs_own():
    assert not hasattr(data_utils.batch_by_size, {MARKER!r})


def test_unpickling_allowed():
    assert os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD") == "1"


class TestProbe(unittest.TestCase):
    def test_the_same_everywhere(self):
        self.assertEqual(1, 1)

    @unittest.skip("skipped everywhere")
    def test_skipped(self):
        pass
"""


def test_fairseqs_tests_run_without_and_with_the_plugin_and_compare_test_by_test(tmp_path):
    """scripts/fairseq_tests_with_plugin.py on a stand-in fairseq checkout whose tests see which
    column they run in: each column's counts per file, and exactly the tests whose result differs.
    With REALFORMER_FAIRSEQ_FIXES=0 the model's own change of load_checkpoint stays, the fixes'
    change of batch_by_size does not."""
    checkout = tmp_path / "fairseq"
    (checkout / "tests").mkdir(parents=True)
    (checkout / "tests" / "__init__.py").write_text("")
    (checkout / "tests" / "test_probe.py").write_text(PROBE)
    # a caller's own overrides must not leak into the columns that do not set them
    out = run(
        SCRIPTS / "fairseq_tests_with_plugin.py",
        checkout,
        "tests/test_probe.py",
        "--out",
        tmp_path / "out",
        env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "REALFORMER_FAIRSEQ_FIXES": "0"},
    ).stdout
    assert "| test_probe.py | 3/1/1 | 4/0/1 | 1/3/1 | 2/2/1 |" in out  # fairseq | weights_only off | plugin | fixes off
    differ = out.split("tests whose result differs:")[1].strip().splitlines()
    columns = ("fairseq", "fairseq, weights_only off", "plugin", "plugin, fixes off")

    def differs(test, *outcomes):
        return f"- test_probe.py {test}: " + ", ".join(f"{c} {o}" for c, o in zip(columns, outcomes))

    assert differ == [
        differs("test_batching_is_fairseqs_own", "passed", "passed", "failed", "passed"),
        differs("test_load_checkpoint_is_fairseqs_own", "passed", "passed", "failed", "failed"),
        differs("test_unpickling_allowed", "failed", "passed", "failed", "failed"),
    ]
    slugs = ("fairseq", "fairseq-weights_only-off", "plugin", "plugin-fixes-off")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        f"{s}.{e}" for s in slugs for e in ("log", "xml")
    )


def test_fairseqs_tests_need_a_fairseq_checkout(tmp_path):
    """Anything but a fairseq checkout with the files asked for: one line, and no output folder."""
    out = tmp_path / "out"
    result = run(SCRIPTS / "fairseq_tests_with_plugin.py", tmp_path, "--out", out, check=False)
    assert result.returncode == 2 and not out.exists()
    assert result.stderr.strip().splitlines() == [
        f"fairseq_tests_with_plugin.py: error: {tmp_path}: no tests/ folder; give a fairseq source checkout"
    ]
    (tmp_path / "tests").mkdir()
    result = run(SCRIPTS / "fairseq_tests_with_plugin.py", tmp_path, "tests/test_train.py", "--out", out, check=False)
    assert result.returncode == 2 and not out.exists()
    assert result.stderr.strip().splitlines() == [
        f"fairseq_tests_with_plugin.py: error: {tmp_path}: no tests/test_train.py"
    ]
