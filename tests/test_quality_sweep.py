"""studies/quality.py's learning-rate sweep: runs that diverge are stopped and recorded where they
diverged, each variant's best rate is chosen on validation BLEU, and its further seeds are trained
there. The recipe is replaced by a fake one that writes what run.sh writes, so no model trains."""

import gzip
import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from common import fairseq_log, results
from studies import figures, quality, recipe, supervise, tables
from studies.runs import Run, RunFolder
from studies.study import StudyRecord

from .cli import popen
from .helpers import REPO

INNER = (
    "2026-11-24 20:36:00 | INFO | train_inner | epoch {epoch:03d}:     50 / 132 loss={loss}, nll_loss=9.9, "
    "ppl=992.31, wps=3626.3, ups=1.05, wpb=3474.1, bsz=220.8, num_updates={updates}, lr=0.00025, gnorm=1.6"
)
EPOCH = (
    "2026-11-24 20:37:44 | INFO | train | epoch {epoch:03d} | loss {loss} | nll_loss 10.49 | ppl 1437.7 | "
    "wps 3003.1 | ups 0.87 | wpb 3464.6 | bsz 219.7 | num_updates {updates} | lr 0.00066 | train_wall 149 | wall 153"
)


def _parse(argv):
    """The Study quality.py makes of *argv*."""
    return quality.parse_args(argv)[0]


def _log(run_dir, *lines):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "train.log").write_text("".join(line + "\n" for line in lines))


def test_a_training_diverges_when_its_loss_is_not_finite_or_climbs_above_its_first_epoch(tmp_path):
    calm = tmp_path / "calm"
    _log(
        calm,
        INNER.format(epoch=1, loss=12.4, updates=50),
        EPOCH.format(epoch=1, loss=10.8, updates=132),
        INNER.format(epoch=2, loss=10.7, updates=150),
        EPOCH.format(epoch=2, loss=8.1, updates=264),
    )
    assert RunFolder(calm).divergence() is None  # epoch 1's own intervals are above its mean: that is no divergence

    climbed = tmp_path / "climbed"
    _log(
        climbed,
        INNER.format(epoch=1, loss=12.4, updates=50),
        EPOCH.format(epoch=1, loss=10.8, updates=132),
        INNER.format(epoch=2, loss=8.0, updates=150),
        INNER.format(epoch=2, loss=10.9, updates=200),
    )
    assert RunFolder(climbed).divergence() == {
        "update": 200,
        "epoch": 2,
        "loss": 10.9,
        "first_epoch_loss": 10.8,
        "reason": "the training loss climbed back above the first epoch's",
    }
    by_epoch = tmp_path / "by-epoch"
    _log(
        by_epoch,
        EPOCH.format(epoch=1, loss=10.8, updates=132),
        EPOCH.format(epoch=2, loss=9.0, updates=264),
        EPOCH.format(epoch=3, loss=11.2, updates=396),
    )
    assert RunFolder(by_epoch).divergence()["update"] == 396
    never_fell = tmp_path / "never-fell"  # a tiny run's second epoch, a little above its first: it never learnt
    _log(never_fell, EPOCH.format(epoch=1, loss=10.62, updates=4), EPOCH.format(epoch=2, loss=10.63, updates=8))
    assert RunFolder(never_fell).divergence() is None

    not_finite = tmp_path / "nan"
    _log(not_finite, INNER.format(epoch=1, loss=12.4, updates=50), INNER.format(epoch=1, loss="nan", updates=100))
    assert RunFolder(not_finite).divergence() == {
        "update": 100,
        "epoch": 1,
        "loss": "nan",
        "reason": "the training loss is not finite",
    }

    crashed = tmp_path / "crashed"  # fairseq-train stops on a non-finite gradient norm before it logs the loss
    _log(
        crashed,
        INNER.format(epoch=1, loss=12.4, updates=50),
        "Traceback (most recent call last):",
        "FloatingPointError: gradients are Nan/Inf",
    )
    assert RunFolder(crashed).divergence()["update"] == 51  # no crash.pt: one after the last update logged
    (crashed / "checkpoints").mkdir()
    torch.save({"optimizer_history": [{"num_updates": 73}]}, crashed / "checkpoints" / "crash.pt")
    assert RunFolder(crashed).divergence() == {
        "update": 74,
        "reason": "the gradients are NaN or infinite (fairseq-train stopped)",
    }


