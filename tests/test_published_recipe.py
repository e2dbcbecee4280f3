"""The published Multi30k recipe (quality.py --preset published, run.sh --published): its text is
the literature's (lowercased, normalised, Moses-tokenised without -a, joint BPE, nothing dropped),
its BLEU is multi-bleu's on that text, and its study reports, compares and commits on that metric."""

import gzip
import json
import shutil
import textwrap
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU, CHRF

from common import repo
from studies import quality, recipe, tables
from studies import study as study_module
from studies.study import StudyRecord

from .cli import load_script, run
from .helpers import REPO

PREPARE = Path(REPO) / "examples" / "multi30k" / "prepare-lc-bpe.sh"
TEXT = Path(REPO) / "examples" / "wmt14" / "wmt14_text.py"
MULTI30K = Path(REPO).parent / "shared" / "data" / "multi30k"

# A few caption pairs with what the literature's text does to them: case, „quotes“, a hyphenated
# word (kept whole: no -a), an apostrophe (escaped, as tokenizer.perl does), a pair whose lengths
# differ by more than 1.5 (kept: Multi30k's release drops nothing).
EN = [
    'A Man in a "Blue" T-shirt is riding a bike.',
    "Two dogs play in the snow.",
    "The woman's dog runs.",
    "A child.",
]
DE = [
    "Ein Mann in einem „blauen“ T-Shirt fährt Fahrrad.",
    "Zwei Hunde spielen im Schnee.",
    "Der Hund der Frau rennt.",
    "Ein kleines Kind sitzt lachend auf dem grünen Rasen vor dem Haus.",
]


def gz_lines(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def write_gz(path, lines):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    work = tmp_path_factory.mktemp("published")
    data = work / "raw"
    data.mkdir()
    for split, count in (("train", 10), ("val", 1), ("test_2016_flickr", 1)):
        write_gz(data / f"{split}.en.gz", (EN * count)[: 4 * count])
        write_gz(data / f"{split}.de.gz", (DE * count)[: 4 * count])
    result = run(PREPARE, "--bpe-tokens", "30", "--workers", "1", data, work / "prep", work / "bin")
    return work, result.stdout


def lines(path):
    return Path(path).read_text(encoding="utf-8").splitlines()


def test_the_text_is_multi30ks_lc_norm_tok(prepared):
    work, _ = prepared
    assert lines(work / "bin" / "tok" / "test.de") == [
        "ein mann in einem &quot; blauen &quot; t-shirt fährt fahrrad .",
        "zwei hunde spielen im schnee .",
        "der hund der frau rennt .",
        "ein kleines kind sitzt lachend auf dem grünen rasen vor dem haus .",
    ]
    assert lines(work / "prep" / "tmp" / "test.en")[0] == "a man in a &quot; blue &quot; t-shirt is riding a bike ."
    assert lines(work / "prep" / "tmp" / "test.en")[2] == "the woman &apos;s dog runs ."
    assert lines(work / "bin" / "tok" / "valid.de") == lines(work / "bin" / "tok" / "test.de")


def test_joint_bpe_keeps_every_pair_in_order_and_one_dictionary(prepared):
    work, log = prepared
    train = lines(work / "prep" / "train.de")
    assert len(train) == 40 and len(lines(work / "prep" / "train.en")) == 40  # the 1:13 pair is kept
    assert any("@@ " in line for line in train)  # 30 merges: the longer words stay split
    assert [(line + " ").replace("@@ ", "").strip() for line in train[:4]] == lines(work / "bin" / "tok" / "test.de")
    assert (work / "bin" / "dict.en.txt").read_text() == (work / "bin" / "dict.de.txt").read_text()
    for subset in ("train", "valid", "test"):
        assert (work / "bin" / f"{subset}.en-de.de.bin").exists()
    assert "types in the joined dictionary" in log


def test_a_second_run_skips_every_step(prepared):
    work, _ = prepared
    before = {p: p.stat().st_mtime_ns for p in (work / "bin").rglob("*") if p.is_file()}
    result = run(PREPARE, "--bpe-tokens", "30", "--workers", "1", work / "raw", work / "prep", work / "bin")
    assert "binarised data exist" in result.stdout and "BPE codes exist" in result.stdout
    assert {p: p.stat().st_mtime_ns for p in (work / "bin").rglob("*") if p.is_file()} == before


@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"Multi30k data not found at {MULTI30K}")
def test_the_real_test_set_has_the_published_reference_length(tmp_path):
    """test_2016_flickr.de as the literature tokenises it: 12,103 tokens, the reference length of
    the published 41.02 (with -a it would be 12,243)."""
    run(TEXT, "tokenize", MULTI30K / "test_2016_flickr", tmp_path / "t", "--langs", "en", "de", "--lc-norm-tok")
    assert sum(len(line.split()) for line in lines(tmp_path / "t.de")) == 12103


COMMITTED = sorted((Path(REPO) / "studies" / "results").glob("*quality*-published.json"))


