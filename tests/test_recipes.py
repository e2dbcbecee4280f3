"""The recipes as a user runs them: checkpoint averaging, scoring, the quickstart and Multi30k."""

import ast
import gzip
import json
import re
import shlex
import shutil
import signal
import time
from pathlib import Path

import pytest
import sacrebleu
import torch

from common.host import cpu_model
from fairseq_realformer.files.checkpoints import read_checkpoint as load_checkpoint
from studies import quality, recipe, scoring
from studies.runs import Run, RunFolder
from studies.study import StudyRecord

from .cli import N_TEST, SCRIPTS, cli_error, load_script, popen, run
from .helpers import REPO, build_model, parse_args
from .test_compat import FIXTURES

MULTI30K = Path(REPO).parent / "shared" / "data" / "multi30k"
RUN_SECONDS = 300  # on 2 busy cores (2026-11-27), half of it the real-data study: tests/conftest.py starts it first

average_checkpoints = load_script("average_checkpoints")
score = load_script("score")


# --- average_checkpoints.py ---------------------------------------------------------------------


def save_checkpoint(path, seed, arch="realformer_iwslt_de_en", flags=(), dtype=torch.float32, epoch=1):
    """A checkpoint laid out as fairseq's trainer saves one (argparse model config, model state,
    optimizer history, extra state), holding a tiny model drawn from *seed*."""
    args = parse_args(arch, *flags)
    params = {
        k: (v.to(dtype) if v.is_floating_point() else v)
        for k, v in build_model(arch, *flags, seed=seed).state_dict().items()
    }
    torch.save(
        {
            "args": None,
            "cfg": {"_name": None, "model": args, "task": {"_name": "translation", "data": "/no/data"}},
            "model": params,
            "criterion": None,
            "optimizer_history": [
                {
                    "criterion_name": "LabelSmoothedCrossEntropyCriterion",
                    "optimizer_name": "FairseqAdam",
                    "lr_scheduler_state": {"best": 3.0},
                    "num_updates": 10 * epoch,
                }
            ],
            "task_state": {},
            "extra_state": {"train_iterator": {"epoch": epoch}, "previous_training_time": 1.5},
            "last_optimizer_state": {"state": {}, "param_groups": [{"lr": 1e-3}]},
        },
        path,
    )
    return params


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_average_is_the_elementwise_mean_of_the_last_epochs(tmp_path, dtype):
    params = {
        e: save_checkpoint(tmp_path / f"checkpoint{e}.pt", seed=e, dtype=dtype, epoch=e) for e in (1, 2, 3, 4, 10)
    }
    out = tmp_path / "avg.pt"
    # --checkpoint-upper-bound 4: epoch 10 is left out, so the last 3 are epochs 2, 3, 4
    average_checkpoints.main(
        [
            "--inputs",
            str(tmp_path),
            "--num-epoch-checkpoints",
            "3",
            "--checkpoint-upper-bound",
            "4",
            "--output",
            str(out),
        ]
    )
    averaged = load_checkpoint(out)
    assert averaged["model"].keys() == params[4].keys()
    tolerance = {torch.float32: 1e-6, torch.float16: 1e-3}[dtype]
    for name, value in averaged["model"].items():
        expected = sum(params[e][name].double() for e in (2, 3, 4)) / 3
        assert value.dtype == params[4][name].dtype, name
        torch.testing.assert_close(value.double(), expected, atol=tolerance, rtol=tolerance, msg=name)
    assert averaged["extra_state"]["train_iterator"]["epoch"] == 4  # the rest is the newest one's
    assert averaged["cfg"]["model"].arch == "realformer_iwslt_de_en"


def test_average_of_update_checkpoints_and_explicit_files(tmp_path):
    a = save_checkpoint(tmp_path / "checkpoint_1_100.pt", seed=1)
    b = save_checkpoint(tmp_path / "checkpoint_2_200.pt", seed=2)
    save_checkpoint(tmp_path / "checkpoint_1_50.pt", seed=3)
    average_checkpoints.main(
        ["--inputs", str(tmp_path), "--num-update-checkpoints", "2", "--output", str(tmp_path / "u.pt")]
    )
    average_checkpoints.main(
        [
            "--inputs",
            str(tmp_path / "checkpoint_1_100.pt"),
            str(tmp_path / "checkpoint_2_200.pt"),
            "--output",
            str(tmp_path / "f.pt"),
        ]
    )
    for out in ("u.pt", "f.pt"):
        averaged = load_checkpoint(tmp_path / out)["model"]
        for name in a:
            torch.testing.assert_close(averaged[name], (a[name] + b[name]) / 2, msg=name)


MISMATCHES = {
    "shape": (
        dict(flags=("--encoder-ffn-embed-dim", "48")),
        r"encoder\.layers\.0\.fc1\.weight has shape \(32, 16\) in the first, \(48, 16\) in the second",
    ),
    "keys": (dict(flags=("--encoder-layers", "2")), r"parameters only in the first: \['encoder\.layers\.2\."),
    "arch": (
        dict(arch="admin_iwslt_de_en"),
        r"arch is 'realformer_iwslt_de_en' in the first, 'admin_iwslt_de_en' in the second",
    ),
    "flag": (
        dict(flags=("--residual-attention-mode", "sum")),
        r"residual_attention_mode is 'mean' in the first, 'sum' in the second",
    ),
}


@pytest.mark.parametrize("mismatch", MISMATCHES)
def test_average_refuses_checkpoints_of_different_models(tmp_path, capsys, mismatch):
    other, expected = MISMATCHES[mismatch]
    save_checkpoint(tmp_path / "a.pt", seed=1)
    save_checkpoint(tmp_path / "b.pt", seed=2, **other)
    error = cli_error(
        capsys,
        average_checkpoints.main,
        "--inputs",
        tmp_path / "a.pt",
        tmp_path / "b.pt",
        "--output",
        tmp_path / "avg.pt",
    )
    assert error.startswith(
        f"average_checkpoints.py: error: {tmp_path / 'a.pt'} and {tmp_path / 'b.pt'} are checkpoints of different models"
    )
    assert re.search(expected, error), error
    assert not (tmp_path / "avg.pt").exists() and not list(tmp_path.glob(".average_checkpoints.*"))