FAKE_RECIPE = (
    textwrap.dedent("""\
    #!/usr/bin/env bash
    # What examples/multi30k/run.sh leaves in RUN_DIR, without training: lr 0.002 makes post-ln's best
    # validation translation and makes realformer diverge (its log climbs, then it waits to be stopped).
    set -euo pipefail
    args=("$@")
    for i in "${!args[@]}"; do
      [ "${args[$i]}" = "--" ] && run=${args[$((i - 1))]}
      [ "${args[$i]}" = "--lr" ] && lr=${args[$((i + 1))]}
    done
    variant=post-ln; case "$run" in *realformer*) variant=realformer ;; esac
    echo "$lr" >> "$run/../../trained"
    log() { echo "$1" >> "$run/train.log"; }
    log "$(printf '%s' "EPOCH" | sed "s/{epoch:03d}/001/; s/{loss}/10.8/; s/{updates}/132/")"
    if [ "$variant-$lr" = realformer-0.002 ]; then
      log "$(printf '%s' "INNER" | sed "s/{epoch:03d}/002/; s/{loss}/9.5/; s/{updates}/150/")"
      log "$(printf '%s' "INNER" | sed "s/{epoch:03d}/002/; s/{loss}/11.5/; s/{updates}/200/")"
      sleep 60
      touch "$run/waited-for"  # only if the runner let it sleep on
      exit 1
    fi
    log "$(printf '%s' "EPOCH" | sed "s/{epoch:03d}/002/; s/{loss}/8.0/; s/{updates}/264/")"
    echo test_2016_flickr > "$run/test-sets"
    for set in val test_2016_flickr; do
      mkdir -p "$run/score/$set"
      printf 'a dog runs on the grass\\nthe man is riding a red bike\\n' > "$run/$set.de"
      subset=test; [ $set = val ] && subset=valid
      if [ "$set-$variant-$lr" = val-post-ln-0.002 ] || [ "$set-$variant-$lr" = val-realformer-0.001 ]; then
        cp "$run/$set.de" "$run/score/$set/$subset.hyp.de"; bleu=100.0
      else
        printf 'a dog runs on grass\\nthe man rides a bike\\n' > "$run/score/$set/$subset.hyp.de"; bleu=12.5
      fi
      # scores.json last and whole, as scripts/score.py moves it in: the runner polls for it
      echo "{\\"sacrebleu\\": $bleu, \\"sacrebleu_signature\\": \\"nrefs:1\\", \\"reference\\": \\"$run/$set.de\\"}" > "$run/score/$set/.scores.json"
      mv "$run/score/$set/.scores.json" "$run/score/$set/scores.json"
    done
    sleep 0.2  # then the session's scheduling group, as the runner has set it by now
    cat /proc/self/autogroup > "$run/autogroup" 2>/dev/null || true
""")
    .replace("EPOCH", EPOCH)
    .replace("INNER", INNER)
)


