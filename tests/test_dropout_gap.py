"""studies/dropout_gap.py: its dropout-off loss is fairseq-validate's, its dropout-on loss is
reproducible and different, a run folder reads in epoch order, and bad paths get one line."""

import json
import re
import shutil

import pytest

from studies import dropout_gap as gap

from .cli import cli_error, run
from .helpers import USER_DIR
from .test_compat import FIXTURES

CHECKPOINT = FIXTURES / "ckpt-pre-ln" / "checkpoint_last.pt"  # 200 updates, 2+2 layers, dropout on
DATA = FIXTURES / "bin"


@pytest.fixture(scope="module")
def rows():
    return gap.main([str(CHECKPOINT), "--data", str(DATA)])


@pytest.mark.parametrize("name", ["ckpt-pre-ln", "ckpt-admin-profile"])
def test_dropout_off_is_fairseqs_validation_loss(name):
    checkpoint = FIXTURES / name / "checkpoint_last.pt"
    result = run(
        "fairseq-validate",
        DATA,
        "--task",
        "translation",
        "--path",
        checkpoint,
        "--user-dir",
        USER_DIR,
        "--max-tokens",
        "4096",
    )
    fairseq_loss = float(re.search(r"valid on 'valid' subset \| loss ([\d.]+)", result.stdout + result.stderr).group(1))
    ((_, updates, off, _),) = gap.main([str(checkpoint), "--data", str(DATA)])
    assert updates == 200
    assert round(off, 3) == fairseq_loss  # fairseq logs three decimals


def test_dropout_on_is_seeded_and_differs(rows):
    (_, _, off, on), *_ = rows
    assert on != pytest.approx(off, abs=1e-3)
    (_, _, _, again), *_ = gap.main([str(CHECKPOINT), "--data", str(DATA)])
    assert again == on
    (_, _, _, other_seed), *_ = gap.main([str(CHECKPOINT), "--data", str(DATA), "--seed", "2"])
    assert other_seed != on


def test_json_holds_the_printed_rows(rows, tmp_path):
    """--json (what studies/quality.py --dropout-gap keeps in the study's JSON): the same numbers."""
    record_path = tmp_path / "run" / "dropout_gap.json"  # its folder is made
    gap.main([str(CHECKPOINT), "--data", str(DATA), "--json", str(record_path)])
    record = json.loads(record_path.read_text())
    assert (record["subset"], record["seed"]) == ("valid", 1)
    ((checkpoint, updates, off, on),) = rows
    assert record["rows"] == [
        {"checkpoint": str(checkpoint), "updates": updates, "dropout_off": round(off, 4), "dropout_on": round(on, 4)}
    ]
    assert [p.name for p in record_path.parent.iterdir()] == ["dropout_gap.json"]  # no partial file left


def test_a_run_folder_reads_its_epoch_checkpoints_in_order_then_the_average(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    for name in ("checkpoint10.pt", "checkpoint2.pt", "checkpoint_avg.pt", "checkpoint_last.pt"):
        shutil.copy(CHECKPOINT, checkpoints / name)
    (tmp_path / "bin").symlink_to(DATA)
    found = [(f.name, data) for f, data in gap.checkpoints_of(tmp_path, None)]
    bin_dir = tmp_path / "bin"
    assert found == [("checkpoint2.pt", bin_dir), ("checkpoint10.pt", bin_dir), ("checkpoint_avg.pt", bin_dir)]


@pytest.mark.parametrize(
    "argv, names",
    [
        (["missing-run"], "missing-run: no such run folder or checkpoint"),
        ([CHECKPOINT], "a checkpoint file needs --data"),
        ([CHECKPOINT, "--data", "missing-bin"], "missing-bin: no such data folder (--data)"),
        ([CHECKPOINT, "--data", DATA, "--subset", "nope"], "(--subset nope)"),
    ],
)
def test_bad_input_gets_one_line(capsys, argv, names):
    assert names in cli_error(capsys, gap.main, *argv)
