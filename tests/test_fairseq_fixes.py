"""The fixes of fairseq's defects (``patches.fixes``): one switch, REALFORMER_FAIRSEQ_FIXES=0, leaves
every fairseq function they replace as fairseq has it, while what the model needs from fairseq
(``patches.model_support``) stays; without it every fix is active; docs/checkpoints-and-errors.md's
table lists exactly these fixes; each fix's docstring names its call site and what changes for a
stock transformer."""

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from fairseq import checkpoint_utils
from fairseq.data.fairseq_dataset import FairseqDataset

from fairseq_realformer.patches.fixes import FIXES, SWITCH, where
from fairseq_realformer.patches.patching import installed

from .cli import run
from .helpers import REPO
from .interchange import installed_fairseq

# In a fresh process: each fixed fairseq function before and after ``import fairseq_realformer``,
# fairseq's batching of 20 sentences by 8, and what the model needs from fairseq.
PROBE = """
import importlib, json, sys
import numpy as np

def attribute(module, names):
    found = importlib.import_module(module)
    for name in names:
        found = getattr(found, name)
    return found

targets = json.loads(sys.argv[1])
before = [attribute(module, names) for module, names in targets]
import fairseq_realformer
from fairseq import checkpoint_utils
from fairseq.data.fairseq_dataset import FairseqDataset
from fairseq_realformer.patches.patching import installed

dataset = FairseqDataset()
dataset.num_tokens = dataset.num_tokens_vec = lambda i: np.ones_like(i)
batches = dataset.batch_by_size(np.arange(20), max_sentences=8, required_batch_size_multiple=8)
print(json.dumps({
    # each fixed function now: fairseq's, or a wrapper around fairseq's; and the changes it holds
    "fairseqs": [attribute(*target) is original for target, original in zip(targets, before)],
    "wraps_fairseqs": [getattr(attribute(*target), "__wrapped__", None) is original
                       for target, original in zip(targets, before)],
    "changes": [sorted(installed(attribute(*target))) for target in targets],
    "batched": int(sum(map(len, batches))),
    "load_checkpoint_to_cpu": sorted(installed(checkpoint_utils.load_checkpoint_to_cpu)),
    "load_checkpoint": sorted(installed(checkpoint_utils.load_checkpoint)),
}))
"""


def module_and_names(path):
    """("fairseq.trainer", ["Trainer", "__init__"]) for "fairseq.trainer.Trainer.__init__"."""
    parts = path.split(".")
    end = max(end for end in range(1, len(parts)) if ".".join(parts[:end]) in sys.modules)
    return ".".join(parts[:end]), parts[end:]


def probe(**env):
    targets = json.dumps([module_and_names(fix.replaces) for fix in FIXES])
    return json.loads(run(sys.executable, "-c", PROBE, targets, env=env).stdout.strip().splitlines()[-1])


ADMIN = "fairseq_realformer.patches.model_support._initialize_admin_after_loading"
GUARD = "fairseq_realformer.files.checkpoints.guarded"
# fairseq functions that the model's changes (patches.model_support) replace too, and stay replaced by
MODEL_CHANGES = {
    "fairseq.checkpoint_utils.load_checkpoint": ADMIN,
    "fairseq.checkpoint_utils.load_checkpoint_to_cpu": GUARD,
}


def test_the_switch_leaves_every_function_the_fixes_replace_as_fairseq_has_it():
    """REALFORMER_FAIRSEQ_FIXES=0: fairseq's own functions (and sys.excepthook); fairseq's
    load_checkpoint only inside the model's change (ADMIN's ω after loading); its batching drops
    the 4 sentences past 16 (fairseq main's; 0.12.2 keeps them); checkpoints still load under the
    allow-list."""
    got = probe(**{SWITCH: "0"})
    for fix, fairseqs, wraps_fairseqs, changes in zip(FIXES, got["fairseqs"], got["wraps_fairseqs"], got["changes"]):
        if fix.replaces in MODEL_CHANGES:
            assert changes == [MODEL_CHANGES[fix.replaces]] and wraps_fairseqs, fix.replaces
        else:
            assert fairseqs and changes == [], fix.replaces
    # fairseq main (ve-fairseq) drops the 4 past 16; 0.12.2 (built from its sdist) predates that
    assert got["batched"] == (20 if installed_fairseq() == "fairseq" else 16)
    assert got["load_checkpoint_to_cpu"] == [GUARD] and got["load_checkpoint"] == [ADMIN]


@pytest.mark.parametrize("switch", [None, "1"], ids=["unset", "1"])
def test_without_the_switch_every_fix_is_active(switch):
    got = probe(**({} if switch is None else {SWITCH: switch}))
    assert [key(fix) in changes for fix, changes in zip(FIXES, got["changes"])] == [True] * len(FIXES)
    assert got["batched"] == 20
    fixes_of_load_checkpoint_to_cpu = {key(fix) for fix in FIXES if fix.replaces.endswith(".load_checkpoint_to_cpu")}
    assert set(got["load_checkpoint_to_cpu"]) == {GUARD} | fixes_of_load_checkpoint_to_cpu
    fixes_of_load_checkpoint = {key(fix) for fix in FIXES if fix.replaces.endswith(".load_checkpoint")}
    assert set(got["load_checkpoint"]) == {ADMIN} | fixes_of_load_checkpoint


def test_in_this_process_every_fix_is_installed_and_works():
    for fix in FIXES:
        owner, name = where(fix.replaces)
        assert key(fix) in installed(getattr(owner, name)), fix.replaces
    dataset = FairseqDataset()
    dataset.num_tokens = dataset.num_tokens_vec = lambda i: np.ones_like(i)
    assert sum(map(len, dataset.batch_by_size(np.arange(20), max_sentences=8, required_batch_size_multiple=8))) == 20
    assert GUARD in installed(checkpoint_utils.load_checkpoint_to_cpu)