def test_a_sweep_stops_a_diverging_run_and_trains_more_seeds_at_each_variants_best_rate(tmp_path, monkeypatch):
    """--lr 1e-3,2e-3 --best-seeds 2: realformer diverges at 2e-3 and is stopped within seconds,
    recorded with its update, never retried; post-ln's best rate on validation BLEU is 2e-3 and
    realformer's 1e-3, and seed 2 trains there only; the report lists the divergence."""
    monkeypatch.setattr(recipe, "RECIPE", tmp_path / "fake_run.sh")
    monkeypatch.setattr(supervise, "WATCH_S", 0.2)
    monkeypatch.setattr(supervise.os, "nice", lambda increment: 7)  # the runner under `nice -n 7`
    recipe.RECIPE.write_text(FAKE_RECIPE)
    data = tmp_path / "data"
    (data / "bin").mkdir(parents=True)
    (data / "train.en.gz").touch()
    argv = [
        "--data",
        str(data),
        "--quick",
        "--variants",
        "post-ln,realformer",
        "--lr",
        "1e-3,2e-3",
        "--seeds",
        "1",
        "--best-seeds",
        "2",
        "--jobs",
        "2",
        "--out",
        str(tmp_path / "q"),
    ]
    args = _parse(argv)
    supervise.run_all(args, data)
    out = tmp_path / "q"
    assert not (out / "realformer-lr0.002" / "seed1" / "waited-for").exists(), "stopped, not waited for"
    trained = (out / "trained").read_text().split()
    assert sorted(trained) == ["0.001", "0.001", "0.001", "0.002", "0.002", "0.002"]  # 4 sweep runs, 2 at the best
    assert (out / "post-ln-lr0.002" / "seed2" / "score" / "val" / "scores.json").exists()
    assert (out / "realformer-lr0.001" / "seed2" / "score" / "val" / "scores.json").exists()
    assert not (out / "post-ln-lr0.001" / "seed2").exists() and not (out / "realformer-lr0.002" / "seed2").exists()
    if Path("/proc/self/autogroup").exists():  # Linux groups sessions: each run's session is niced as the runner
        groups = [p.read_text() for p in out.glob("*/seed*/autogroup")]
        assert len(groups) == 5 and all(g.split()[-2:] == ["nice", "7"] for g in groups), groups
    where = json.loads((out / "realformer-lr0.002" / "seed1" / "diverged.json").read_text())
    assert where["update"] == 200 and where["first_epoch_loss"] == 10.8

    supervise.run_all(args, data)  # run again: everything is finished or diverged, nothing trains
    assert len((out / "trained").read_text().split()) == 6
    assert args.record().best == {"post-ln": 2e-3, "realformer": 1e-3}
    # what dropout_gap.py --json leaves in a run folder (quality.py --dropout-gap): local paths become names
    rows = [(f"{out}/post-ln-lr0.001/seed1/checkpoints/checkpoint{e}.pt", 4 * e, 11.5, 6.9) for e in (1, 2)]
    rows.append((f"{out}/post-ln-lr0.001/seed1/checkpoints/checkpoint_avg.pt", 8, 10.9, 6.7))
    (out / "post-ln-lr0.001" / "seed1" / "dropout_gap.json").write_text(
        json.dumps(
            {
                "subset": "valid",
                "seed": 1,
                "rows": [{"checkpoint": c, "updates": u, "dropout_off": f, "dropout_on": n} for c, u, f, n in rows],
            }
        )
    )
    record = args.record()
    runs = record.runs
    assert [row["checkpoint"] for row in runs[0].dropout_gap["rows"]] == [
        "checkpoint1.pt",
        "checkpoint2.pt",
        "checkpoint_avg.pt",
    ]
    assert all(r.dropout_gap is None for r in runs[1:])
    assert [(r.label, r.seed, bool(r.diverged)) for r in runs] == [
        ("post-ln lr=0.001", 1, False),
        ("post-ln lr=0.002", 1, False),
        ("post-ln lr=0.002", 2, False),
        ("realformer lr=0.001", 1, False),
        ("realformer lr=0.001", 2, False),
        ("realformer lr=0.002", 1, True),
    ]
    assert (
        runs[1].val["sacrebleu"] == 100.0 and runs[1].val["chrf"] == pytest.approx(100.0) and runs[0].val["chrf"] < 100
    )

    table = tables.sweep_table(record)
    assert "| realformer | 0.002 | diverged at update 200 |" in table and "| post-ln ★ | 0.002 | " in table
    assert "| last checkpoint: valid loss, dropout off / on |" in table.splitlines()[4]
    assert table.splitlines()[6].endswith("| 10.900 / 6.700 (averaged) |")  # post-ln 1e-3: its record's last row
    assert table.splitlines()[7].endswith("| 264 | — |")  # post-ln 2e-3 has none
    no_gaps = tables.sweep_table(replace(record, runs=runs[1:]))
    assert "dropout" not in no_gaps  # a study without --dropout-gap: the table it always had
    assert [(r.label, r.seed) for r in record.compared] == [
        ("post-ln lr=0.002", 1),
        ("post-ln lr=0.002", 2),
        ("realformer lr=0.001", 1),
        ("realformer lr=0.001", 2),
    ]
    assert figures.sweep_figure(record, tmp_path / "fig", "s").stat().st_size > 10_000
    # the depth figure: this sweep's lines named by their depth, another sweep's dashed beside them
    test_set = record.test_names[0]
    deep = replace(record, settings=replace(record.settings, layers=12))
    shallow = replace(record, settings=replace(record.settings, layers=4))
    shallow.runs = [r for r in runs if r.variant == "post-ln" and r.seed == 1]
    lines = figures.sweep_lines([deep, shallow], test_set)
    assert [(x["label"], x["style"], x["lr"], x["diverged"]) for x in lines] == [
        ("post-ln (12+12 layers)", "-", [1e-3, 2e-3], []),
        ("realformer (12+12 layers)", "-", [1e-3], [(2e-3, 200)]),
        ("post-ln (4+4 layers)", "--", [1e-3, 2e-3], []),
        ("realformer (4+4 layers)", "--", [], []),
    ]
    assert lines[0]["bleu"] == [r.test_sets[test_set]["sacrebleu"] for r in shallow.runs]
    assert figures.sweep_figure(deep, tmp_path / "fig", "d", shallow).stat().st_size > 10_000