def test_average_command_line_error_is_one_line(tmp_path):
    save_checkpoint(tmp_path / "a.pt", seed=1)
    save_checkpoint(tmp_path / "b.pt", seed=2, arch="admin_iwslt_de_en")
    result = run(
        SCRIPTS / "average_checkpoints.py",
        "--inputs",
        tmp_path / "a.pt",
        tmp_path / "b.pt",
        "--output",
        tmp_path / "avg.pt",
        check=False,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("average_checkpoints.py: error: ")


def test_average_never_overwrites_an_input(tmp_path, capsys):
    for e in (1, 2):
        save_checkpoint(tmp_path / f"checkpoint{e}.pt", seed=e)
    before = (tmp_path / "checkpoint2.pt").read_bytes()
    error = cli_error(
        capsys,
        average_checkpoints.main,
        "--inputs",
        tmp_path,
        "--num-epoch-checkpoints",
        "2",
        "--output",
        tmp_path / "checkpoint2.pt",
        "--force",
    )
    assert (
        error
        == f"average_checkpoints.py: error: --output {tmp_path / 'checkpoint2.pt'} is one of the inputs; choose another file"
    )
    assert (tmp_path / "checkpoint2.pt").read_bytes() == before

    (tmp_path / "avg.pt").write_bytes(b"precious")
    error = cli_error(
        capsys,
        average_checkpoints.main,
        "--inputs",
        tmp_path,
        "--num-epoch-checkpoints",
        "2",
        "--output",
        tmp_path / "avg.pt",
    )
    assert error.endswith("exists; add --force to replace it")
    assert (tmp_path / "avg.pt").read_bytes() == b"precious"
    average_checkpoints.main(
        ["--inputs", str(tmp_path), "--num-epoch-checkpoints", "2", "--output", str(tmp_path / "avg.pt"), "--force"]
    )
    assert "model" in load_checkpoint(tmp_path / "avg.pt")


def test_average_names_the_missing_file_or_flag(tmp_path, capsys):
    save_checkpoint(tmp_path / "checkpoint1.pt", seed=1)
    error = cli_error(
        capsys,
        average_checkpoints.main,
        "--inputs",
        tmp_path / "checkpoint1.pt",
        tmp_path / "nope.pt",
        "--output",
        tmp_path / "avg.pt",
    )
    assert error == f"average_checkpoints.py: error: --inputs {tmp_path / 'nope.pt'}: no such file"
    error = cli_error(
        capsys,
        average_checkpoints.main,
        "--inputs",
        tmp_path,
        "--num-epoch-checkpoints",
        "2",
        "--output",
        tmp_path / "avg.pt",
    )
    assert error == (
        f"average_checkpoints.py: error: --num-epoch-checkpoints 2: {tmp_path} holds only 1 epoch "
        f"checkpoints (checkpointE.pt)"
    )
    updates = tmp_path / "updates"  # what --save-interval-updates 50 --no-epoch-checkpoints leaves
    updates.mkdir()
    for update in (50, 100, 150):
        save_checkpoint(updates / f"checkpoint_1_{update}.pt", seed=update)
    error = cli_error(
        capsys,
        average_checkpoints.main,
        "--inputs",
        updates,
        "--num-epoch-checkpoints",
        "25",
        "--output",
        tmp_path / "avg.pt",
    )
    assert error == (
        f"average_checkpoints.py: error: --num-epoch-checkpoints 25: {updates} holds 0 epoch checkpoints "
        f"(checkpointE.pt) but 3 update checkpoints (checkpoint_E_U.pt): use --num-update-checkpoints"
    )
    error = cli_error(
        capsys,
        average_checkpoints.main,
        "--inputs",
        updates,
        "--num-update-checkpoints",
        "2",
        "--checkpoint-upper-bound",
        "40",
        "--output",
        tmp_path / "avg.pt",
    )
    assert error == (
        f"average_checkpoints.py: error: --num-update-checkpoints 2: {updates} holds only 0 update "
        f"checkpoints (checkpoint_E_U.pt) numbered <= --checkpoint-upper-bound 40"
    )
    (tmp_path / "broken.pt").write_bytes(b"not a checkpoint")
    error = cli_error(
        capsys,
        average_checkpoints.main,
        "--inputs",
        tmp_path / "checkpoint1.pt",
        tmp_path / "broken.pt",
        "--output",
        tmp_path / "avg.pt",
    )
    assert error.startswith(
        f"average_checkpoints.py: error: {tmp_path / 'broken.pt'} is not a readable torch checkpoint"
    )


# --- score.py -------------------------------------------------------------------------------------

HYPOTHESES = [
    'Ein Computer-Spiel, das "gut" ist.',
    "Zwei Männer spielen Fußball im Park.",
    "Die Frau-Mann-Gruppe sitzt beim A-B-C-Test.",
    "Ein Hund läuft durch den Schnee!",
]
REFERENCES = [
    "Ein Computer-Spiel ist gut.",
    "Zwei Männer spielen im Park Fußball.",
    "Die Frau-Mann-Gruppe sitzt draußen.",
    "Ein schwarzer Hund rennt durch den Schnee.",
]
# the same, compound-split as fairseq's perl one-liner splits them (its output, pasted): matches
# do not overlap, so "A-B-C-Test" keeps "B-C"
SPLIT_HYPOTHESES = [
    'Ein Computer ##AT##-##AT## Spiel, das "gut" ist.',
    HYPOTHESES[1],
    "Die Frau ##AT##-##AT## Mann ##AT##-##AT## Gruppe sitzt beim A ##AT##-##AT## B-C ##AT##-##AT## Test.",
    HYPOTHESES[3],
]
SPLIT_REFERENCES = [
    "Ein Computer ##AT##-##AT## Spiel ist gut.",
    REFERENCES[1],
    "Die Frau ##AT##-##AT## Mann ##AT##-##AT## Gruppe sitzt draußen.",
    REFERENCES[3],
]


def reported(stdout, label):
    """(score, signature) that score.py printed after *label*."""
    match = re.search(rf"^{re.escape(label)}: (\d+\.\d\d) \(([^)]*)\)", stdout, re.M)
    assert match, stdout
    return float(match.group(1)), match.group(2)


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_score_matches_sacrebleu_on_known_hypotheses(tmp_path, capsys):
    hyp, ref = write(tmp_path / "hyp.de", HYPOTHESES), write(tmp_path / "ref.de", REFERENCES)
    score.main(
        [
            "--hypotheses",
            str(hyp),
            "--reference",
            str(ref),
            "--source-lang",
            "en",
            "--target-lang",
            "de",
            "--detok",
            "none",
            "--output-dir",
            str(tmp_path / "out"),
        ]
    )
    stdout = capsys.readouterr().out
    expected = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES])
    assert reported(stdout, "sacreBLEU") == (
        round(expected.score, 2),
        "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" + sacrebleu.__version__,
    )
    expected_split = sacrebleu.corpus_bleu(SPLIT_HYPOTHESES, [SPLIT_REFERENCES], tokenize="none")
    assert reported(stdout, "compound-split BLEU")[0] == round(expected_split.score, 2)
    assert "tok:none" in reported(stdout, "compound-split BLEU")[1]
    saved = json.loads((tmp_path / "out" / "scores.json").read_text())
    assert saved["sacrebleu"] == pytest.approx(expected.score) and saved["compound_split_bleu"] == pytest.approx(
        expected_split.score
    )


