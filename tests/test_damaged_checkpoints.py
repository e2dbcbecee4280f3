"""A checkpoint that is missing, empty, cut short, not a torch file, or a torch file that is not a
fairseq checkpoint: every entry point names the file and what is wrong with it in one line.

Each kind of damage is tried at each entry point in-process, through the function the entry point
calls (fast); each command-line tool then shows once, in a subprocess, that the message reaches the
user as one line on stderr with a non-zero exit and no traceback.
"""

import copy

import pytest
import torch
from fairseq import checkpoint_utils, options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.trainer import Trainer

from fairseq_realformer.files.checkpoints import DamagedCheckpointError, read_checkpoint
from fairseq_realformer.models.realformer import RealformerModel

from .cli import N_TEST, TRAIN, cli_error, load_script, run
from .helpers import USER_DIR
from .test_compat import FIXTURES

DATA = FIXTURES / "bin"  # the toy corpus, binarised
SOUND = FIXTURES / "ckpt-pre-ln" / "checkpoint_last.pt"  # a real fairseq-train checkpoint
NAME = "checkpoint_last.pt"  # each damaged file is the checkpoint_last.pt of its own folder

average_checkpoints = load_script("average_checkpoints")
score = load_script("score")


def _bare_state_dict(path):
    torch.save(read_checkpoint(SOUND)["model"], path)


DAMAGE = {  # how each kind is made
    "missing": None,
    "empty": lambda path: path.write_bytes(b""),
    "truncated": lambda path: path.write_bytes(SOUND.read_bytes()[:100_000]),  # an interrupted copy
    "text": lambda path: path.write_text("hello\n"),
    "not fairseq": _bare_state_dict,
}


def told(kind, path):
    """What the user is told about a damaged *path*."""
    unreadable = f"{path} is not a readable torch checkpoint"
    n_tensors = len(read_checkpoint(SOUND)["model"])
    return {
        "missing": f"{path}: no such checkpoint file",
        "empty": f"{unreadable}: it is empty (0 bytes), as an interrupted save or copy leaves it",
        "truncated": f"{unreadable}: it is truncated, a torch zip archive cut short at 100000 bytes (an interrupted save or copy?)",
        "text": f"{unreadable}: torch.save did not write it (6 bytes starting b'hello\\n')",
        "not fairseq": f"{path} is a torch file but not a fairseq checkpoint (no 'model' with its 'cfg'): it holds "
        f"a dict of {n_tensors} tensors only (a model's bare state_dict?)",
    }[kind]


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """{kind: path of the damaged checkpoint_last.pt in a folder of its own}, made once."""
    root = tmp_path_factory.mktemp("damaged")
    paths = {}
    for kind, make in DAMAGE.items():
        folder = root / kind.replace(" ", "_")
        folder.mkdir()
        paths[kind] = folder / NAME
        if make is not None:
            make(paths[kind])
    return paths


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """fairseq-train's Trainer for the toy data, built as fairseq_cli.train.main builds it."""
    save_dir = tmp_path_factory.mktemp("save")
    args = options.parse_args_and_arch(options.get_training_parser(), [str(DATA), *TRAIN, "--save-dir", str(save_dir)])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    return Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))


def load_checkpoint(trainer, **checkpoint_flags):
    """What fairseq-train does with its checkpoint flags: checkpoint_utils.load_checkpoint."""
    cfg = copy.deepcopy(trainer.cfg.checkpoint)
    for name, value in checkpoint_flags.items():
        setattr(cfg, name, value)
    return checkpoint_utils.load_checkpoint(cfg, trainer)


# --- every kind of damage at every entry point, in-process ---------------------------------------


@pytest.mark.parametrize("kind", DAMAGE)
def test_generate_and_interactive(damaged, kind):
    """fairseq-generate and fairseq-interactive load --path through load_model_ensemble."""
    with pytest.raises(DamagedCheckpointError) as error:
        checkpoint_utils.load_model_ensemble([str(damaged[kind])])
    assert str(error.value) == told(kind, damaged[kind])
    assert isinstance(error.value, OSError) == (kind == "missing")  # as fairseq's own error for it


@pytest.mark.parametrize("kind", DAMAGE)
def test_hub_from_pretrained(damaged, kind):
    with pytest.raises(DamagedCheckpointError) as error:
        RealformerModel.from_pretrained(str(damaged[kind].parent), checkpoint_file=NAME, data_name_or_path=str(DATA))
    assert str(error.value) == told(kind, damaged[kind])


def test_hub_from_pretrained_names_a_missing_folder(tmp_path):
    with pytest.raises(ValueError, match=f"^from_pretrained: model_name_or_path {tmp_path / 'nope'}: no such folder$"):
        RealformerModel.from_pretrained(str(tmp_path / "nope"), checkpoint_file=NAME, data_name_or_path=str(DATA))
    with pytest.raises(ValueError, match=f"^from_pretrained: data_name_or_path {tmp_path / 'nope'}: no such folder$"):
        RealformerModel.from_pretrained(
            str(SOUND.parent), checkpoint_file=NAME, data_name_or_path=str(tmp_path / "nope")
        )


