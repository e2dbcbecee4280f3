"""Running fairseq's command-line tools and the project's scripts the way a user does, on a toy
corpus."""

import importlib.util
import os
import random
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from common import fairseq_log

from . import cpu_report
from .helpers import REPO, USER_DIR

BIN = Path(sys.executable).parent
SCRIPTS = Path(REPO) / "scripts"
STUDIES = Path(REPO) / "studies"
N_TEST = 21  # not a multiple of 8: fairseq's batching would drop sentences without our fix
TINY = (
    "--encoder-embed-dim 32 --encoder-ffn-embed-dim 64 --encoder-attention-heads 2 --encoder-layers 2 "
    "--decoder-embed-dim 32 --decoder-ffn-embed-dim 64 --decoder-attention-heads 2 --decoder-layers 2 "
    "--share-all-embeddings"
).split()
# how every tiny training of the tests learns: Adam, inverse-sqrt warm-up, label smoothing, seed 1
OPTIMIZE = (
    "--optimizer adam --adam-betas (0.9,0.98) --lr 2e-3 --lr-scheduler inverse_sqrt --warmup-updates 10 "
    "--criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 1000 --seed 1 --num-workers 0"
).split()
TRAIN = [
    "--user-dir",
    USER_DIR,  # a path: it may hold spaces
    *"--arch realformer_iwslt_de_en".split(),
    *TINY,
    *OPTIMIZE,
    *"--log-format json --log-interval 5".split(),
    # --eval-bleu puts numpy metrics into the checkpoints, which must load safely too
    "--eval-bleu",
    "--eval-bleu-args",
    '{"beam": 1, "max_len_a": 1.2, "max_len_b": 10}',
    *"--best-checkpoint-metric bleu --maximize-best-checkpoint-metric".split(),
]


def clean_env():
    """The user's environment without torch.load overrides (checkpoints must load as shipped),
    the environment's own tools first on PATH, and one OpenMP thread per process unless set:
    these models are tiny, and spinning threads on cores that other tests use slow training
    down many times over. Where the suite forces what PyTorch reports of the CPU
    (REALFORMER_TEST_BF16_UNITS), the commands see the same report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FORCE", "REALFORMER_"))}
    if (Path(sys.prefix) / ".fairseq-realformer-setup").exists():
        # an environment scripts/setup_env.sh made (REALFORMER_VENV=DIR scripts/test.sh): the
        # scripts that set one up (quickstart.sh) use it, not .venv
        env["REALFORMER_VENV"] = sys.prefix
    if cpu_report.forced():  # the suite runs as on another CPU: so do the commands it starts
        env.update(cpu_report.environment(cpu_report.forced()))
    return {"OMP_NUM_THREADS": "1", **env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "PYTHON": sys.executable}


def command(program, *args):
    """A console script of the environment by name (fairseq-train, ...), or a .sh / .py file."""
    program = str(program)
    if program.endswith(".sh"):
        return ["bash", program, *map(str, args)]
    if program.endswith(".py"):
        return [sys.executable, program, *map(str, args)]
    return [str(BIN / program), *map(str, args)]


def run(program, *args, cwd=REPO, stdin=None, check=True, timeout=900, env=None):
    """Run *program* as a user does (see ``command``), in a clean environment (plus *env*); with
    *check*, a failure raises with the end of its output."""
    result = subprocess.run(
        command(program, *args),
        cwd=cwd,
        env={**clean_env(), **(env or {})},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{program} failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
    return result


def load_script(name):
    """scripts/NAME.py as a module, to call its main in-process (benchmarks/ and studies/ are
    packages: their modules are imported as such)."""
    if str(SCRIPTS) not in sys.path:  # as when run as a file: scripts/ is no package, its modules import each other
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train_and_average(work: Path, data: Path, *argv, epochs: int = 2) -> str:
    """fairseq-train *argv* on *data* in *work* (saving to ``ckpt``), then its *epochs* epoch
    checkpoints averaged into ``ckpt/avg.pt`` by scripts/average_checkpoints.py: the training log."""
    result = run("fairseq-train", data, *argv, cwd=work)
    load_script("average_checkpoints").main(
        [
            "--inputs",
            str(work / "ckpt"),
            "--num-epoch-checkpoints",
            str(epochs),
            "--output",
            str(work / "ckpt" / "avg.pt"),
        ]
    )
    return result.stdout + result.stderr


def translate_with_the_average(work: Path, data: Path):
    """fairseq-interactive (beam 4) and the hub API translate with ``work/ckpt/avg.pt`` (a model
    of the toy corpus, languages src and tgt): the hub's model, to check its options."""
    flags = ["--user-dir", USER_DIR, "--path", "ckpt/avg.pt", "--beam", "4", "--source-lang", "src"]
    result = run("fairseq-interactive", data, *flags, "--target-lang", "tgt", cwd=work, stdin="s1 s2 s3\ns4 s5\n")
    assert len(re.findall(r"^H-\d+\t", result.stdout, re.M)) == 2, result.stderr[-2000:]

    import torch

    from fairseq_realformer.models.realformer import RealformerModel

    hub = RealformerModel.from_pretrained(
        str(work / "ckpt"), checkpoint_file="avg.pt", data_name_or_path=str(data)
    ).eval()
    hypothesis = hub.generate(hub.encode("s1 s2 s3 s4"), beam=4)[0]
    assert torch.isfinite(hypothesis["positional_scores"]).all() and len(hypothesis["tokens"]) > 0
    return hub.models[0]


def cli_error(capsys, main, *argv):
    """Run a script's main in-process; return its one-line error (it must exit with status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in argv])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) >= 1 and "Traceback" not in "\n".join(lines)
    return lines[-1]


def popen(program, *args, cwd, env=None):
    """Start *program* as ``run`` does (*env* added), without waiting; stderr goes into stdout. Ctrl-C (SIGINT)
    reaches it as a user's would: a suite started in the background by a shell (``cmd &``) ignores
    SIGINT, and a child inherits that, so it is set back to the default for the program."""
    return subprocess.Popen(
        command(program, *args),
        cwd=cwd,
        env={**clean_env(), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def write_corpus(folder: Path, seed: int = 0):
    """A toy language pair: target word i translates source word i."""
    rng = random.Random(seed)
    for split, count in (("train", 600), ("valid", 40), ("test", N_TEST)):
        with open(folder / f"{split}.src", "w") as src, open(folder / f"{split}.tgt", "w") as tgt:
            for _ in range(count):
                words = [rng.randrange(12) for _ in range(rng.randint(3, 8))]
                src.write(" ".join(f"s{i}" for i in words) + "\n")
                tgt.write(" ".join(f"t{i}" for i in words) + "\n")


def preprocess(work: Path) -> None:
    """Write the toy corpus into *work* and binarise it into work/bin (joined dictionary)."""
    write_corpus(work)
    run(
        Path(REPO) / "scripts" / "binarize.py",
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--trainpref",
        "train",
        "--validpref",
        "valid",
        "--testpref",
        "test",
        "--destdir",
        "bin",
        "--workers",
        "1",
        cwd=work,
    )


def train_losses(log: str):
    """The training loss of every interval fairseq-train logged (common/fairseq_log.py reads it)."""
    return [fields["loss"] for _, fields in fairseq_log.records(log.splitlines(), "train_inner")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
