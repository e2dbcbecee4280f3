"""What a tiny RealFormer checkpoint gives under the installed fairseq, for
``tests/test_fairseq_interchange.py``: translations (fairseq-generate, fairseq-interactive, the
hub, scripts/score.py), the average of two checkpoints, the attention statistics of
realformer-analyze and the losses of training resumed from it.

The fixtures in tests/data/across-fairseqs/FAIRSEQ were made with ``make`` under each fairseq
(README there); the test computes ``outcomes`` under the installed one and compares.

    python -m tests.interchange OUT_DIR     # train the model into OUT_DIR, write OUT_DIR/expected.json
"""

import importlib.metadata as md
import json
import re
import shutil
import sys
from pathlib import Path

from .cli import SCRIPTS, TRAIN, run, train_losses, write_corpus
from .helpers import USER_DIR

DATA = Path(__file__).parent / "data"
BIN = DATA / "compat-0.1.0" / "bin"  # the toy corpus of tests/cli.py, binarised (its README)
# the fixtures, by the distribution of the fairseq each was made under
FIXTURES = {
    "ve-fairseq": DATA / "across-fairseqs" / "ve-fairseq-0.12.3",
    "fairseq": DATA / "across-fairseqs" / "fairseq-0.12.2",
}
UPDATES = 200  # trained (40 epochs of 5 updates); the last 2 epochs' checkpoints are averaged
RESUMED = 4  # more updates, from checkpoint_last.pt
SMALL = "--encoder-embed-dim 16 --decoder-embed-dim 16 --encoder-ffn-embed-dim 32 --decoder-ffn-embed-dim 32".split()
FLAGS = [*SMALL, "--lr", "5e-3", "--keep-last-epochs", "2", "--log-interval", "1"]
SENTENCES = "s1 s2 s3\ns4 s5\ns7 s7 s0 s11\n"


def train(save_dir: Path, max_update: int, cwd: Path, *extra: str) -> str:
    """fairseq-train's log: the quickstart's model (realformer_iwslt_de_en), tiny."""
    result = run(
        "fairseq-train", BIN, *TRAIN, "--max-update", str(max_update), "--save-dir", save_dir, *FLAGS, *extra, cwd=cwd
    )
    return result.stdout + result.stderr


def make(out: Path) -> None:
    """Train under the installed fairseq into *out*, and record what it gives there."""
    out.mkdir(parents=True, exist_ok=True)
    train(out / "checkpoints", UPDATES, out)
    for extra in ("checkpoint_best.pt", "checkpoint_last.pt"):
        (out / "checkpoints" / extra).unlink()  # copies of the epoch checkpoints: not in the repository
    (out / "expected.json").write_text(json.dumps(outcomes(out, out / "work"), indent=1) + "\n")
    shutil.rmtree(out / "work")


def outcomes(fixture: Path, work: Path) -> dict:
    """Everything done with the fixture's checkpoints under the installed fairseq, in *work*."""
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / "checkpoints"
    shutil.copytree(fixture / "checkpoints", ckpt, dirs_exist_ok=True)
    last = last_checkpoint(ckpt)
    shutil.copy(last, ckpt / "checkpoint_last.pt")  # what fairseq-train resumes from
    found = {}
    generate = run("fairseq-generate", BIN, "--user-dir", USER_DIR, "--path", last, "--beam", "4", "--max-len-b", "12")
    found["generate"] = translation_lines(generate.stdout)
    interactive = run(
        *("fairseq-interactive", BIN, "--user-dir", USER_DIR, "--path", last, "--beam", "4"),
        *("--source-lang", "src", "--target-lang", "tgt", "--max-len-b", "12"),
        stdin=SENTENCES,
    )
    found["interactive"] = translation_lines(interactive.stdout)
    found["hub"] = run(sys.executable, "-c", HUB, ckpt, last.name, BIN, SENTENCES).stdout.strip().splitlines()
    run(
        SCRIPTS / "average_checkpoints.py",
        *("--inputs", ckpt, "--num-epoch-checkpoints", "2", "--output", ckpt / "checkpoint_avg.pt"),
    )
    write_corpus(work)  # the test set's target side as text: score.py's reference
    score = run(
        SCRIPTS / "score.py",
        *("--data", BIN, "--checkpoint", ckpt / "checkpoint_avg.pt", "--user-dir", USER_DIR),
        *("--source-lang", "src", "--target-lang", "tgt", "--reference", work / "test.tgt"),
        *("--bpe", "none", "--detok", "none", "--beam", "4", "--output-dir", work / "score"),
    )
    found["average_score"] = score.stdout.strip().splitlines()[-1]
    found["average_hypotheses"] = (work / "score" / "test.hyp.tgt").read_text().splitlines()
    analysis = work / "analysis.json"
    run(
        *("realformer-analyze", BIN, "--checkpoints", last, "--max-sentences", "8", "--cpu"),
        *("--json", analysis, "--out", work / "figures"),
    )
    found["analysis"] = _rounded(json.loads(analysis.read_text()))
    log = train(ckpt, UPDATES + RESUMED, work, "--no-save")
    assert f"Loaded checkpoint {ckpt / 'checkpoint_last.pt'}" in log, log[-2000:]
    found["resume_losses"] = [f"{loss:g}" for loss in train_losses(log)]
    return found