def test_the_description_names_the_depth_that_was_trained(tmp_path):
    """Figure titles and the JSON's "what": a deeper run of a preset reads as that depth, not as the
    preset's with a correction after it."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.en.gz").touch()

    def what(*flags):
        return (_parse(["--data", str(data), "--preset", "cpu", "--machine", "m", *flags])).describe()

    assert what().startswith("Multi30k en→de, 4+4 layers, d=128, FFN 256, 20 epochs, peak lr 0.002")
    deep = what("--layers", "12")
    assert deep.startswith("Multi30k en→de, 12+12 layers, d=128, FFN 256, 20 epochs") and "4+4" not in deep
    assert what("--layers", "4") == what()


def test_flags_that_cannot_work_together_are_refused_in_one_line(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.en.gz").touch()
    for flags, message in [
        (["--best-seeds", "2"], "--best-seeds: needs several --lr to choose from"),
        (["--lr", "1e-3,2e-3", "--best-seeds", "1,2"], "--best-seeds 1,2: the sweep's --seeds already train 1"),
        (["--lr", "1e-3,2e-3", "--best-seeds", "two"], "--best-seeds two: expected a comma list of integers, e.g. 2,3"),
        (["--best-variants", "admin"], "--best-variants: only with --best-seeds"),
        (
            ["--lr", "1e-3,2e-3", "--best-seeds", "2", "--variants", "admin,realformer", "--best-variants", "pre-ln"],
            "--best-variants pre-ln: give some of --variants (admin,realformer)",
        ),
        (["--widen"], "--widen: needs several --lr to widen"),
        # the recipe's --tiny and --published exclude each other: not the sentencepiece recipe in silence
        (
            ["--quick", "--preset", "published"],
            "--quick: the published recipe has no tiny form; drop --quick, or use --preset cpu",
        ),
    ]:
        with pytest.raises(SystemExit):
            quality.parse_args(["--data", str(data), *flags])
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith(message)


def _sweep(tmp_path, *flags):
    """quality.py and its arguments for a sweep of 2e-3 and 4e-3, seed 1, with *flags*, on a data
    folder that only has to exist."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.en.gz").touch()
    sweep = ["--data", str(data), "--out", str(tmp_path / "out"), "--lr", "2e-3,4e-3", "--seeds", "1"]
    return quality, data, _parse(sweep + list(flags))


def _recording_runner(trained, then=lambda config, seed: None):
    """A Runner that trains nothing: it appends each (label, seed) it is given to *trained*, in
    order, and calls *then*(config, seed) (e.g. to record the run's score)."""

    class Runner:
        stopping = False

        def __init__(self, args, data_dir):
            pass

        def run(self, config, seed):
            trained.append((config.label, seed))
            then(config, seed)

        def stop(self, *_):
            pass

    return Runner


def test_runs_that_cannot_train_are_each_named_and_keep_no_other_run_from_training(tmp_path, monkeypatch):
    """Two run folders refused (started with other settings): every other run of the study still
    trains, and the error names both folders, one line each, not only the first."""
    quality, data, args = _sweep(tmp_path, "--variants", "pre-ln,admin")
    trained = []

    class Runner(_recording_runner(trained)):
        def run(self, config, seed):
            super().run(config, seed)
            if config.variant == "pre-ln":
                return f"{args.run_folder(config, seed)} was started with other settings: choose another --out"

    monkeypatch.setattr(supervise, "Runner", Runner)
    with pytest.raises(SystemExit) as stopped:
        supervise.run_all(args, data)
    assert sorted(trained) == sorted((config.label, 1) for config in args.configs)
    lines = str(stopped.value).splitlines()
    assert sorted(lines) == sorted(
        f"quality.py: error: {args.run_folder(config, 1)} was started with other settings: choose another --out"
        for config in args.configs
        if config.variant == "pre-ln"
    )
    assert len(lines) == 2


def test_best_variants_alone_get_the_further_seeds_at_their_best_rate(tmp_path, monkeypatch):
    """--best-seeds 2,3 --best-variants pre-ln,admin: with every seed-1 run of the sweep recorded,
    only those two variants train further seeds, each at its best rate on validation BLEU, and
    seed 2 of both before seed 3."""
    quality, data, args = _sweep(
        tmp_path, "--best-seeds", "2,3", "--variants", "post-ln,pre-ln,admin", "--best-variants", "pre-ln,admin"
    )
    val = {("post-ln", 2e-3): 30.0, ("post-ln", 4e-3): 31.0, ("pre-ln", 2e-3): 35.0, ("pre-ln", 4e-3): 36.0}
    val.update({("admin", 2e-3): 37.0, ("admin", 4e-3): 34.0})
    runs = [Run(c.variant, c.lr, c.label, 1, val={"sacrebleu": val[c.variant, c.lr]}) for c in args.configs]
    trained = []
    monkeypatch.setattr(supervise, "Runner", _recording_runner(trained))
    args.jobs = 1
    supervise.run_all(args, data, StudyRecord(args.settings(), runs))
    assert trained == [("pre-ln lr=0.004", 2), ("admin lr=0.002", 2), ("pre-ln lr=0.004", 3), ("admin lr=0.002", 3)]