@pytest.mark.parametrize("bpe", ["subword_nmt", "sentencepiece"])
def test_score_restores_order_removes_bpe_and_detokenizes(tmp_path, capsys, bpe):
    """A fairseq-generate output in batch order, with BPE and Moses tokenization."""
    tokenized_h = [
        "Ein Computer-Spiel , das &quot; gut &quot; ist .",
        "Zwei Männer spielen Fußball im Park .",
        "Die Frau-Mann-Gruppe sitzt .",
        "Ein Hund läuft durch den Schnee !",
    ]
    tokenized_r = [
        "Ein Computer-Spiel ist gut .",
        "Zwei Männer spielen im Park Fußball .",
        "Die Frau-Mann-Gruppe sitzt draußen .",
        "Ein schwarzer Hund rennt durch den Schnee .",
    ]

    def encode(line):  # a plausible segmentation of each word
        if bpe == "subword_nmt":
            return " ".join(w[:3] + "@@ " + w[3:] if len(w) > 4 else w for w in line.split())
        return " ".join("\u2581" + w[:3] + " " + w[3:] if len(w) > 4 else "\u2581" + w for w in line.split())

    lines = ["2026-01-01 | INFO | fairseq_cli.generate | loading model"]
    for i in (2, 0, 3, 1):  # fairseq-generate prints by batch, not in corpus order
        lines += [
            f"S-{i}\tsource {i}",
            f"T-{i}\t{encode(tokenized_r[i])}",
            f"H-{i}\t-0.25\t{encode(tokenized_h[i])}",
            f"D-{i}\t-0.25\tignored",
            f"P-{i}\t-0.1 -0.2",
        ]
        if i == 0:  # --nbest 2: the first H line of a sentence is its best hypothesis
            lines.append(f"H-{i}\t-0.5\tworse")
    lines.append("Generate test with beam=4: BLEU4 = 1.00")
    gen, ref = write(tmp_path / "generate-test.txt", lines), write(tmp_path / "ref.de", REFERENCES)
    score.main(
        [
            "--generate-output",
            str(gen),
            "--reference",
            str(ref),
            "--source-lang",
            "en",
            "--target-lang",
            "de",
            "--bpe",
            bpe,
            "--detok",
            "moses",
            "--output-dir",
            str(tmp_path / "out"),
        ]
    )
    stdout = capsys.readouterr().out
    out = tmp_path / "out"
    assert (out / "test.hyp.tok.de").read_text(encoding="utf-8").splitlines() == tokenized_h
    assert (out / "test.ref.tok.de").read_text(encoding="utf-8").splitlines() == tokenized_r
    assert (out / "test.hyp.de").read_text(encoding="utf-8").splitlines()[:2] == [
        'Ein Computer-Spiel, das "gut" ist.',
        "Zwei Männer spielen Fußball im Park.",
    ]
    split = [re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", s) for s in tokenized_h + tokenized_r]
    expected_split = sacrebleu.corpus_bleu(split[:4], [split[4:]], tokenize="none")
    assert reported(stdout, "compound-split BLEU")[0] == round(expected_split.score, 2)
    detok = (out / "test.hyp.de").read_text(encoding="utf-8").splitlines()
    assert reported(stdout, "sacreBLEU")[0] == round(sacrebleu.corpus_bleu(detok, [REFERENCES]).score, 2)


def test_score_refuses_a_reference_of_another_length(tmp_path, capsys):
    hyp, ref = write(tmp_path / "hyp.de", HYPOTHESES), write(tmp_path / "ref.de", REFERENCES[:3])
    error = cli_error(
        capsys, score.main, "--hypotheses", hyp, "--reference", ref, "--source-lang", "en", "--target-lang", "de"
    )
    assert error == f"score.py: error: {hyp} has 4 hypotheses, --reference {ref} has 3 lines"


COMPAT_DATA, COMPAT_CHECKPOINT = FIXTURES / "bin", FIXTURES / "ckpt-pre-ln" / "checkpoint_last.pt"


def score_argv(tmp_path, reference_lines, *extra):
    """score.py translating the toy test split (N_TEST sentences) with a real checkpoint."""
    reference = write(tmp_path / "ref.tgt", ["t1 t2"] * reference_lines)
    return [
        "--data",
        COMPAT_DATA,
        "--checkpoint",
        COMPAT_CHECKPOINT,
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--reference",
        reference,
        "--bpe",
        "none",
        "--detok",
        "none",
        *extra,
    ]


@pytest.fixture
def never_translate(monkeypatch):
    def translate(*args):
        raise AssertionError("score.py translated before it checked its inputs")

    monkeypatch.setattr(score, "run_generate", translate)


def test_score_checks_the_reference_against_the_split_before_translating(tmp_path, capsys, never_translate):
    out = tmp_path / "out" / "score"
    error = cli_error(capsys, score.main, *score_argv(tmp_path, N_TEST - 1, "--output-dir", out))
    assert error == (
        f"score.py: error: --reference {tmp_path / 'ref.tgt'} has {N_TEST - 1} lines, but the test split "
        f"of --data {COMPAT_DATA} has {N_TEST} sentences"
    )
    assert not (tmp_path / "out").exists()


def test_score_checks_the_output_folder_before_translating(tmp_path, capsys, never_translate):
    (tmp_path / "file").write_text("")
    error = cli_error(capsys, score.main, *score_argv(tmp_path, N_TEST, "--output-dir", tmp_path / "file" / "score"))
    assert error == f"score.py: error: --output-dir {tmp_path / 'file' / 'score'}: {tmp_path / 'file'} is not a folder"
    argv = score_argv(tmp_path, N_TEST, "--output-dir", tmp_path)
    reference = (tmp_path / "ref.tgt").rename(tmp_path / "test.hyp.tgt")  # named as score.py's hypotheses
    argv[argv.index("--reference") + 1] = reference
    error = cli_error(capsys, score.main, *argv)
    assert error == f"score.py: error: --output-dir would overwrite the input {reference}; choose another folder"


def test_score_leaves_no_partial_output_when_translation_fails(tmp_path, capsys):
    out = tmp_path / "score"
    out.mkdir()
    (out / "scores.txt").write_text("an earlier run's scores\n")
    error = cli_error(capsys, score.main, *score_argv(tmp_path, N_TEST, "--output-dir", out, "--no-such-flag"))
    assert error == "score.py: error: fairseq-generate failed (its error is above); nothing was written"
    assert [(p.name, p.read_text()) for p in out.iterdir()] == [("scores.txt", "an earlier run's scores\n")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref.tgt", "score"]  # no staging folder left


# --- quickstart.sh and examples/multi30k ----------------------------------------------------------


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("quickstart")
    result = run(SCRIPTS / "quickstart.sh", "--ci", run_dir)
    return run_dir, result.stdout, result.stderr


def test_quickstart_learns_to_translate(quickstart):
    """The floor, 40: a translation with every word and agreement right but the clauses left in
    source order (no subject-object-verb, no fronted phrase) scores 32.7 on this test set, an
    untrained model about 0; the --ci model scored 60.4 when this was written."""
    run_dir, stdout, _ = quickstart
    scores = json.loads((run_dir / "score" / "scores.json").read_text())
    assert scores["sentences"] == 500
    assert scores["sacrebleu"] > 40, stdout[-3000:]
    assert scores["sacrebleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
    assert re.search(r"^sacreBLEU: \d+\.\d\d \(nrefs:1", stdout, re.M)
    assert len((run_dir / "score" / "test.hyp.tgt").read_text().splitlines()) == 500


def test_quickstart_prints_a_line_a_step_the_training_progress_and_where_everything_is(quickstart):
    """Each tool's own output goes to a log whose path the step names; the terminal gets the
    steps, the train loss every 25 updates, the validation losses, the score and the layout."""
    run_dir, stdout, stderr = quickstart
    assert stderr == ""
    steps = re.findall(
        rf"^\[quickstart [\d:]+\] (\d)/6 [^\n]* -> {re.escape(str(run_dir))}/logs/(\w+)\.log$", stdout, re.M
    )
    assert steps == [
        ("1", "setup"),
        ("2", "corpus"),
        ("3", "binarize"),
        ("4", "train"),
        ("5", "average"),
        ("6", "score"),
    ]
    for _, log in steps:
        assert (run_dir / "logs" / f"{log}.log").stat().st_size > 0, log
    train = re.findall(r"^    update +(\d+)/500  train loss +([\d.]+)  \(\d+ s\)$", stdout, re.M)
    assert [int(update) for update, _ in train] == list(range(25, 501, 25))
    assert float(train[-1][1]) < float(train[0][1]) - 2
    assert re.search(r"^    update +\d+/500  valid loss +[\d.]+$", stdout, re.M)
    assert "Everything is in" in stdout and "docs/python-api.md" in stdout
    assert len(stdout.splitlines()) < 70  # the config dumps, model and warnings stay in the logs (~350 lines)
    log = (run_dir / "logs" / "train.log").read_text()
    assert "num_updates=500" in log and "RealformerModel(" in log  # fairseq-train's whole output


def test_quickstart_averages_its_last_two_checkpoints(quickstart):
    """Real fairseq checkpoints: the averaged one is their mean, and fairseq-generate loaded it."""
    run_dir, _, _ = quickstart
    ckpt = run_dir / "checkpoints"
    kept = sorted(ckpt.glob("checkpoint_*_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    assert len(kept) == 2 and kept[1].name.endswith("_500.pt")  # --keep-interval-updates 2
    last = [load_checkpoint(p)["model"] for p in kept]
    averaged = load_checkpoint(ckpt / "checkpoint_avg.pt")["model"]
    for name, value in averaged.items():
        torch.testing.assert_close(value, (last[0][name] + last[1][name]) / 2, msg=name)
    score_log = (run_dir / "logs" / "score.log").read_text()
    assert re.search(r"fairseq-generate .* --path \S*/checkpoint_avg\.pt ", score_log), score_log[-3000:]


def test_quickstart_rerun_skips_finished_steps(quickstart):
    run_dir, first, _ = quickstart
    stdout = run(SCRIPTS / "quickstart.sh", "--ci", run_dir).stdout
    for step in ("2/6 corpus", "3/6 subwords + binarize", "4/6 train", "5/6 average", "6/6 translate + score"):
        assert re.search(rf"\] {re.escape(step)}: .* exists, skipped", stdout), stdout
    assert "fairseq_cli.train" not in stdout
    assert reported(stdout, "sacreBLEU") == reported(first, "sacreBLEU")


def doc_block(page, language, containing):
    """The fenced code block in *language* of the docs page (or README.md) that contains *containing*."""
    text = (Path(REPO) / page).read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(rf"^```{language}\n(.*?)^```", text, re.M | re.S) if containing in b]
    return block


def test_python_api_and_interactive_examples_run_on_the_quickstart_output(quickstart, capsys):
    """docs/python-api.md's Python example, exactly, with the --ci run's folder; then its
    fairseq-interactive command on the same sentences: the same translations."""
    run_dir, _, _ = quickstart
    code = doc_block("docs/python-api.md", "python", "RealformerModel.from_pretrained")
    assert code.count('run = "runs/quickstart"') == 1
    exec(compile(code.replace('run = "runs/quickstart"', f'run = "{run_dir}"'), "docs/python-api.md", "exec"), {})
    one, several, sampled, *best = capsys.readouterr().out.splitlines()
    several = ast.literal_eval(several)
    assert len(several) == 2 and several[0] == one
    assert len(best) == 4 and best[0].split(" ", 1)[1] == one
    scores = [float(line.split(" ", 1)[0]) for line in best]
    assert scores == sorted(scores, reverse=True)
    assert all(text and "<unk>" not in text for text in (one, *several, sampled))

    command = doc_block("docs/python-api.md", "bash", "fairseq-interactive").replace("runs/quickstart", str(run_dir))
    program, *args = shlex.split(command.replace("\\\n", " "))
    sentences = re.findall(r'"([^"]+\.)"', code)[1:3]  # the list translate() got
    stdout = run(program, *args, stdin="".join(f"{s}\n" for s in sentences)).stdout
    assert re.findall(r"^D-\d+\t\S+\t(.*)$", stdout, re.M) == several


def test_analysis_example_runs_on_the_quickstart_output(quickstart):
    """docs/analysis.md's command on the quickstart's model, with the --ci run's folder: the
    summary table of every path and layer, 12 figures and the JSON medians."""
    run_dir, _, _ = quickstart
    command = doc_block("docs/analysis.md", "bash", "--labels RealFormer --out").replace(
        "runs/quickstart", str(run_dir)
    )
    program, *args = shlex.split(command.replace("\\\n", " "))
    stdout = run(program, *args).stdout
    assert re.search(rf"^RealFormer: \d+ sentences of 'valid' in {re.escape(str(run_dir))}/bin$", stdout, re.M), stdout
    assert len(re.findall(r"^  (encoder|decoder|cross) +\d ", stdout, re.M)) == 3 * 2  # --ci: 2+2 layers
    assert len(list((run_dir / "analysis").glob("*.p[nd][gf]"))) == 12
    medians = json.loads((run_dir / "analysis" / "medians.json").read_text())
    assert [m["checkpoint"] for m in medians["models"]] == [f"{run_dir}/checkpoints/checkpoint_avg.pt"]


@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"Multi30k data not found at {MULTI30K}")
def test_multi30k_german_to_english_through_the_quality_benchmark(tmp_path):
    """studies/quality.py --quick runs the recipe (its --tiny mode) on the real data, German ->
    English, two variants with two seeds side by side, on every test set of the folder; stopped
    mid-way it resumes where it stopped; it reports mean ± std over seeds, paired bootstrap
    comparisons, the JSON with re-scorable translations, the dropout gap of every run's checkpoints,
    and the figures."""
    data_before = sorted((p.name, p.stat().st_mtime) for p in MULTI30K.iterdir())
    test_sets = sorted(
        p.name[: -len(".de.gz")]
        for p in MULTI30K.glob("test_*.de.gz")
        if (MULTI30K / p.name.replace(".de.gz", ".en.gz")).exists()
    )
    out, json_path = tmp_path / "quality", tmp_path / "results" / "quality.json"
    argv = [
        Path(REPO) / "studies" / "quality.py",
        "--data",
        MULTI30K,
        "--quick",
        "--variants",
        "realformer,admin",
        "--seeds",
        "1,2",
        "--jobs",
        "2",
        "--dropout-gap",
        "--source-lang",
        "de",
        "--target-lang",
        "en",
        "--out",
        out,
        "--json",
        json_path,
        "--figures",
        tmp_path / "figures",
    ]

    # stopped as soon as one training has saved an epoch checkpoint, then run again: it resumes
    study = popen(*argv, cwd=REPO)
    train_log = out / "realformer" / "seed1" / "train.log"
    for _ in range(3000):  # fairseq logs "Saved checkpoint" once checkpoint_last.pt is written in full
        if (train_log.exists() and "Saved checkpoint" in train_log.read_text()) or study.poll() is not None:
            break
        time.sleep(0.2)
    study.send_signal(signal.SIGTERM)  # (2 epochs: the second is still training)
    stopped = study.communicate(timeout=120)[0]
    assert study.returncode == 130 and "run the same command to resume" in stopped, stopped
    assert not (out / "realformer" / "seed1" / "checkpoints" / "train.done").exists()
    stdout = run(*argv).stdout
    assert "start realformer seed 1" in stdout  # the stopped one again, from its checkpoint
    resumed = (out / "realformer" / "seed1" / "train.log").read_text()
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch [12] @ \d+ updates\)", resumed)
    assert len((out / "realformer" / "seed1" / "attempts.jsonl").read_text().splitlines()) == 2
    machines = (out / "realformer" / "seed1" / "machines.jsonl").read_text().splitlines()
    assert [json.loads(line)["cpu"] for line in machines] == [cpu_model()] * 2

    recipe = out / "realformer" / "seed2"
    assert (recipe / "bin").resolve() == (out / "data" / "bin").resolve()  # binarised once, shared
    assert (recipe / "test-sets").read_text().split() == [",".join(test_sets)]
    assert len((out / "data" / "spm" / "train.de").read_text().splitlines()) == 300  # first 300 lines only
    assert "--seed 2" in (recipe / "command").read_text()
    for i, name in enumerate(test_sets):
        scores = json.loads((recipe / "score" / name / "scores.json").read_text())
        with gzip.open(MULTI30K / f"{name}.en.gz", "rt", encoding="utf-8") as f:
            english = [line.rstrip("\n") for line in f][:300]
        assert scores["reference"] == str(recipe / f"{name}.en")  # English, the target
        assert (recipe / f"{name}.en").read_text(encoding="utf-8").splitlines() == english
        assert len((recipe / "score" / name / f"test{i or ''}.hyp.en").read_text().splitlines()) == len(english)

    result = json.loads(json_path.read_text())
    assert [(r["variant"], r["seed"]) for r in result["runs"]] == [
        ("realformer", 1),
        ("realformer", 2),
        ("admin", 1),
        ("admin", 2),
    ]
    for r in result["runs"]:
        assert list(r["test_sets"]) == test_sets and r["updates"] > 0 and r["wall_s"] > 0 and r["tokens_per_s"] > 0
        assert len(r["valid_curve"]) == 2 and r["best_valid_loss"] == min(loss for _, loss in r["valid_curve"])
        assert list(r["wall_s_by_cpu"]) == [cpu_model()]
        assert sum(r["wall_s_by_cpu"].values()) == pytest.approx(r["wall_s"], abs=0.2)
        assert r["val"]["signature"].startswith("nrefs:1|case:mixed")  # the validation set is scored too
        gap = r["dropout_gap"]["rows"]  # --dropout-gap: both epoch checkpoints (--tiny keeps 2), then the average
        assert [row["checkpoint"] for row in gap] == ["checkpoint1.pt", "checkpoint2.pt", "checkpoint_avg.pt"]
        for row, (updates, logged) in zip(gap, r["valid_curve"]):  # dropout off: fairseq's own validation
            assert row["updates"] == updates and row["dropout_off"] == pytest.approx(logged, abs=6e-4)
        assert all(row["dropout_on"] != pytest.approx(row["dropout_off"], abs=1e-3) for row in gap)
        for name, score_ in {**r["test_sets"], "val": r["val"]}.items():
            assert score_["signature"].startswith("nrefs:1|case:mixed") and "case:lc" in score_["bleu_lc_signature"]
            with gzip.open(
                Path(REPO) / score_["translations"]
                if not Path(score_["translations"]).is_absolute()
                else score_["translations"],
                "rt",
                encoding="utf-8",
            ) as f:
                hypotheses = f.read().splitlines()
            reference = (
                (out / r["variant"] / f"seed{r['seed']}" / f"{name}.en").read_text(encoding="utf-8").splitlines()
            )
            assert sacrebleu.corpus_bleu(hypotheses, [reference]).score == pytest.approx(score_["sacrebleu"])
            assert sacrebleu.corpus_chrf(hypotheses, [reference]).score == pytest.approx(score_["chrf"])
    assert {(c["a"], c["b"], c["seed"], c["test_set"]) for c in result["comparisons"]} == {
        ("realformer", "admin", seed, name) for seed in (1, 2) for name in test_sets
    }
    assert all(0 < c["p_value"] <= 1 for c in result["comparisons"])
    assert [(c["a"], c["b"], c["test_set"], c["splits"]) for c in result["seed_comparisons"]] == [
        ("realformer", "admin", name, 6) for name in test_sets
    ]
    assert "Across seeds: difference of the sacreBLEU means" in stdout
    assert result["summary"]["admin"]["seeds"] == [1, 2]
    assert f"| realformer | 1,2 | {result['summary']['realformer'][test_sets[0]]['sacrebleu']['mean']:.2f} ± " in stdout
    assert "Multi30k de→en" in stdout and "| realformer | admin | " in stdout
    assert all(
        (tmp_path / "figures" / f"quality.{kind}.png").stat().st_size > 10_000 for kind in ("valid-loss", "bleu")
    )

    again = run(*argv[:-2]).stdout  # everything finished: nothing is trained again
    assert "start " not in again and "| admin | 1,2 |" in again
    shutil.rmtree(out)  # a fresh checkout: the committed JSON and translations only
    fresh = run(*argv[:-2]).stdout
    assert "start " not in fresh and [line for line in fresh.splitlines() if line.startswith("| ")] == [
        line for line in stdout.splitlines() if line.startswith("| ")
    ]
    assert sorted((p.name, p.stat().st_mtime) for p in MULTI30K.iterdir()) == data_before  # read in place


def test_a_learning_rate_sweep_gives_each_rate_its_own_runs(tmp_path, capsys):
    """--lr with several rates: every variant at every rate, each in its own folder and row; the
    preset's settings otherwise; a bad rate is one line."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.en.gz").touch()
    args, _ = quality.parse_args(
        [
            "--data",
            str(data),
            "--preset",
            "cpu",
            "--variants",
            "post-ln,admin",
            "--lr",
            "1e-3,2e-3",
            "--epochs",
            "10",
            "--out",
            str(tmp_path / "q"),
        ]
    )
    assert [(c.label, c.lr) for c in args.configs] == [
        ("post-ln lr=0.001", 1e-3),
        ("post-ln lr=0.002", 2e-3),
        ("admin lr=0.001", 1e-3),
        ("admin lr=0.002", 2e-3),
    ]
    assert args.run_folder(args.configs[1], 3) == tmp_path / "q" / "post-ln-lr0.002-epochs10" / "seed3"
    assert args.sweep and args.warmup == quality.PRESETS["cpu"].warmup and args.layers == 4
    (tmp_path / "updates_per_epoch").write_text("7\n")  # what quality.py counted on the data, cached
    flags = recipe.training_flags(args, tmp_path, 2e-3)
    assert flags[flags.index("--lr") + 1] == "0.002" and flags[flags.index("--total-num-update") + 1] == "70"
    single, _ = quality.parse_args(["--data", str(data), "--preset", "cpu", "--out", str(tmp_path / "q")])
    assert not single.sweep and single.lr == quality.PRESETS["cpu"].lr
    assert single.run_folder(single.configs[0], 1) == tmp_path / "q" / "post-ln" / "seed1"
    bf16, _ = quality.parse_args(["--data", str(data), "--preset", "cpu", "--bf16", "--out", str(tmp_path / "q")])
    assert bf16.run_folder(bf16.configs[0], 1) == tmp_path / "q" / "post-ln-bf16" / "seed1"
    assert recipe.run_flags(bf16)[0] == "--bf16"  # the recipe trains and translates in bf16
    assert bf16.settings().to_json()["bf16"] and "bf16" not in single.settings().to_json()  # a float32 study's runs
    with pytest.raises(SystemExit):
        quality.parse_args(["--data", str(data), "--lr", "1e-3,fast"])
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .endswith("--lr 1e-3,fast: expected a number or a comma list of numbers, e.g. 1e-3,2e-3")
    )


def test_a_run_summary_reads_tokens_per_second_from_fairseqs_rate_even_for_sub_second_epochs(tmp_path):
    """tokens/s is target tokens over the time fairseq's per-epoch wps implies: epochs shorter than a
    second (train_wall 0, as the tests' tiny runs on a fast machine) still give a rate."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    line = (
        "2026-11-24 05:05:39 | INFO | {split} | epoch {epoch:03d} | loss {loss} | wps {wps} | wpb {wpb} | "
        "num_updates {updates} | train_wall 0 | wall 1"
    )
    (run_dir / "train.log").write_text(
        "\n".join(
            [
                line.format(split="train", epoch=1, loss=9.0, wps=1000.0, wpb=100.0, updates=10),  # 1,000 tokens in 1 s
                line.format(split="valid", epoch=1, loss=8.5, wps=5000.0, wpb=50.0, updates=10),
                line.format(split="train", epoch=2, loss=8.0, wps=500.0, wpb=100.0, updates=20),  # 1,000 tokens in 2 s
                line.format(split="valid", epoch=2, loss=7.5, wps=5000.0, wpb=50.0, updates=20),
            ]
        )
        + "\n"
    )
    (run_dir / "attempts.jsonl").write_text('{"wall_s": 2.5}\n{"wall_s": 1.0}\n')
    summary = RunFolder(run_dir).summary()
    assert summary["tokens_per_s"] == pytest.approx(2000 / 3, abs=0.05)
    assert (summary["updates"], summary["epochs"], summary["attempts"], summary["wall_s"]) == (20, 2, 2, 3.5)
    assert summary["valid_curve"] == [(10, 8.5), (20, 7.5)] and summary["best_valid_loss"] == 7.5


_START = "{} | INFO | fairseq_cli.train | {{'_name': None, 'common': {{}}}}"  # a fairseq-train invocation
_EPOCH = "{} | INFO | train | epoch {:03d} | loss 9.0 | wps 1000.0 | wpb 100.0 | num_updates {} | train_wall 9"


def _run_with_train_log(tmp_path, lines):
    """A run folder whose fairseq-train log is *lines*."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "train.log").write_text("\n".join(lines) + "\n")
    return run_dir


def test_a_run_summary_counts_the_time_of_attempts_killed_with_their_session(tmp_path):
    """A session's end kills the study with SIGKILL: its attempt writes no attempts.jsonl line, but
    its fairseq-train logged; that invocation's first-to-last-line time counts in the run's wall
    time, the recorded attempt's own invocation only once."""
    run_dir = _run_with_train_log(
        tmp_path,
        [
            "/site-packages/fairseq/...: UserWarning: a line without a time",
            _START.format("2026-11-24 09:07:34"),
            _EPOCH.format("2026-11-24 09:10:00", 1, 10),
            _EPOCH.format("2026-11-24 09:14:10", 2, 20),  # then killed: 396 s logged
            _START.format("2026-11-24 09:26:25"),
            _EPOCH.format("2026-11-24 09:40:00", 3, 30),  # resumed, finished
        ],
    )
    (run_dir / "attempts.jsonl").write_text('{"started": "2026-11-24T09:26:20", "wall_s": 900.0, "returncode": 0}\n')
    summary = RunFolder(run_dir).summary()
    assert (summary["attempts"], summary["wall_s"], summary["updates"]) == (2, 1296.0, 30)
    (run_dir / "attempts.jsonl").write_text(
        '{"started": "2026-11-24T09:07:30", "wall_s": 410.0, "returncode": -15}\n'  # stopped with Ctrl-C: recorded
        '{"started": "2026-11-24T09:26:20", "wall_s": 900.0, "returncode": 0}\n'
    )
    assert (RunFolder(run_dir).summary()["attempts"], RunFolder(run_dir).summary()["wall_s"]) == (2, 1310.0)


def test_a_run_that_spans_sessions_says_how_long_it_trained_on_each_processor(tmp_path):
    """The sessions' VMs change: each attempt's processor, written as it starts (machines.jsonl),
    goes with that attempt, killed or recorded; attempts from before the record "not recorded"."""
    run_dir = _run_with_train_log(
        tmp_path,
        [
            _START.format("2026-11-24 09:00:00"),
            _EPOCH.format("2026-11-24 09:01:40", 1, 10),  # killed: 100 s, before machines.jsonl existed
            _START.format("2026-11-25 10:00:05"),
            _EPOCH.format("2026-11-25 10:05:05", 2, 20),  # killed: 300 s on an AMD EPYC
            _START.format("2026-11-26 08:00:04"),
            _EPOCH.format("2026-11-26 08:10:00", 3, 30),  # finished on an Intel Xeon: recorded, 600 s
        ],
    )
    (run_dir / "attempts.jsonl").write_text('{"started": "2026-11-26T08:00:00", "wall_s": 600.0, "returncode": 0}\n')
    (run_dir / "machines.jsonl").write_text(
        '{"started": "2026-11-25T10:00:00", "cpu": "AMD EPYC"}\n{"started": "2026-11-26T08:00:00", "cpu": "Intel Xeon"}\n'
    )
    summary = RunFolder(run_dir).summary()
    assert summary["wall_s_by_cpu"] == {"not recorded": 100.0, "AMD EPYC": 300.0, "Intel Xeon": 600.0}
    assert (summary["attempts"], summary["wall_s"]) == (3, 1000.0)


def test_the_permutation_test_across_seeds_counts_every_split_of_the_seeds():
    """Exact two-sided permutation test over seeds, against splits counted by hand: three seeds
    each give 20 splits, of which only the observed one and its mirror are as extreme when the
    groups do not overlap; equal groups give p = 1; two seeds each give 6 splits."""
    assert scoring.permutation_test([36.0, 36.5, 37.0], [35.0, 35.2, 35.4]) == pytest.approx((1.3, 2 / 20, 20))
    assert scoring.permutation_test([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == (0.0, 1.0, 20)
    # a = {3, 1}, b = {2, 0}: |Δ| = 1; splits {3,2}|{1,0} (2), {3,1}|{2,0} (1), {3,0}|{2,1} (0) and mirrors
    assert scoring.permutation_test([3.0, 1.0], [2.0, 0.0]) == pytest.approx((1.0, 4 / 6, 6))
    runs = [
        Run(v, None, v, seed, test_sets={"t": {"sacrebleu": bleu}})
        for v, scores in (("realformer", (36.0, 36.5, 37.0)), ("admin", (35.0, 35.2, 35.4)), ("post-ln", (36.0,)))
        for seed, bleu in zip((1, 2, 3), scores)
    ]
    assert scoring.seed_comparisons(runs) == [
        {
            "a": "realformer",
            "b": "admin",
            "test_set": "t",
            "seeds_a": [1, 2, 3],
            "seeds_b": [1, 2, 3],
            "delta_mean": 1.3,
            "p_value": 0.1,
            "splits": 20,
        }
    ]


COMMITTED_STUDIES = sorted((Path(REPO) / "studies" / "results").glob("*quality*multi30k-en-de*.json"))
# the published recipe's studies are scored their own way: test_published_recipe.py rescores them
OWN_RECIPE_STUDIES = [path for path in COMMITTED_STUDIES if not path.stem.endswith("-published")]


@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"Multi30k data not found at {MULTI30K}")
@pytest.mark.parametrize("path", OWN_RECIPE_STUDIES, ids=lambda path: path.stem)
def test_the_committed_quality_studies_rescore_from_their_translations(path):
    """Every run of a committed quality study: its gzipped translations (of the test sets, and of the
    validation set where it was scored), scored again against the raw references, give the
    sacreBLEU, chrF and lowercased BLEU the JSON reports."""
    study = json.loads(path.read_text())
    assert (
        study["runs"]
        and study["machine"]
        and study["date"]
        and study["command"].startswith("python studies/quality.py")
    )
    for r in study["runs"]:
        for name, reported in Run(**r).scored_sets.items():  # the test sets, and the validation set when scored
            with gzip.open(Path(REPO) / reported["translations"], "rt", encoding="utf-8") as f:
                hypotheses = f.read().splitlines()
            with gzip.open(MULTI30K / f"{name}.de.gz", "rt", encoding="utf-8") as f:
                reference = f.read().splitlines()
            assert len(hypotheses) == len(reference)
            assert sacrebleu.corpus_bleu(hypotheses, [reference]).score == pytest.approx(
                reported["sacrebleu"], abs=1e-9
            )
            assert sacrebleu.corpus_chrf(hypotheses, [reference]).score == pytest.approx(reported["chrf"], abs=1e-9)
            lowercased = sacrebleu.corpus_bleu(hypotheses, [reference], lowercase=True).score
            assert lowercased == pytest.approx(reported["bleu_lc"], abs=1e-9)


@pytest.mark.parametrize("path", COMMITTED_STUDIES, ids=lambda path: path.stem)
def test_the_committed_quality_studies_across_seed_tests_follow_from_their_scores(path):
    """The permutation tests across seeds in a committed study are those its runs' scores give (in a
    learning-rate sweep, of each variant at its best rate, chosen again from its runs by the rule
    the runner follows; none where it chose none)."""
    study = json.loads(path.read_text())
    record = StudyRecord.from_json(study)
    assert record.best == study.get("best", {})
    assert study.get("seed_comparisons", []) == scoring.seed_comparisons(record.compared)


@pytest.mark.parametrize("path", COMMITTED_STUDIES, ids=lambda path: path.stem)
def test_the_committed_dropout_gaps_agree_with_the_logged_validation_losses(path):
    """Where a committed run has a dropout-gap record (quality.py --dropout-gap), each epoch
    checkpoint's dropout-off loss is the validation loss fairseq logged at that update, and the
    record ends with the averaged checkpoint the run translated with."""
    for r in json.loads(path.read_text())["runs"]:
        if "dropout_gap" not in r:
            continue
        logged, rows = dict(r["valid_curve"]), r["dropout_gap"]["rows"]
        epochs = [row for row in rows if row["checkpoint"] != "checkpoint_avg.pt"]
        assert epochs and all(row["dropout_off"] == pytest.approx(logged[row["updates"]], abs=6e-4) for row in epochs)
        assert rows[-1]["checkpoint"] == "checkpoint_avg.pt" or r.get("diverged"), r["label"]


def test_multi30k_names_a_missing_language_or_test_set(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val", "test_2016_flickr", "test_2017_flickr"):
        for lang in ("en", "de") if split != "test_2017_flickr" else ("en",):
            with gzip.open(data / f"{split}.{lang}.gz", "wt") as f:
                f.write("a small dog\n")
    recipe = Path(REPO) / "examples" / "multi30k" / "run.sh"
    for flags, expected in [
        (["--source-lang", "fr"], f"{data}/train.fr.gz not found (DATA_DIR, --source-lang/--target-lang)"),
        (
            ["--test-sets", "test_2016_flickr,test_2017_flickr"],
            f"{data}/test_2017_flickr.de.gz not found (--test-sets)",
        ),
        (["--target-lang", "es"], "--target-lang es: Multi30k's languages are en, de, fr and cs"),
    ]:
        result = run(recipe, *flags, data, tmp_path / "run", check=False)
        assert (result.returncode, result.stderr) == (2, f"run.sh: error: {expected}\n")
        assert not (tmp_path / "run").exists()
    result = run(
        Path(REPO) / "studies" / "quality.py",
        "--data",
        data,
        "--test-sets",
        "test_2017_flickr",
        "--out",
        tmp_path / "quality",
        check=False,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert (
        result.stderr.strip().splitlines()[-1]
        == f"quality.py: error: {data}/test_2017_flickr.de.gz not found (--test-sets)"
    )


# --- binarize.py ----------------------------------------------------------------------------------

binarize = load_script("binarize")


def test_binarize_encodes_and_binarises_every_split_once(tmp_path, capsys):
    """Raw .gz text in place, several test sets, the first lines only; a re-run keeps everything."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    words = "a man a woman a dog runs sits in the park on the street".split()
    for split, n in (("train", 120), ("val", 30), ("test_2016_flickr", 12), ("test_2017_flickr", 9)):
        for lang in ("en", "de"):
            with gzip.open(tmp_path / f"{split}.{lang}.gz", "wt") as f:
                f.writelines(
                    " ".join(words[(i + j) % len(words)] for j in range(3 + i % 5)) + f" {lang}\n" for i in range(n)
                )
    argv = [
        "--source-lang",
        "en",
        "--target-lang",
        "de",
        "--trainpref",
        tmp_path / "train",
        "--validpref",
        tmp_path / "val",
        "--testpref",
        f"{tmp_path / 'test_2016_flickr'},{tmp_path / 'test_2017_flickr'}",
        "--spm-vocab",
        "60",
        "--spm-dir",
        tmp_path / "spm",
        "--destdir",
        tmp_path / "bin",
        "--max-lines",
        "train=80,valid=20",
    ]
    run(SCRIPTS / "binarize.py", *argv)
    assert len((tmp_path / "spm" / "train.en").read_text().splitlines()) == 80
    assert "\u2581" in (tmp_path / "spm" / "val.de").read_text()
    sizes = {
        name: len(MMapIndexedDataset(str(tmp_path / "bin" / f"{name}.en-de.de")))
        for name in ("train", "valid", "test", "test1")
    }
    assert sizes == {"train": 80, "valid": 20, "test": 12, "test1": 9}  # test sets in the order given
    assert not (tmp_path / "bin.tmp").exists()
    binarize.main([str(a) for a in argv])  # resumable: the finished data are kept
    assert "exists, kept" in capsys.readouterr().err

    argv[argv.index("--destdir") + 1] = tmp_path / "bin2"
    error = cli_error(capsys, binarize.main, *argv[:5], tmp_path / "nope", *argv[6:])
    assert (
        error
        == f"binarize.py: error: --trainpref {tmp_path / 'nope'}: neither {tmp_path / 'nope'}.en nor {tmp_path / 'nope'}.en.gz exists"
    )
    assert not (tmp_path / "bin2").exists()
