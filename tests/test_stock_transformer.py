"""Loaded, the plugin changes nothing for fairseq's own models but its deliberate fixes: a stock
``transformer`` trained (with EMA), resumed, fine-tuned (``--finetune-from-model``, EMA seeded from
a checkpoint) and averaged gives the same losses, checkpoints and translations with ``--user-dir``
as with fairseq alone, where fairseq's run is right.

fairseq alone cannot load a checkpoint on torch >= 2.6 (``weights_only``): its runs get
TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1, the plugin's run without it. Of the plugin's deliberate
differences (``patches.fixes``), such a run meets two. Keeping the tail of a split that fairseq's
batching drops (``keep_last_batch``) shows in fairseq-generate on the 21 test sentences; fairseq's
training and validation batches hold every sentence of this corpus, which the tests check too.
Resuming on the batches of the run it continues (``same_batches_after_resuming``) shows in the
resumed epoch: with the plugin it is fairseq's uninterrupted run's, bit for bit; fairseq alone
trains it on other batches.
"""

import json
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from fairseq import options, tasks
from fairseq.data import data_utils

from fairseq_realformer.files.checkpoints import read_checkpoint

from .cli import N_TEST, OPTIMIZE, SCRIPTS, TINY, run
from .helpers import USER_DIR
from .interchange import installed_fairseq
from .test_compat import FIXTURES, hypotheses

DATA = FIXTURES / "bin"  # the toy corpus, binarised with a joined dictionary
SIDES = {"fairseq": ([], {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}), "plugin": (["--user-dir", USER_DIR], {})}
TRAIN = [
    DATA,
    *"--arch transformer_iwslt_de_en".split(),
    *TINY,
    *OPTIMIZE,
    *"--store-ema --ema-decay 0.9 --log-format json --log-interval 1".split(),
]
TIMES = ("wall", "train_wall", "ups", "wps", "gb_free")  # what differs from run to run
NOT_COMPARED = {"metrics", "previous_training_time", "cfg"}  # times, and paths (compared apart)


def one_side(work, side):
    """Everything a user does with a stock transformer, with fairseq alone or with the plugin."""
    flags, env = SIDES[side]
    root = work / side
    train, finetune = root / "train", root / "finetune"
    logs = {}

    def fairseq_train(save_dir, *more):
        return run("fairseq-train", *TRAIN, *flags, "--save-dir", save_dir, *more, env=env).stdout

    logs["train"] = fairseq_train(train, "--max-epoch", "2")
    logs["resume"] = fairseq_train(train, "--max-epoch", "3")  # from checkpoint_last.pt
    if side == "fairseq":  # what the resumed run should be: the same three epochs without a stop
        logs["uninterrupted"] = fairseq_train(root / "uninterrupted", "--max-epoch", "3")
    logs["finetune"] = fairseq_train(
        finetune,
        "--max-epoch",
        "1",
        "--finetune-from-model",
        train / "checkpoint2.pt",
        "--ema-seed-model",
        train / "checkpoint2.pt",
    )
    return logs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(work folder, {side: {run: log}}), both sides side by side."""
    work = tmp_path_factory.mktemp("stock")
    with ThreadPoolExecutor(2) as pool:
        futures = {side: pool.submit(one_side, work, side) for side in SIDES}
        logs = {side: future.result() for side, future in futures.items()}
    return work, logs


def logged(log):
    """Every train_inner (each update), train and valid record, in order, without its times."""
    records = []
    for line in log.splitlines():
        for kind in ("train_inner", "train", "valid"):
            if f"| {kind} | " in line:
                record = json.loads(line.split(f"| {kind} | ", 1)[1])
                records.append((kind, {k: v for k, v in record.items() if not k.endswith(TIMES)}))
    return records


def dropped_by_fairseq(split, max_tokens):
    """How many sentences of *split* fairseq's own batching leaves out."""
    task = tasks.setup_task(
        options.parse_args_and_arch(options.get_training_parser(), [str(DATA), "--arch", "transformer"])
    )
    task.load_dataset(split)
    dataset = task.dataset(split)
    indices = dataset.ordered_indices()
    batches = data_utils.batch_by_size.__wrapped__(
        indices,
        dataset.num_tokens,
        max_tokens=max_tokens,
        required_batch_size_multiple=8,
        num_tokens_vec=dataset.num_tokens_vec(indices).astype(np.int64),
    )
    return len(indices) - sum(map(len, batches))