def test_a_stopped_runner_starts_no_queued_run_and_does_not_say_it_did(tmp_path, capsys, monkeypatch):
    """After Ctrl-C, a run still queued in the pool returns "stopped": no recipe starts, no "start"
    line is printed and no attempt is recorded in its folder (neither the log nor machines.jsonl
    may claim a run that never began)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.en.gz").touch()
    args = _parse(["--data", str(data), "--out", str(tmp_path / "out"), "--variants", "admin"])
    started = []
    monkeypatch.setattr(supervise.subprocess, "Popen", lambda *a, **k: started.append(a))
    runner = supervise.Runner(args, tmp_path)
    runner.stop(supervise.signal.SIGINT, None)
    assert runner.run(args.configs[0], 1) == "stopped"
    assert started == [] and " start " not in capsys.readouterr().out
    assert not (args.run_folder(args.configs[0], 1) / "machines.jsonl").exists()


def test_the_report_after_each_run_hides_no_line_the_runs_print(tmp_path, capsys, monkeypatch):
    """While the report after a finished run is written (its tables not printed), a run that
    starts in another thread still says so in the log (a stdout hidden for the report swallowed
    such a line)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.en.gz").touch()
    study, outputs = quality.parse_args(["--data", str(data), "--out", str(tmp_path / "out"), "--json", "x.json"])

    def report(*_, show=True):
        worker = threading.Thread(target=supervise.say, args=("start admin seed 5: RUN",))
        worker.start()
        worker.join()
        if show:
            print("the tables")

    monkeypatch.setattr(quality, "report", report)
    quality.report_so_far(study, outputs, [], {})
    out = capsys.readouterr().out
    assert "start admin seed 5: RUN" in out and "the tables" not in out and "the finished runs so far" in out


def test_fairseq_log_reads_its_stats_lines_in_both_log_formats():
    """common/fairseq_log.py, the one reader of fairseq-train's log: the same numbers from
    --log-format simple and json, json's train_/valid_ prefixes dropped, NaN kept, other lines None."""
    log = fairseq_log
    simple = [
        INNER.format(epoch=2, loss="nan", updates=150),
        EPOCH.format(epoch=2, loss=8.1, updates=264),
        "2026-11-24 20:37:50 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 7.9 | nll_loss 6.5 | "
        "num_updates 264 | best_loss 7.9",
    ]
    json_format = [
        '2026-11-24 | INFO | train_inner | {"epoch": 2, "update": 1.136, "loss": "nan", "num_updates": "150"}',
        '2026-11-24 | INFO | train | {"epoch": 2, "train_loss": "8.1", "train_num_updates": "264"}',
        '2026-11-24 | INFO | valid | {"epoch": 2, "valid_loss": "7.9", "valid_num_updates": "264"}',
    ]
    for lines in (simple, json_format):
        (inner_kind, inner), (epoch_kind, epoch), (valid_kind, valid) = log.records(lines)
        assert (inner_kind, epoch_kind, valid_kind) == ("train_inner", "train", "valid")
        assert inner["loss"] != inner["loss"] and inner["num_updates"] == 150 and inner["epoch"] == 2  # NaN
        assert (epoch["loss"], epoch["num_updates"], epoch["epoch"]) == (8.1, 264, 2)
        assert (valid["loss"], valid["num_updates"], valid["epoch"]) == (7.9, 264, 2)
    assert log.parse("2026-11-24 | INFO | fairseq.trainer | Saved checkpoint") is None
    assert list(log.records(simple, "valid")) == [log.parse(simple[2])]