def test_a_switch_that_is_neither_0_nor_1_is_refused():
    result = run(sys.executable, "-c", "import fairseq_realformer", env={SWITCH: "off"}, check=False)
    assert result.returncode != 0
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith(f"{SWITCH}=off: 1 (the default) installs the plugin's fixes to fairseq, 0 none of them")
    )


def key(fix):
    return f"{fix.wrap.__module__}.{fix.wrap.__qualname__}"


@pytest.mark.parametrize(
    "fix", sorted({fix.wrap for fix in FIXES}, key=lambda wrap: wrap.__name__), ids=lambda wrap: wrap.__name__
)
def test_each_fix_says_its_call_site_and_what_changes_for_a_stock_transformer(fix):
    doc = " ".join(fix.__doc__.split())
    assert "Call site:" in doc and "stock ``transformer``" in doc


def docs_table():
    """The rows of docs/checkpoints-and-errors.md's table of fixes: (fix, replaces)."""
    text = (Path(REPO) / "docs" / "checkpoints-and-errors.md").read_text()
    section = text.split("## fairseq defects fixed by the plugin")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [tuple(re.findall(r"`([^`]+)`", row)[:2]) for row in rows]


def test_the_docs_table_lists_exactly_the_fixes_in_their_order():
    assert docs_table() == [(fix.wrap.__name__, fix.replaces) for fix in FIXES]


def test_a_checkpoint_copy_stopped_half_way_leaves_the_old_file_whole(tmp_path):
    """fairseq-train copies each saved checkpoint to checkpoint_last.pt, ...: through
    copy_checkpoints_whole a copy stopped half way (here a KeyboardInterrupt after half the bytes)
    leaves the destination's old bytes and no partial file; a copy that finishes gives the same
    bytes, and fairseq's own PathManager.copy goes through it."""
    from fairseq.file_io import PathManager

    from fairseq_realformer.patches.fixes.checkpoint_files import copy_checkpoints_whole

    new, last = tmp_path / "checkpoint2.pt", tmp_path / "checkpoint_last.pt"
    new.write_bytes(b"new checkpoint " * 1000)
    last.write_bytes(b"old checkpoint")

    def stopped_half_way(src_path, dst_path, overwrite=False):
        with open(src_path, "rb") as src, open(dst_path, "wb") as dst:
            dst.write(src.read()[: new.stat().st_size // 2])
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        copy_checkpoints_whole(stopped_half_way)(str(new), str(last), overwrite=True)
    assert last.read_bytes() == b"old checkpoint" and sorted(p.name for p in tmp_path.iterdir()) == [
        new.name,
        last.name,
    ]
    assert "copy_checkpoints_whole" in " ".join(installed(PathManager.copy))
    assert PathManager.copy(str(new), str(last), overwrite=True)
    assert last.read_bytes() == new.read_bytes() and not (tmp_path / "checkpoint_last.pt.partial").exists()


@pytest.mark.parametrize("fixed", [True, False], ids=["plugin", "fairseq alone"])
def test_a_run_resumed_mid_epoch_trains_that_epoch_on_every_sentence_once(fixed, caplog):
    """A run stopped after 2 updates of epoch 2 (``--save-interval-updates``) and resumed: fairseq
    skips the 2 batches it trained, then serves the rest of the epoch. With the plugin these are
    the uninterrupted run's batches, so the epoch holds every sentence once; fairseq alone builds
    the resumed run's batches anew (seeded by the epoch it resumes at), so the skipped count lands
    elsewhere and sentences repeat while others are never seen that epoch."""
    from fairseq import options, tasks
    from fairseq.tasks.fairseq_task import FairseqTask

    from .test_compat import FIXTURES

    get_batch_iterator = FairseqTask.get_batch_iterator if fixed else FairseqTask.get_batch_iterator.__wrapped__

    def iterator(epoch):  # a new process's task, as fairseq-train makes it (seed 1, 1000 tokens)
        args = options.parse_args_and_arch(
            options.get_training_parser(), [str(FIXTURES / "bin"), "--arch", "transformer", "--seed", "1"]
        )
        task = tasks.setup_task(args)
        task.load_dataset("train")
        dataset = task.dataset("train")
        return dataset, get_batch_iterator(task, dataset, max_tokens=1000, seed=1, epoch=epoch)

    dataset, uninterrupted = iterator(1)
    for _ in uninterrupted.next_epoch_itr():  # epoch 1
        pass
    epoch_2 = uninterrupted.next_epoch_itr()
    trained = [i for _ in range(2) for i in next(epoch_2)["id"].tolist()]  # then the run stops

    with caplog.at_level("INFO", logger="fairseq_realformer.patches.fixes.batching"):
        _, resumed = iterator(2)  # checkpoint_utils.load_checkpoint: get_train_iterator(epoch=2), then the state
    said = "epoch 2: the training batches are built as at epoch 1" in caplog.text
    assert said if fixed else not said
    resumed.load_state_dict({"version": 2, "epoch": 2, "iterations_in_epoch": 2, "shuffle": True})
    rest = resumed.next_epoch_itr()
    assert rest.n == 2 and resumed.epoch == 2
    trained += [i for batch in rest for i in batch["id"].tolist()]
    every_sentence_once = sorted(trained) == list(range(len(dataset)))
    assert every_sentence_once if fixed else not every_sentence_once
