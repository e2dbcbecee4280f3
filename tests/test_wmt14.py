"""examples/wmt14: the prepare scripts on fabricated WMT'14 raw files (the archives' file names and
formats: plain parallel text, SGML), and train.sh's distributed path with 2 CPU processes."""

import gzip
import hashlib
import random
import re
import shlex
import tarfile
from pathlib import Path

import pytest
from fairseq import options
from fairseq.data.indexed_dataset import MMapIndexedDataset
from fairseq.models import ARCH_MODEL_REGISTRY

from . import cli
from .helpers import REPO, FakeTask, make_dictionary

WMT14 = Path(REPO) / "examples" / "wmt14"
# Both sides share the words, so that BPE splits a sentence and its "translation" alike and only
# the pairs made to break a cleaning rule are dropped.
WORDS = (
    "house garden river city bridge street school book state-of-the-art e-mail well-known "
    "Grüße Straße tree small green old new"
).split()
QUOTES = {"en": ("“", "”"), "de": ("„", "“"), "fr": ("« ", " »")}
N_GOOD = 30  # good pairs per corpus
SHORT_BPE = "60"  # merges: few enough that many words stay split into BPE units

DE_CORPORA = ["training/europarl-v7.de-en", "commoncrawl.de-en", "training/news-commentary-v12.de-en"]
FR_CORPORA = [
    "training/europarl-v7.fr-en",
    "commoncrawl.fr-en",
    "un/undoc.2000.fr-en",
    "training/news-commentary-v9.fr-en",
    "giga-fren.release2.fixed",
]


def run(script, *args, check=True):
    return cli.run(WMT14 / script, *args, check=check, timeout=600)


def sentence(rng, lang, tag):
    words = [rng.choice(WORDS) for _ in range(rng.randint(4, 10))]
    left, right = QUOTES[lang]
    return f"{' '.join(words)} {left}{tag}{right} ."