def test_a_sweep_takes_a_single_rate_studys_runs_as_its_own_at_that_rate(tmp_path):
    """The committed 18+18 study trained seed 1 at 2e-3 alone; a sweep over 1e-3,2e-3 with the same
    settings counts those runs as its 2e-3 runs (under its labels) and trains only the rest. A
    study of other settings (another depth) gives nothing."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.en.gz").touch()
    translations = tmp_path / "hyp.de.gz"
    translations.touch()
    single = ["--data", str(data), "--preset", "cpu", "--layers", "18", "--variants", "admin,realformer"]
    runs = [
        {
            "variant": v,
            "lr": 0.002,
            "label": v,
            "seed": 1,
            "test_sets": {"t": {"translations": str(translations), "reference": str(translations)}},
        }
        for v in ("admin", "realformer")
    ]
    study = tmp_path / "study.json"
    settings = _parse([*single, "--lr", "2e-3"]).settings()
    study.write_text(json.dumps({"settings": settings.to_json(), "runs": runs, "machine": "VM A"}))
    sweep = _parse([*single, "--lr", "1e-3,2e-3", "--best-seeds", "2,3", "--json", str(study)])
    previous = sweep.previous()
    taken = sweep.record(previous).runs
    assert [(r.label, r.seed) for r in taken] == [("admin lr=0.002", 1), ("realformer lr=0.002", 1)]
    assert sweep.machines(previous) == f"VM A; later runs: {sweep.machine}"  # where its runs trained, and these
    sweep.machine = "VM A"
    assert sweep.machines(previous) == "VM A"
    sweep.machine, previous.machine = "VM B", "VM A; later runs: VM B"  # the next session's, on VM B again
    assert sweep.machines(previous) == "VM A; later runs: VM B", "the machines its first runs trained on were dropped"
    other_depth = _parse([*single[:-4], "--layers", "12", *single[-2:], "--lr", "1e-3,2e-3", "--json", str(study)])
    assert other_depth.previous() is None and other_depth.machines(None) == other_depth.machine


def test_a_runs_scores_are_read_once_and_again_when_it_is_rescored(tmp_path):
    """The runner reads every finished run's record each time a run finishes: its scores are
    computed once (the hypotheses gone, the record still reads), and again when scores.json is
    written anew (scripts/score.py rescoring it)."""
    run = RunFolder(tmp_path / "post-ln" / "seed1")
    scored = run.path / "score" / "t"
    scored.mkdir(parents=True)
    (tmp_path / "ref.de").write_text("a dog runs on the grass\n")
    (scored / "test.hyp.de").write_text("a dog runs on grass\n")
    (scored / "scores.json").write_text(
        json.dumps({"sacrebleu": 1.0, "sacrebleu_signature": "s", "reference": str(tmp_path / "ref.de")})
    )
    first = run.scores("t", "test", "de")
    (scored / "test.hyp.de").unlink()
    assert run.scores("t", "test", "de") == first and RunFolder(run.path).scores("t", "test", "de") == first
    (scored / "scores.json").write_text(json.dumps({"sacrebleu": 2.0, "sacrebleu_signature": "s", "reference": "r"}))
    with pytest.raises(FileNotFoundError):
        run.scores("t", "test", "de")


def test_a_run_resumes_whether_its_out_and_data_were_typed_relative_or_absolute(tmp_path, monkeypatch):
    """lr_depth_study.sh starts runs with absolute paths; the same study typed by hand from the
    checkout with relative --out and --data names the same run folders, so the run resumes rather
    than being refused as "started with other settings"."""
    data, out = tmp_path / "data", tmp_path / "runs" / "q"
    data.mkdir()
    (data / "train.en.gz").touch()
    (out / "data").mkdir(parents=True)
    (out / "data" / "updates_per_epoch").write_text("7\n")  # what quality.py counted on the data, cached
    flags = ["--preset", "cpu", "--variants", "admin"]
    typed_absolute = _parse(["--data", str(data), "--out", str(out), *flags])
    monkeypatch.chdir(tmp_path)
    typed_relative = _parse(["--data", "data", "--out", "runs/../runs/q", *flags])
    commands = [
        recipe.command(study, study.out / "data", study.configs[0], 1, study.run_folder(study.configs[0], 1))
        for study in (typed_absolute, typed_relative)
    ]
    assert commands[0] == commands[1] and {str(data), str(out / "admin" / "seed1")} <= set(commands[0])
    folder = RunFolder(typed_absolute.run_folder(typed_absolute.configs[0], 1))
    folder.path.mkdir(parents=True)
    assert folder.keep_command(commands[0][2:]) and folder.keep_command(commands[1][2:])


def test_widen_trains_the_rate_beyond_an_edge_and_chooses_among_the_three(tmp_path, monkeypatch):
    """--lr 2e-3,4e-3 --widen: pre-ln is best at 4e-3, an edge, so 8e-3 is trained too and, better
    still, is where its further seeds go; deepnorm is best at 2e-3, so 1e-3 is trained too and,
    worse, leaves it at 2e-3. Nothing else is trained beyond the edges."""
    quality, data, args = _sweep(tmp_path, "--best-seeds", "2,3", "--variants", "pre-ln,deepnorm", "--widen")
    val = {("pre-ln", 2e-3): 35.0, ("pre-ln", 4e-3): 36.0, ("pre-ln", 8e-3): 37.0}
    val.update({("deepnorm", 1e-3): 35.0, ("deepnorm", 2e-3): 36.0, ("deepnorm", 4e-3): 34.0})
    previous = StudyRecord(args.settings(), [])

    def record(config, seed):
        previous.runs.append(
            Run(config.variant, config.lr, config.label, seed, val={"sacrebleu": val[config.variant, config.lr]})
        )

    for config in args.configs:
        record(config, 1)
    trained = []
    monkeypatch.setattr(supervise, "Runner", _recording_runner(trained, then=record))
    args.jobs = 1
    reports = []  # quality.py reports (and writes --json) each time runs finish: commit them as they come
    supervise.run_all(args, data, previous, lambda record: reports.append(len(record.runs)))
    assert trained[:2] == [("pre-ln lr=0.008", 1), ("deepnorm lr=0.001", 1)]
    assert reports and reports[0] in (5, 6) and reports[-1] == 10  # after the first (or two), and the last
    assert sorted(trained[2:]) == sorted(
        [("pre-ln lr=0.008", s) for s in (2, 3)] + [("deepnorm lr=0.002", s) for s in (2, 3)]
    )
    assert args.record(previous).best == {"pre-ln": 8e-3, "deepnorm": 2e-3}
    assert args.settings().to_json()["widen"] is True and args.settings().lrs == [2e-3, 4e-3]


# the last commit before the studies left benchmarks/ (issue 71): run folders it made must resume
PRE_MOVE = "cf180b5"
RESUMING_RECIPE = textwrap.dedent("""\
    #!/usr/bin/env bash
    # run.sh's resumable training, without training: epoch 1 and its checkpoint, then it waits to be
    # stopped; called again, it resumes from the checkpoint, logs epoch 2 and scores the test set.
    set -euo pipefail
    case " $* " in *" --prepare-only "*) mkdir -p "${@: -1}/bin"; exit 0 ;; esac
    args=("$@")
    for i in "${!args[@]}"; do [ "${args[$i]}" = "--" ] && run=${args[$((i - 1))]}; done
    log() { echo "$1" | sed "s/^2026-11-24 20:37:44/$(date '+%Y-%m-%d %H:%M:%S')/" >> "$run/train.log"; }
    log "2026-11-24 20:37:44 | INFO | fairseq_cli.train | {'_name': None}"
    if [ ! -e "$run/checkpoints/checkpoint_last.pt" ]; then
      mkdir -p "$run/checkpoints"; touch "$run/checkpoints/checkpoint_last.pt"  # saved, then logged
      log "$(printf '%s' "EPOCH" | sed "s/{epoch:03d}/001/; s/{loss}/10.8/; s/{updates}/132/")"
      sleep 60
      exit 1
    fi
    log "resumed from $run/checkpoints/checkpoint_last.pt"
    log "$(printf '%s' "EPOCH" | sed "s/{epoch:03d}/002/; s/{loss}/8.0/; s/{updates}/264/")"
    echo test_2016_flickr > "$run/test-sets"
    for set in val test_2016_flickr; do
      mkdir -p "$run/score/$set"
      printf 'a dog runs on the grass\\n' > "$run/$set.de"
      subset=test; [ $set = val ] && subset=valid
      printf 'a dog runs on grass\\n' > "$run/score/$set/$subset.hyp.de"
      echo "{\\"sacrebleu\\": 12.5, \\"sacrebleu_signature\\": \\"nrefs:1\\", \\"reference\\": \\"$run/$set.de\\"}" \\
        > "$run/score/$set/.scores.json"
      mv "$run/score/$set/.scores.json" "$run/score/$set/scores.json"  # whole, as scripts/score.py moves it in
    done