@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"Multi30k data not found at {MULTI30K}")
@pytest.mark.parametrize("path", COMMITTED, ids=lambda path: path.stem)
def test_the_committed_published_study_rescores_from_its_translations(path, tmp_path):
    """Every run of a committed study of the published recipe, scored again from its committed
    translations: the literature's BLEU of the tokenised ones against the raw reference tokenised
    the recipe's way, sacreBLEU and chrF (case-insensitive) of the detokenised ones against the raw
    reference, are the numbers the JSON reports."""
    study = json.loads(path.read_text())
    assert study["runs"] and study["machine"] and study["date"]
    assert study["command"].startswith("python studies/quality.py --preset published")
    references = {}
    for r in study["runs"]:
        for name, reported in {**r["test_sets"], "val": r["val"]}.items():
            if name not in references:
                run(TEXT, "tokenize", MULTI30K / name, tmp_path / name, "--langs", "en", "de", "--lc-norm-tok")
                references[name] = gz_lines(MULTI30K / f"{name}.de.gz"), lines(tmp_path / f"{name}.de")
            raw, tokenised = references[name]
            hypotheses, hypotheses_tok = (
                gz_lines(Path(REPO) / reported[key]) for key in ("translations", "translations_tok")
            )
            assert len(hypotheses) == len(hypotheses_tok) == len(raw)
            bleu_tok = BLEU(tokenize="none", force=True).corpus_score(hypotheses_tok, [tokenised]).score
            assert bleu_tok == pytest.approx(reported["bleu_tok"], abs=1e-9), (r["label"], name)
            sacrebleu = BLEU(lowercase=True).corpus_score(hypotheses, [raw]).score
            assert sacrebleu == pytest.approx(reported["sacrebleu"], abs=1e-9), (r["label"], name)
            chrf = CHRF(lowercase=True).corpus_score(hypotheses, [raw]).score
            assert chrf == pytest.approx(reported["chrf"], abs=1e-9), (r["label"], name)


def test_score_py_gives_multi_bleus_number_and_case_insensitive_sacrebleu(tmp_path, capsys):
    reference = tmp_path / "ref.de"
    reference.write_text("Ein Mann fährt Fahrrad.\nZwei Hunde spielen im Schnee.\n", encoding="utf-8")
    tokenized = tmp_path / "ref.tok.de"
    tokenized.write_text("ein mann fährt fahrrad .\nzwei hunde spielen im schnee .\n", encoding="utf-8")
    hypotheses = tmp_path / "hyp.de"
    hypotheses.write_text("ein mann fährt rad.\nzwei hunde spielen im schnee.\n", encoding="utf-8")
    score = load_script("score")
    out = tmp_path / "out"
    argv = ["--hypotheses", hypotheses, "--reference", reference, "--source-lang", "en", "--target-lang", "de"]
    argv += ["--tokenized-reference", tokenized, "--tokenized-bleu", "plain", "--lowercase", "--output-dir", out]
    score.main([str(a) for a in argv])
    saved = json.loads((out / "scores.json").read_text())
    hyp_tok = ["ein mann fährt rad .", "zwei hunde spielen im schnee ."]  # Moses-tokenised
    expected = BLEU(tokenize="none", force=True).corpus_score(hyp_tok, [lines(tokenized)])
    assert saved["tokenized_bleu"] == pytest.approx(expected.score) and "compound_split_bleu" not in saved
    assert "tok:none" in saved["tokenized_signature"] and saved["tokenized_reference"] == str(tokenized)
    cased = BLEU().corpus_score(lines(hypotheses), [lines(reference)]).score
    assert saved["sacrebleu"] == pytest.approx(
        BLEU(lowercase=True).corpus_score(lines(hypotheses), [lines(reference)]).score
    )
    assert saved["sacrebleu"] > cased and "case:lc" in saved["sacrebleu_signature"] and saved["lowercase"]
    assert "tokenized BLEU" in capsys.readouterr().out