def installed_fairseq() -> str:
    """The distribution of the installed fairseq: "ve-fairseq", or "fairseq" (0.12.2, built)."""
    for dist in md.distributions():
        if "fairseq/__init__.py" in [str(f) for f in dist.files or []]:
            return dist.metadata["Name"].lower()
    raise ImportError("no fairseq installed")


def fixture_made_under(fairseq: str) -> Path:
    return FIXTURES[fairseq]


def last_checkpoint(folder: Path) -> Path:
    """The last epoch's checkpoint in *folder* (checkpointN.pt)."""
    return max(folder.glob("checkpoint[0-9]*.pt"), key=lambda path: int(path.stem[len("checkpoint") :]))


# the hub interface: from_pretrained, then translate each line of argv[4]
HUB = """
import sys
from fairseq_realformer.models.realformer import RealformerModel
model = RealformerModel.from_pretrained(sys.argv[1], checkpoint_file=sys.argv[2], data_name_or_path=sys.argv[3],
                                        beam=4, max_len_b=12).eval()
for line in sys.argv[4].splitlines():
    print(model.translate(line))
"""


def translation_lines(stdout: str):
    """fairseq's H-lines (and the S-lines that interactive numbers them by), scores to 4 places."""
    lines = []
    for kind, i, rest in re.findall(r"^([SH])-(\d+)\t(.*)$", stdout, re.M):
        if kind == "H":
            score, text = rest.split("\t")
            rest = f"{float(score):.4f}\t{text}"
        lines.append(f"{kind}-{i}\t{rest}")
    return sorted(lines)


# how finely numbers are printed: the H-lines' scores (translation_lines), the losses fairseq logs,
# realformer-analyze's medians (a histogram's bins, RESOLUTION); by outcome (the rest is text)
SCORE_DIGIT, LOSS_DIGIT, MEDIAN_BIN = 1e-4, 1e-3, 1e-3
PRINTED = {"generate": SCORE_DIGIT, "interactive": SCORE_DIGIT, "analysis": MEDIAN_BIN, "resume_losses": LOSS_DIGIT}
_NUMBER = re.compile(r"-?\d+\.\d+")


def assert_same_as_printed(got, want, unit=None, where="") -> None:
    """*got* is *want* (lists, dicts, strings, numbers), except that a number printed to *unit*
    may be one unit off: the same value computed by another CPU's kernels, rounded by float32
    differently in its last bits, may round to the neighbouring printed value. Words and counts
    are equal."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for key in want:
            assert_same_as_printed(got[key], want[key], unit, f"{where}/{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same_as_printed(g, w, unit, f"{where}[{i}]")
    elif unit is not None and isinstance(want, str) and _NUMBER.search(want):
        assert _NUMBER.split(got) == _NUMBER.split(want), (where, got, want)
        for g, w in zip(_NUMBER.findall(got), _NUMBER.findall(want)):
            assert abs(float(g) - float(w)) <= 1.5 * unit, (where, got, want)  # 0 or 1 unit apart
    elif unit is not None and isinstance(want, float):
        assert abs(float(got) - want) <= 1.5 * unit, (where, got, want)
    else:
        assert got == want, (where, got, want)


def _rounded(value):
    """realformer-analyze's statistics to 4 decimals: what a checkpoint computes, not float noise."""
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items() if k not in ("checkpoint", "checkpoints", "out", "json")}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


if __name__ == "__main__":
    make(Path(sys.argv[1]))