""").replace("EPOCH", EPOCH)


# (commit, its quality.py, what it needs): the runner before the studies moved out of benchmarks/
# (issue 71), and before a study became one StudyRecord (issue 87)
BEFORE = [
    (PRE_MOVE, "benchmarks/quality.py", ["benchmarks", "fairseq_realformer/variants.py"]),
    ("c948141", "studies/quality.py", ["studies", "common", "fairseq_realformer/variants.py"]),
]


@pytest.mark.parametrize("commit, script, paths", BEFORE, ids=["issue-71", "issue-87"])
def test_a_run_folder_made_before_a_change_resumes_under_the_new_command(tmp_path, monkeypatch, commit, script, paths):
    """Runs train across changes of the runner (issue 71 moved the studies from benchmarks/ to
    studies/ while 18+18 runs were training): a run the old quality.py started (and was stopped in)
    finishes under studies/quality.py with the same flags. The same recipe arguments (its `command`
    record), its attempts and machines appended to, its epochs kept, and the study's JSON written."""
    old = tmp_path / "old-checkout"
    old.mkdir()
    archive = subprocess.run(["git", "-C", str(Path(REPO)), "archive", commit, *paths], capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"no git history with {commit} (a shallow clone?): {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
    fake = old / "examples" / "multi30k" / "run.sh"
    fake.parent.mkdir(parents=True)
    fake.write_text(RESUMING_RECIPE)
    data, out = tmp_path / "data", tmp_path / "q"
    data.mkdir()
    (data / "train.en.gz").touch()
    flags = ["--data", str(data), "--quick", "--variants", "realformer", "--out", str(out), "--machine", "m"]

    before = popen(old / script, *flags, cwd=tmp_path, env={"REALFORMER_VENV": sys.prefix})
    train_log = out / "realformer" / "seed1" / "train.log"
    for _ in range(1200):  # the old runner's recipe has logged epoch 1 and saved its checkpoint
        if (train_log.exists() and "epoch 001" in train_log.read_text()) or before.poll() is not None:
            break
        time.sleep(0.1)
    assert before.poll() is None and "epoch 001" in train_log.read_text(), before.communicate(timeout=60)[0]
    before.send_signal(signal.SIGTERM)
    assert before.wait(timeout=60) == 130, before.stdout.read()

    monkeypatch.setattr(recipe, "RECIPE", tmp_path / "run.sh")
    recipe.RECIPE.write_text(RESUMING_RECIPE)
    quality.main([*flags, "--json", str(tmp_path / "study.json")])
    run_dir = out / "realformer" / "seed1"
    assert "resumed from" in train_log.read_text() and (run_dir / "score" / "val" / "scores.json").exists()
    assert len((run_dir / "attempts.jsonl").read_text().splitlines()) == 2
    assert len((run_dir / "machines.jsonl").read_text().splitlines()) == 2
    (run,) = json.loads((tmp_path / "study.json").read_text())["runs"]
    assert (run["updates"], run["epochs"], run["attempts"]) == (264, 2, 2)


def test_a_results_command_names_the_checkouts_paths_from_its_root():
    """A result JSON's command runs in any clone: the script, and paths inside the checkout, from its
    root; paths outside it as given."""
    argv = ["--out", str(Path(REPO) / "runs" / "depth-18"), "--data", "/elsewhere/multi30k", "--lr", "2e-3"]
    command = results.header(Path(REPO) / "studies" / "quality.py", argv, "m")["command"]
    assert command == "python studies/quality.py --out runs/depth-18 --data /elsewhere/multi30k --lr 2e-3"


def test_two_studies_into_one_out_train_its_jobs_runs_between_them(tmp_path, monkeypatch):
    """Two quality.py studies started side by side into one --out (the 18+18 runner's ADMIN and
    RealFormer seeds beside Pre-LN and DeepNorm): while the first trains --jobs runs the second's
    run waits, recording nothing; it starts as soon as one of them ends, and a stop while it waits
    starts nothing."""
    monkeypatch.setattr(supervise, "SLOT_WAIT_S", 0.05)
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.en.gz").touch()
    out = ["--data", str(data), "--out", str(tmp_path / "out"), "--jobs", "2"]
    first, second = (_parse(out + ["--variants", variants]) for variants in ("admin,realformer", "pre-ln,deepnorm"))
    training = supervise.Runner(first, data)
    held = [training.take_slot(f"{variant} seed 1") for variant in ("admin", "realformer")]
    started = []
    monkeypatch.setattr(supervise.subprocess, "Popen", lambda *a, **k: started.append(a) or 1 / 0)
    waiting = supervise.Runner(second, data)
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(waiting.take_slot("pre-ln seed 1")))
    worker.start()
    worker.join(0.5)
    assert worker.is_alive() and not outcome, "a third run started beside the first study's two"
    held.pop().close()  # the first study's realformer run ends
    worker.join(5)
    assert outcome and outcome[0] is not None, "the freed slot was not taken"
    for slot in (*held, outcome.pop()):
        slot.close()
    held = [training.take_slot("admin seed 2"), training.take_slot("realformer seed 2")]

    stopped = supervise.Runner(second, data)
    worker = threading.Thread(target=lambda: outcome.append(stopped.run(second.configs[1], 1)))
    worker.start()
    worker.join(0.5)
    assert worker.is_alive(), "deepnorm started though both slots are taken"
    stopped.stop(supervise.signal.SIGTERM, None)
    worker.join(5)
    assert outcome[-1] == "stopped" and started == []
    assert not (second.run_folder(second.configs[1], 1) / "machines.jsonl").exists()
    for slot in held:
        slot.close()