@pytest.mark.parametrize("kind", DAMAGE)
def test_train_restore_file(trainer, damaged, kind):
    path = str(damaged[kind])
    with pytest.raises(ValueError) as error:
        load_checkpoint(trainer, restore_file=path)
    if kind == "missing":  # fairseq would train from scratch without a word
        assert (
            str(error.value)
            == f"--restore-file {path}: no such checkpoint file (fairseq-train would train from scratch)"
        )
    else:
        assert isinstance(error.value, DamagedCheckpointError) and str(error.value) == told(kind, path)


@pytest.mark.parametrize("kind", DAMAGE)
def test_train_finetune_from_model(trainer, damaged, kind):
    """A first launch (no checkpoint_last.pt in the save dir) starts from --finetune-from-model."""
    path = str(damaged[kind])
    with pytest.raises(ValueError) as error:
        load_checkpoint(trainer, finetune_from_model=path)
    if kind == "missing":
        assert str(error.value) == f"--finetune-from-model {path}: no such checkpoint file"
    else:
        assert isinstance(error.value, DamagedCheckpointError) and str(error.value) == told(kind, path)


@pytest.mark.parametrize("kind", [kind for kind in DAMAGE if kind != "missing"])
def test_train_resuming_from_the_save_dir(trainer, damaged, kind):
    with pytest.raises(DamagedCheckpointError) as error:
        load_checkpoint(trainer, save_dir=str(damaged[kind].parent))
    assert str(error.value) == told(kind, damaged[kind])


def test_a_save_dir_without_checkpoint_last_is_a_first_launch(trainer, damaged):
    _, epoch_itr = load_checkpoint(trainer, save_dir=str(damaged["missing"].parent))
    assert epoch_itr.epoch == 1


@pytest.mark.parametrize("kind", DAMAGE)
def test_average_checkpoints(damaged, kind, capsys, tmp_path):
    path = damaged[kind]
    error = cli_error(capsys, average_checkpoints.main, "--inputs", SOUND, path, "--output", tmp_path / "avg.pt")
    expected = f"--inputs {path}: no such file" if kind == "missing" else told(kind, path)
    assert error == f"average_checkpoints.py: error: {expected}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", DAMAGE)
def test_score(damaged, kind, capsys, tmp_path):
    """Refused before translating; nothing written."""
    reference = tmp_path / "ref.tgt"
    reference.write_text("t1\n" * N_TEST)
    error = cli_error(
        capsys,
        score.main,
        "--data",
        DATA,
        "--checkpoint",
        damaged[kind],
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--reference",
        reference,
        "--output-dir",
        tmp_path / "out",
    )
    assert error == f"score.py: error: --checkpoint {told(kind, damaged[kind])}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref.tgt"]


# --- each command-line tool: one line on stderr, non-zero exit, no traceback ---------------------


def assert_one_line_error(result, expected):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == expected


def test_fairseq_generate_names_a_truncated_checkpoint(damaged):
    result = run("fairseq-generate", DATA, "--user-dir", USER_DIR, "--path", damaged["truncated"], check=False)
    assert_one_line_error(result, f"fairseq-generate: error: {told('truncated', damaged['truncated'])}")


def test_fairseq_interactive_names_an_empty_checkpoint(damaged):
    result = run(
        "fairseq-interactive", DATA, "--user-dir", USER_DIR, "--path", damaged["empty"], stdin="s1 s2\n", check=False
    )
    assert_one_line_error(result, f"fairseq-interactive: error: {told('empty', damaged['empty'])}")


def test_fairseq_train_names_a_missing_restore_file(damaged, tmp_path):
    path = damaged["missing"]
    result = run("fairseq-train", DATA, *TRAIN, "--save-dir", tmp_path, "--restore-file", path, check=False)
    assert_one_line_error(
        result,
        f"fairseq-train: error: --restore-file {path}: no such checkpoint file "
        f"(fairseq-train would train from scratch)",
    )
    assert not list(tmp_path.glob("*.pt"))


def test_fairseq_train_names_a_missing_finetune_model(damaged, tmp_path):
    path = damaged["missing"]
    result = run("fairseq-train", DATA, *TRAIN, "--save-dir", tmp_path, "--finetune-from-model", path, check=False)
    assert_one_line_error(result, f"fairseq-train: error: --finetune-from-model {path}: no such checkpoint file")
    assert not list(tmp_path.glob("*.pt"))


def test_fairseq_train_names_a_save_dir_checkpoint_that_is_not_fairseqs(damaged):
    save_dir = damaged["not fairseq"].parent
    result = run("fairseq-train", DATA, *TRAIN, "--save-dir", save_dir, check=False)
    assert_one_line_error(result, f"fairseq-train: error: {told('not fairseq', save_dir / NAME)}")