FAKE_RECIPE = textwrap.dedent("""\
    #!/usr/bin/env bash
    # What examples/multi30k/run.sh --published leaves in RUN_DIR, without training: fairseq stops at
    # its 8,000 updates, the others early; fairseq translates the first sentence wrong.
    set -euo pipefail
    args=("$@") run=${args[-1]}
    for i in "${!args[@]}"; do [ "${args[$i]}" = "--" ] && run=${args[$((i - 1))]}; done
    if [[ " ${args[*]} " == *" --prepare-only "* ]]; then
      mkdir -p "$run/bin/tok"
      printf 'ein hund rennt .\\nein mann fährt rad .\\n' > "$run/bin/tok/test.de"
      cp "$run/bin/tok/test.de" "$run/bin/tok/valid.de"
      exit 0
    fi
    echo "${ARCH:-recipe}" > "$run/arch"
    echo "$(date '+%Y-%m-%d %H:%M:%S') | INFO | train | epoch 001 | loss 9.1 | wps 3000 | wpb 7000 | num_updates 62" >> "$run/train.log"
    echo "$(date '+%Y-%m-%d %H:%M:%S') | INFO | valid | epoch 001 | valid on 'valid' subset | loss 5.1 | num_updates 62" >> "$run/train.log"
    case "${ARCH:-}" in
      transformer) echo "Stopping training due to num_updates: 8000 >= max_update: 8000" >> "$run/train.log"
                   first='ein hund läuft .' bleu=50.0 ;;
      *) echo "early stop since valid performance hasn't improved for last 10 runs" >> "$run/train.log"
         first='ein hund rennt .' bleu=100.0 ;;
    esac
    echo test_2016_flickr > "$run/test-sets"
    for set in val test_2016_flickr; do
      subset=test; [ $set = val ] && subset=valid
      mkdir -p "$run/score/$set"
      printf 'Ein Hund rennt.\\nEin Mann fährt Rad.\\n' > "$run/$set.de"
      printf '%s\\nein mann fährt rad .\\n' "$first" > "$run/score/$set/$subset.hyp.tok.de"
      sed 's/ \\.$/./' "$run/score/$set/$subset.hyp.tok.de" > "$run/score/$set/$subset.hyp.de"
      printf '{"sacrebleu": %s, "sacrebleu_signature": "nrefs:1|case:lc", "tokenized_bleu": %s, "tokenized_signature": "nrefs:1|tok:none", "reference": "%s", "lowercase": true, "tokenized_reference": "%s"}' \\
        "$bleu" "$bleu" "$run/$set.de" "$run/bin/tok/$subset.de" > "$run/score/$set/scores.json"
    done
""")


def test_the_published_study_compares_on_the_literatures_bleu_and_commits_both_forms(tmp_path, monkeypatch):
    quality = _load_quality(monkeypatch, tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.en.gz").touch()
    out = tmp_path / "q"
    result = tmp_path / "results" / "study.json"
    result.parent.mkdir()
    argv = ["--preset", "published", "--variants", "fairseq,post-ln-realformer", "--data", str(data)]
    argv += ["--out", str(out), "--json", str(result)]
    quality.main(argv)
    assert (out / "fairseq" / "seed1" / "arch").read_text().strip() == "transformer"  # fairseq's own
    assert (out / "post-ln-realformer" / "seed1" / "arch").read_text().strip() == "recipe"
    assert "--published" in (out / "fairseq" / "seed1" / "command").read_text().split()
    study = json.loads(result.read_text())
    fairseq, realformer = study["runs"]
    assert (fairseq["stopped_by"], realformer["stopped_by"]) == ("max-update", "patience")
    score = fairseq["test_sets"]["test_2016_flickr"]
    assert score["bleu_tok"] == 50.0 and score["bleu_tok_signature"].startswith("BLEU|")
    assert score["signature"].startswith("BLEU|") and score["chrf_signature"].startswith("chrF2|")
    hyps = ["ein hund läuft.", "ein mann fährt rad."]
    assert score["chrf"] == pytest.approx(
        CHRF(lowercase=True).corpus_score(hyps, [["Ein Hund rennt.", "Ein Mann fährt Rad."]]).score
    )
    assert score["translations"] == "results/study/fairseq.seed1.test_2016_flickr.de.gz"  # beside the JSON
    committed = [tmp_path / score[key] for key in ("translations", "translations_tok")]
    assert [gzip.open(path, "rt").read().splitlines() for path in committed] == [
        hyps,
        ["ein hund läuft .", "ein mann fährt rad ."],
    ]
    (comparison,) = study["comparisons"]  # on the literature's BLEU: the tokenised text, tokenize=none
    tokenised = BLEU(tokenize="none", force=True).corpus_score(
        ["ein hund läuft .", "ein mann fährt rad ."], [["ein hund rennt .", "ein mann fährt rad ."]]
    )
    assert (comparison["a"], comparison["b"]) == ("post-ln-realformer", "fairseq")
    assert comparison["delta"] == pytest.approx(100 - tokenised.score, abs=0.01)
    assert study["summary"]["fairseq"]["test_2016_flickr"]["bleu_tok"]["mean"] == 50.0
    assert "| fairseq | 1 | 50.00 | 8.98 |" in quality_table(quality, study)

    # a fresh checkout: no run folders; the committed study reports again with the same numbers
    for folder in ("fairseq", "post-ln-realformer"):
        shutil.rmtree(out / folder)
    # on another machine, which trains nothing: the JSON still names the one the runs trained on
    quality.main([*argv, "--report-only", "--machine", "another machine"])
    again = json.loads(result.read_text())
    assert again["comparisons"] == study["comparisons"] and again["summary"] == study["summary"]
    assert again["machine"] == study["machine"] and "another machine" not in again["what"]


def _load_quality(monkeypatch, tmp_path):
    fake = tmp_path / "fake_run.sh"
    fake.write_text(FAKE_RECIPE)
    monkeypatch.setattr(recipe, "RECIPE", fake)
    for module in (study_module, repo):  # the committed translations go beside the JSON
        monkeypatch.setattr(module, "REPO", tmp_path)
    return quality


def quality_table(quality, study):
    return tables.table(StudyRecord.from_json(study), "title", study["comparisons"])