def test_a_study_writes_its_json_after_each_run_not_only_the_first(tmp_path):
    """quality.py writes --json each time a run finishes, all in one process. The second write
    failed (KeyError 'hypotheses': the first had dropped the local paths from the recorded runs
    themselves), so a run that finished later in a long-lived runner never reached the JSON."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.en.gz").touch()
    with gzip.open(data / "test_2016_flickr.de.gz", "wt") as f:
        f.write("a dog runs on the grass\nthe man is riding a red bike\n")
    study_json = tmp_path / "study.json"
    argv = ["--data", str(data), "--out", str(tmp_path / "out"), "--variants", "admin,realformer"]
    study, outputs = quality.parse_args([*argv, "--json", str(study_json)])
    runs = []
    for variant, line in (("admin", "a dog runs\nthe man rides\n"), ("realformer", "a dog runs on grass\nthe man\n")):
        hypotheses = tmp_path / f"{variant}.de"
        hypotheses.write_text(line)
        score = {"sacrebleu": 30.0, "chrf": 50.0, "bleu_lc": 30.5, "translations": str(hypotheses)}
        score["reference"] = str(data / "test_2016_flickr.de.gz")  # as RunFolder.scores names it
        run = {"variant": variant, "lr": study.lrs[0], "label": study.labels[0 if variant == "admin" else 1], "seed": 1}
        run.update(folder=f"{variant}/seed1", best_valid_loss=4.4, updates=2640, wall_s=60.0, tokens_per_s=900.0)
        runs.append({**run, "test_sets": {"test_2016_flickr": score}})
    study_json.write_text(json.dumps({"settings": study.settings().to_json(), "runs": runs, "machine": "VM A"}))
    record = study.record(study.previous())
    quality.report(study, outputs, [], record, show=False)  # after the first run that finishes
    first = json.loads(study_json.read_text())
    quality.report(study, outputs, [], record, show=False)  # and after the next: it failed here
    again = json.loads(study_json.read_text())
    assert [c["a"] for c in again["comparisons"]] == ["realformer"] and again["runs"] == first["runs"]
    assert all("hypotheses" not in s for r in again["runs"] for s in r["test_sets"].values())  # no local paths
    assert (tmp_path / "study" / "admin.seed1.test_2016_flickr.de.gz").exists()