def write_lines(path: Path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def fabricate_corpus(raw: Path, corpus: str, src: str, tgt: str, seed: int, gz=False):
    """N_GOOD good pairs, then one over 250 tokens, one with a length ratio of 6, one empty side."""
    rng = random.Random(seed)
    pairs = []
    for i in range(N_GOOD):
        state = rng.getstate()
        s = sentence(rng, src, f"good{seed}x{i}")
        rng.setstate(state)  # the same words on both sides
        pairs.append((s, sentence(rng, tgt, f"good{seed}x{i}")))
    pairs += [
        ("house " * 300, "house " * 300),
        ("house", "house garden river city bridge street"),
        ("house garden", ""),
    ]
    ext = ".gz" if gz else ""
    write_lines(raw / f"{corpus}.{src}{ext}", [p[0] for p in pairs])
    write_lines(raw / f"{corpus}.{tgt}{ext}", [p[1] for p in pairs])


def sgm(path: Path, segments, kind, lang):
    lines = [
        f'<{kind}set setid="newstest" srclang="any" trglang="{lang}">',
        '<doc sysid="ref" docid="doc1" genre="news" origlang="en">',
        "<p>",
    ]
    lines += [f'<seg id="{i}">{s}</seg>' for i, s in enumerate(segments, 1)]
    lines += ["</p>", "</doc>", f"</{kind}set>"]
    write_lines(path, lines)


def newstest_segments(src, tgt, n=14):
    """Test/dev segments: seg{i} marks the order; one over 250 tokens and one unbalanced pair,
    which a test set keeps; a word never seen in training, which BPE must split."""
    rng = random.Random(n)
    segs = {src: [], tgt: []}
    for i in range(1, n + 1):
        state = rng.getstate()
        for lang in (src, tgt):
            rng.setstate(state)
            segs[lang].append(sentence(rng, lang, f"seg{i}"))
    segs[src] += ["a very long test-sentence " * 80 + "seg15", "house seg16"]
    segs[tgt] += [
        "ein sehr langer Test-Satz " * 80 + "seg15",
        "Donaudampfschifffahrtsgesellschaftskapitän und noch viel mehr seg16",
    ]
    return segs


def fabricate_raw(raw: Path, src, tgt, corpora, pair_code, gz=()):
    for k, corpus in enumerate(corpora):
        fabricate_corpus(raw, corpus, src, tgt, seed=k, gz=corpus in gz)
    segs = newstest_segments(src, tgt)
    sgm(raw / f"test-full/newstest2014-{pair_code}-src.{src}.sgm", segs[src], "src", src)
    sgm(raw / f"test-full/newstest2014-{pair_code}-ref.{tgt}.sgm", segs[tgt], "ref", tgt)
    dev = newstest_segments(src, tgt, n=8)
    sgm(raw / f"dev/newstest2013-src.{src}.sgm", dev[src][:8], "src", src)
    sgm(raw / f"dev/newstest2013-ref.{tgt}.sgm", dev[tgt][:8], "ref", tgt)
    return segs


def tree_state(folder: Path, content=False):
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if content else p.stat().st_mtime_ns
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def read(path: Path):
    return path.read_text(encoding="utf-8").splitlines()


def unbpe(line):
    return re.sub(r"@@( |$)", "", line)


def check_binarised(dest: Path, src, tgt, n_train, n_valid, n_test):
    assert (dest / f"dict.{src}.txt").read_text() == (dest / f"dict.{tgt}.txt").read_text()  # joined
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        for lang in (src, tgt):
            assert len(MMapIndexedDataset(str(dest / f"{split}.{src}-{tgt}.{lang}"))) == n


@pytest.fixture(scope="module")
def en_de(tmp_path_factory):
    """prepare-wmt14en2de.sh from a raw folder, run twice."""
    root = tmp_path_factory.mktemp("wmt14_en_de")
    segs = fabricate_raw(root / "raw", "en", "de", DE_CORPORA, "deen")
    raw_before = tree_state(root / "raw", content=True)
    args = [
        "--raw-dir",
        root / "raw",
        "--prep-dir",
        root / "prep",
        "--dest-dir",
        root / "bin",
        "--bpe-tokens",
        SHORT_BPE,
        "--workers",
        "2",
    ]
    first = run("prepare-wmt14en2de.sh", *args)
    outputs = tree_state(root / "prep") | tree_state(root / "bin")
    second = run("prepare-wmt14en2de.sh", *args)
    return dict(root=root, segs=segs, first=first, second=second, outputs=outputs, raw_before=raw_before)


def test_en_de_binarised_with_a_joined_dictionary(en_de):
    check_binarised(en_de["root"] / "bin", "en", "de", n_train=3 * N_GOOD, n_valid=8, n_test=16)


def test_en_de_tokenised_with_aggressive_hyphen_splitting(en_de):
    prep = en_de["root"] / "prep"
    train = [unbpe(line) for line in read(prep / "train.en")]
    assert any("state @-@ of @-@ the @-@ art" in line for line in train)
    assert not any("state-of-the-art" in line for line in train)
    # punctuation normalised, then escaped as Moses does: “x” and „x“ both become &quot; x &quot;
    assert all("&quot; good" in line for line in train)
    assert not any(q in line for q in "“”„" for line in train + read(prep / "train.de"))


def test_en_de_cleaning_drops_exactly_the_bad_pairs(en_de):
    prep = en_de["root"] / "prep"
    en, de = read(prep / "train.en"), read(prep / "train.de")
    assert len(en) == len(de) == 3 * N_GOOD  # the long, the unbalanced, the half-empty pair gone
    tags = [re.search(r"good\d+x\d+", unbpe(line)).group() for line in en]
    assert tags == [f"good{k}x{i}" for k in range(3) for i in range(N_GOOD)]  # corpora in order
    for s, t in zip(en, de):
        assert unbpe(s).split(" ")[-3:] == unbpe(t).split(" ")[-3:]  # still aligned


def test_en_de_test_set_keeps_every_segment_in_order(en_de):
    prep, segs = en_de["root"] / "prep", en_de["segs"]
    # the raw reference, for sacreBLEU: exactly the SGML segments
    assert read(prep / "test.raw.de") == segs["de"]
    assert read(prep / "test.raw.en") == segs["en"]
    for lang in ("en", "de"):
        lines = [unbpe(line) for line in read(prep / f"test.{lang}")]
        assert len(lines) == 16
        assert [re.search(r"seg(\d+)", line).group(1) for line in lines] == [str(i) for i in range(1, 17)]
    assert len(read(prep / "test.de")[14].split()) > 250  # not cleaned
    assert read(prep / "valid.en")[0] and len(read(prep / "valid.de")) == 8


def test_en_de_bpe_applied_with_the_learned_codes(en_de):
    prep = en_de["root"] / "prep"
    assert len(read(prep / "code")) > 1
    for split in ("train", "valid", "test"):
        assert any("@@ " in line for line in read(prep / f"{split}.de")), split
    unseen = read(prep / "test.de")[15]  # a word never seen in training: split into units
    assert "@@" in unseen and "Donaudampfschifffahrtsgesellschaftskapitän" not in unseen
    assert "Donaudampfschifffahrtsgesellschaftskapitän" in unbpe(unseen)


def test_en_de_rerun_skips_every_step_and_never_touches_inputs(en_de):
    root = en_de["root"]
    assert tree_state(root / "prep") | tree_state(root / "bin") == en_de["outputs"]
    steps = [line for line in en_de["second"].stdout.splitlines() if line.startswith("==> ")]
    assert all(line.startswith(("==> raw files", "==> done", "==> raw newstest")) for line in steps)
    assert en_de["second"].stdout.count("(skip: ") >= 10
    assert tree_state(root / "raw", content=True) == en_de["raw_before"]


def test_missing_raw_file_is_named_before_any_work(tmp_path):
    fabricate_raw(tmp_path / "raw", "en", "de", DE_CORPORA, "deen")
    (tmp_path / "raw/commoncrawl.de-en.de").unlink()
    result = run(
        "prepare-wmt14en2de.sh",
        "--raw-dir",
        tmp_path / "raw",
        "--prep-dir",
        tmp_path / "prep",
        "--dest-dir",
        tmp_path / "bin",
        check=False,
    )
    assert result.returncode != 0
    assert "commoncrawl.de-en.de" in result.stderr
    assert not (tmp_path / "prep").exists()


def test_icml17_reads_news_commentary_v9(tmp_path):
    fabricate_raw(tmp_path / "raw", "en", "de", DE_CORPORA, "deen")  # v12, not v9
    result = run(
        "prepare-wmt14en2de.sh",
        "--icml17",
        "--raw-dir",
        tmp_path / "raw",
        "--prep-dir",
        tmp_path / "prep",
        "--dest-dir",
        tmp_path / "bin",
        check=False,
    )
    assert result.returncode != 0
    assert "training/news-commentary-v9.de-en.en" in result.stderr
    assert "v12" not in result.stderr


def make_archive(path: Path, staging: Path, members, dot_prefix=False, extra=()):
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz" if path.suffix == ".tgz" else "w") as tar:
        for m in [*members, *extra]:
            tar.add(staging / m, arcname=("./" + m) if dot_prefix else m)


@pytest.fixture(scope="module")
def en_fr(tmp_path_factory):
    """prepare-wmt14en2fr.sh from archives already in the download folder (offline): each is
    verified and only the needed members are extracted; giga-fren is read gzipped."""
    root = tmp_path_factory.mktemp("wmt14_en_fr")
    staging, orig = root / "staging", root / "orig"
    segs = fabricate_raw(staging, "en", "fr", FR_CORPORA, "fren", gz={"giga-fren.release2.fixed"})
    fabricate_corpus(staging, "training/europarl-v7.de-en", "en", "de", seed=9)  # not for En-Fr

    def pair(corpus, ext=""):
        return [f"{corpus}.en{ext}", f"{corpus}.fr{ext}"]

    make_archive(
        orig / "training-parallel-europarl-v7.tgz",
        staging,
        pair(FR_CORPORA[0]),
        extra=["training/europarl-v7.de-en.de"],
    )
    make_archive(orig / "training-parallel-commoncrawl.tgz", staging, pair(FR_CORPORA[1]))
    make_archive(orig / "training-parallel-un.tgz", staging, pair(FR_CORPORA[2]))
    make_archive(orig / "training-parallel-nc-v9.tgz", staging, pair(FR_CORPORA[3]))
    make_archive(orig / "training-giga-fren.tar", staging, pair(FR_CORPORA[4], ".gz"), dot_prefix=True)
    make_archive(orig / "dev.tgz", staging, ["dev/newstest2013-src.en.sgm", "dev/newstest2013-ref.fr.sgm"])
    make_archive(
        orig / "test-full.tgz",
        staging,
        ["test-full/newstest2014-fren-src.en.sgm", "test-full/newstest2014-fren-ref.fr.sgm"],
    )
    result = run(
        "prepare-wmt14en2fr.sh",
        "--download-dir",
        orig,
        "--no-checksum",
        "--prep-dir",
        root / "prep",
        "--dest-dir",
        root / "bin",
        "--bpe-tokens",
        SHORT_BPE,
        "--workers",
        "2",
    )
    return dict(root=root, segs=segs, result=result)


def test_en_fr_from_archives(en_fr):
    root = en_fr["root"]
    check_binarised(root / "bin", "en", "fr", n_train=5 * N_GOOD, n_valid=8, n_test=16)
    assert read(root / "prep/test.raw.fr") == en_fr["segs"]["fr"]
    for corpus in FR_CORPORA[:4]:
        assert (root / "orig" / f"{corpus}.fr").is_file()
    assert (root / "orig/giga-fren.release2.fixed.fr.gz").is_file()  # read as it ships
    assert not (root / "orig/training/europarl-v7.de-en.de").exists()  # only what En-Fr reads
    tags = [re.search(r"good(\d+)x", unbpe(line)).group(1) for line in read(root / "prep/train.fr")]
    assert sorted(set(tags)) == ["0", "1", "2", "3", "4"]  # all five corpora
    assert len(list((root / "orig").glob("*.verified"))) == 7


def test_damaged_or_unexpected_archive_is_refused(tmp_path):
    staging, orig = tmp_path / "staging", tmp_path / "orig"
    fabricate_corpus(staging, DE_CORPORA[0], "en", "de", seed=0)
    archive = orig / "training-parallel-europarl-v7.tgz"
    make_archive(archive, staging, [f"{DE_CORPORA[0]}.en", f"{DE_CORPORA[0]}.de"])
    args = ["--download-dir", orig, "--prep-dir", tmp_path / "prep", "--dest-dir", tmp_path / "bin"]
    # not the published archive: its checksum differs
    result = run("prepare-wmt14en2de.sh", *args, check=False)
    assert result.returncode != 0 and "checksum differs" in result.stderr
    # truncated: gzip's check fails even without checksums
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    result = run("prepare-wmt14en2de.sh", *args, "--no-checksum", check=False)
    assert result.returncode != 0 and "damaged" in result.stderr
    assert not (orig / "training-parallel-europarl-v7.tgz.verified").exists()


# --- train.sh ---

TINY = (
    "--encoder-embed-dim 16 --decoder-embed-dim 16 --encoder-ffn-embed-dim 32 --decoder-ffn-embed-dim 32 "
    "--encoder-attention-heads 2 --decoder-attention-heads 2"
).split()


def dry_run(*args):
    out = run("train.sh", "--dry-run", "--gpus", "0", "--total-num-update", "1000", *args).stdout
    command = shlex.split(out.strip().splitlines()[-1])
    return command[command.index("fairseq-train", command.index("-c") + 2) + 1 :], out


@pytest.mark.parametrize(
    "variant, depth, backbone, paths",
    [
        ("realformer", "6", "admin", "all"),
        ("admin", "12", "admin", "none"),
        ("post-ln", "18", "post-ln", "none"),
        ("pre-ln", "60-12", "pre-ln", "none"),
        ("t-fixup-realformer", "6", "t-fixup", "all"),
    ],
)
def test_variant_builds_the_table_7_model(variant, depth, backbone, paths):
    fairseq_args, _ = dry_run("--variant", variant, "--depth", depth, *TINY)
    args = options.parse_args_and_arch(options.get_training_parser(), ["/no/data", *fairseq_args[1:]])
    enc, _, dec = depth.partition("-")
    assert (args.encoder_layers, args.decoder_layers) == (int(enc), int(dec or enc))
    assert (args.backbone, args.residual_attention_paths) == (backbone, paths)
    assert args.lr_scheduler == "polynomial_decay" and args.power == 1 and args.max_epoch == 50
    assert args.share_all_embeddings and args.label_smoothing == 0.1 and args.lr == [5e-4]
    ARCH_MODEL_REGISTRY[args.arch].build_model(args, FakeTask(make_dictionary()))


def test_a_variant_sets_its_own_optimizer_and_schedule():
    fairseq_args, _ = dry_run("--variant", "admin-radam", *TINY)
    args = options.parse_args_and_arch(options.get_training_parser(), ["/no/data", *fairseq_args[1:]])
    assert (args.optimizer, args.warmup_updates, args.backbone, args.adam_betas) == ("radam", 0, "admin", "(0.9, 0.98)")


def test_update_freq_reaches_32k_tokens_and_en_fr_lr():
    fairseq_args, out = dry_run("--lang", "en-fr", "--cpu-procs", "2", "--max-tokens", "2048")
    args = options.parse_args_and_arch(options.get_training_parser(), ["/no/data", *fairseq_args[1:]])
    assert args.update_freq == [8] and args.distributed_world_size == 2  # 8 x 2048 x 2 = 32768
    assert args.lr == [1.2e-3] and (args.source_lang, args.target_lang) == ("en", "fr")
    assert "32768 tokens per update" in out


@pytest.mark.parametrize("precision, flags", [("bf16", ["--bf16"]), ("fp32", [])])
def test_precision_bf16_trains_in_bfloat16_mixed_precision(precision, flags):
    fairseq_args, _ = dry_run("--precision", precision, *TINY)
    assert [f for f in fairseq_args if f in ("--bf16", "--fp16")] == flags


def test_train_runs_two_cpu_ranks_that_really_train(en_de, tmp_path):
    """Two gloo processes: each takes 4 sentences per step, so a real 2-rank run logs bsz=8;
    two independent trainings would each log bsz=4 and save twice."""
    save = tmp_path / "ckpt"
    result = run(
        "train.sh",
        "--variant",
        "realformer",
        "--depth",
        "1",
        "--gpus",
        "0",
        "--cpu-procs",
        "2",
        "--master-port",  # not train.sh's default: a run beside it (another test worker) may hold that one
        cli.free_port(),
        "--data",
        en_de["root"] / "bin",
        "--save-dir",
        save,
        "--update-freq",
        "1",
        "--warmup",
        "2",
        *TINY,
        "--batch-size",
        "4",
        "--required-batch-size-multiple",
        "1",
        "--max-update",
        "3",
        "--log-interval",
        "1",
        "--num-workers",
        "0",
        "--no-progress-bar",
    )
    log = result.stdout + result.stderr
    assert "torchrun" in result.stdout and "--distributed-world-size 2" in result.stdout
    # 90 pairs / 4 per batch = 23 batches over 2 ranks = 12 updates an epoch, x 50 epochs
    assert "12 updates per epoch x 50 epochs: --total-num-update 600" in result.stdout
    assert "initialized host" in log and "as rank 1" in log
    assert "training on 2 devices" in log
    steps = re.findall(r"bsz=(\d+), num_updates=(\d+)", log)
    assert steps == [("8", "1"), ("8", "2"), ("8", "3")]
    assert len(re.findall(r"Saved checkpoint", log)) == 1
    assert (save / "checkpoint_last.pt").is_file() and (save / "train.log").is_file()


def test_a_refused_flag_leaves_no_save_dir(en_de, tmp_path):
    """train.sh makes the save dir for fairseq-train's --log-file; a run refused while fairseq
    parses its flags takes back what train.sh made. (--total-num-update given: train.sh does not
    count the updates of an epoch, whose parsing would refuse the flag before the folder exists.)"""
    result = run(
        "train.sh",
        "--variant",
        "realformer",
        "--depth",
        "1",
        "--gpus",
        "0",
        "--cpu-procs",
        "1",
        "--data",
        en_de["root"] / "bin",
        "--save-dir",
        tmp_path / "runs" / "ckpt",
        *TINY,
        "--total-num-update",
        "1000",
        "--residual-attention-paths",
        "encoder,foo",
        check=False,
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        "fairseq-train: error: --residual-attention-paths: unknown path 'foo'; give a comma list of encoder, "
        "decoder, cross, or all, or none"
    )
    assert not (tmp_path / "runs").exists()