@pytest.mark.parametrize("name", ["train", "resume", "finetune"])
def test_the_same_losses(runs, name):
    """Every update, train and valid record equal fairseq's; resumed, fairseq's run without a stop
    (fairseq alone resumes on other batches: same_batches_after_resuming)."""
    _, logs = runs
    fairseq, plugin = logged(logs["fairseq"][name]), logged(logs["plugin"][name])
    kinds = [kind for kind, _ in fairseq]
    assert (
        kinds.count("train_inner") >= 5
        and "valid" in kinds
        and all("loss" in r for k, r in fairseq if k == "train_inner")
    )
    if name == "resume":
        uninterrupted = logged(logs["fairseq"]["uninterrupted"])
        assert plugin == uninterrupted[-len(plugin) :] and len(uninterrupted) > len(plugin)
        assert [r for k, r in fairseq if k == "train_inner"] != [r for k, r in plugin if k == "train_inner"]
    else:
        assert plugin == fairseq
    assert dropped_by_fairseq("train", 1000) == dropped_by_fairseq("valid", 1000) == 0  # nothing for the fix to keep


def assert_same(a, b, where):
    assert type(a) is type(b), where
    if torch.is_tensor(a):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) - NOT_COMPARED == set(b) - NOT_COMPARED, where
        for key in set(a) - NOT_COMPARED:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, where


@pytest.mark.parametrize(
    "checkpoint",
    [
        "train/checkpoint1.pt",
        "train/checkpoint2.pt",
        "train/checkpoint3.pt",
        "train/checkpoint_best.pt",
        "finetune/checkpoint1.pt",
    ],
)
def test_the_same_checkpoints(runs, checkpoint):
    """Parameters, optimizer state, EMA weights, data position: everything but times and paths.
    The resumed epoch's are fairseq's run without a stop (fairseq alone resumes on other batches)."""
    work, _ = runs
    folder, name = checkpoint.split("/")
    resumed = checkpoint in ("train/checkpoint3.pt", "train/checkpoint_best.pt")
    save_dirs = {
        "fairseq": work / "fairseq" / ("uninterrupted" if resumed else folder),
        "plugin": work / "plugin" / folder,
    }
    fairseq, plugin = (read_checkpoint(save_dirs[side] / name) for side in SIDES)
    if resumed:  # fairseq appends a history entry per session, its scheduler's "best" a step behind
        history = {side: state.pop("optimizer_history") for side, state in (("fairseq", fairseq), ("plugin", plugin))}
        assert [h["num_updates"] for h in history["plugin"]] == [10, 15] == [10, history["fairseq"][-1]["num_updates"]]
    assert fairseq["extra_state"]["ema"] and not torch.equal(  # EMA is on, and not the model itself
        fairseq["extra_state"]["ema"]["decoder.output_projection.weight"],
        fairseq["model"]["decoder.output_projection.weight"],
    )
    assert_same(fairseq, plugin, checkpoint)
    model = {side: vars(state["cfg"]["model"]) for side, state in (("fairseq", fairseq), ("plugin", plugin))}
    for side in model:  # every setting but the folders the two sides write to, and the plugin's folder
        model[side] = {
            k: str(v).replace(str(save_dirs[side]), "SAVE_DIR").replace(str(work / side), "WORK")
            for k, v in model[side].items()
            if k != "user_dir"
        }
    assert model["plugin"] == model["fairseq"]


def test_the_averaged_checkpoint_translates_the_same(runs):
    """The average is the mean of the checkpoints, and fairseq-generate translates with it as
    fairseq alone does, except that fairseq main (default batching) drops the sentences of its
    last batch, which the plugin translates (fairseq #5036; 0.12.2 does not drop them)."""
    work, _ = runs
    average = work / "average.pt"  # of fairseq's own checkpoints, with our script (no fairseq wheel has one)
    run(
        SCRIPTS / "average_checkpoints.py",
        "--inputs",
        work / "fairseq" / "train",
        "--num-epoch-checkpoints",
        "3",
        "--output",
        average,
    )
    sources = [read_checkpoint(work / "fairseq" / "train" / f"checkpoint{epoch}.pt")["model"] for epoch in (1, 2, 3)]
    for name, tensor in read_checkpoint(average)["model"].items():
        torch.testing.assert_close(tensor, sum(s[name] for s in sources) / 3, rtol=1e-6, atol=1e-7)

    def generate(side):
        flags, env = SIDES[side]
        return hypotheses(
            run(
                "fairseq-generate",
                DATA,
                *flags,
                "--path",
                average,
                "--beam",
                "2",
                "--max-len-b",
                "12",
                "--gen-subset",
                "test",
                env=env,
            ).stdout
        )

    with ThreadPoolExecutor(2) as pool:
        fairseq, plugin = pool.map(generate, SIDES)
    dropped = dropped_by_fairseq("test", 12000)  # generate's max-tokens
    assert len(plugin) == 2 * N_TEST and len(fairseq) == 2 * (N_TEST - dropped)
    # fairseq main (ve-fairseq) drops sentences here; 0.12.2 (built from its sdist) predates that
    assert dropped > 0 or installed_fairseq() == "fairseq"
    assert {key: plugin[key] for key in fairseq} == fairseq
