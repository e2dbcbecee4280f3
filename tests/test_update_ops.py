"""The fast update's host work, counted (fairseq_realformer/optim/fast_update.py): in fairseq-train's own
trainer, one update of a tiny RealFormer dispatches a few multi-tensor ops for Adam's step and
the gradient norm, however many parameter tensors the model has; with ``--fairseq-update``
fairseq's Python loops dispatch ~7 ops a tensor for the step and one norm a tensor. The counting
is benchmarks/update_ops.py's (a ``TorchDispatchMode`` inside ``Trainer.train_step``, phases by
what the trainer calls), run here in-process on the toy fixture: 2+2 and 4+4 layers, each way.

A regression that brings back a per-tensor loop fails twice: the fast path's counts stop being
the same at both depths, and its totals pass today's counts by more than ``MARGIN``. Last, the
report of the committed CPU run (benchmarks/update_report.py) still gives RESULTS.md its numbers."""

import json
from pathlib import Path

import pytest

from benchmarks import update_ops, update_report
from common.repo import VARIANTS

from .cli import OPTIMIZE, TINY
from .helpers import USER_DIR
from .test_compat import FIXTURES

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
RUN_SECONDS = 15  # four in-process fairseq-train runs of 2 updates (tests/conftest.py)
COUNTED = 2  # the second update: the first also creates Adam's state (zeros_like a tensor)
# today's ops per update (2026-12-01, torch 2.13, ve-fairseq 0.12.3): the fast path's total at 2+2
# and 4+4 layers (95 and 189 parameter tensors; --fairseq-update: 1,357 and 2,541); a per-tensor
# loop brought back adds at least one op a tensor, 16 % and 18 % of these
TODAY = {2: 605, 4: 1037}
MARGIN = 1.05
FAST_STEP_OPS = 7  # ForeachAdam: one op per line of Adam's formula, one bucket (every tensor at one step)
FAST_NORM_OPS = 8  # _foreach_norm, stack, norm, the clip coefficient (add, reciprocal, mul, clamp_), _foreach_mul_


def count(tmp_path, layers, *flags):
    """Ops per phase of update COUNTED of a RealFormer with *layers* + *layers* layers."""
    depth = [f"--{side}-layers" for side in ("encoder", "decoder")]
    argv = [
        FIXTURES / "bin",
        *("--user-dir", USER_DIR, "--arch", "realformer_iwslt_de_en"),
        *VARIANTS["realformer"],
        *TINY,
        *(depth[0], layers, depth[1], layers),
        *OPTIMIZE,
        *("--max-update", COUNTED, "--clip-norm", "1.0", "--disable-validation", "--no-save", "--cpu"),
        *("--save-dir", tmp_path / f"{layers}{''.join(flags)}"),
        *flags,
    ]
    summary = update_ops.fairseq_train_in_process(argv, update_ops.Instrument(count=[COUNTED]))
    assert summary["counted_updates"] == [COUNTED]
    return summary


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    """{(layers, "fast" or "fairseq"): summary}."""
    tmp_path = tmp_path_factory.mktemp("update-ops")
    return {
        (layers, way): count(tmp_path, layers, *([] if way == "fast" else ["--fairseq-update"]))
        for layers in (2, 4)
        for way in ("fast", "fairseq")
    }


def test_the_fast_step_and_norm_are_a_few_ops_at_any_depth(counts):
    for layers in (2, 4):
        ops = counts[layers, "fast"]["ops"]
        assert ops["optimizer"] == FAST_STEP_OPS, ops
        assert ops["grad_norm"] == FAST_NORM_OPS, ops
    assert counts[4, "fast"]["tensors"] > counts[2, "fast"]["tensors"]


def test_fairseqs_step_and_norm_loop_over_the_tensors(counts):
    for layers in (2, 4):
        ops, tensors = counts[layers, "fairseq"]["ops"], counts[layers, "fairseq"]["tensors"]
        assert ops["optimizer"] == 7 * tensors, (ops, tensors)  # mul_, add_, mul_, addcmul_, sqrt, add_, addcdiv_
        assert ops["grad_norm"] >= tensors, (ops, tensors)  # a norm a tensor
    grown = counts[4, "fairseq"]["ops"]["optimizer"] - counts[2, "fairseq"]["ops"]["optimizer"]
    assert grown == 7 * (counts[4, "fairseq"]["tensors"] - counts[2, "fairseq"]["tensors"])


def test_only_the_update_changes(counts):
    """The forward, the loss and the backward are the model's: the same ops either way."""
    for layers in (2, 4):
        fast, fairseq = counts[layers, "fast"]["ops"], counts[layers, "fairseq"]["ops"]
        assert {p: fast[p] for p in ("forward", "loss", "backward", "rest")} == {
            p: fairseq[p] for p in ("forward", "loss", "backward", "rest")
        }


def test_totals_stay_within_todays(counts):
    for layers, today in TODAY.items():
        total = counts[layers, "fast"]["ops"]["total"]
        assert total <= MARGIN * today, f"{layers}+{layers} layers: {total} ops an update, today {today}"
        # and the fast path saves what fairseq's loops cost: at least 7 ops a tensor
        saved = counts[layers, "fairseq"]["ops"]["total"] - total
        assert saved >= 7 * counts[layers, "fast"]["tensors"], saved


def test_the_committed_runs_report_gives_results_md_its_table():
    """RESULTS.md's ops / ms per phase at d=16 are the report of cpu-train-update-ops.json rendered
    again: its ATen ops to the op, its host ms to the 0.1 ms RESULTS.md rounds them to."""
    result = json.loads((BENCHMARKS / "results" / "cpu-train-update-ops.json").read_text())
    tables = update_report.report(result["runs"]).strip().split("\n\n")

    def rendered(title):  # the report's table under *title*: {a phase's first word: its cells}
        rows = next(table for table in tables if table.startswith(title)).splitlines()[3:]
        cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
        return {label.split()[0]: values for label, *values in cells}

    results_md = (BENCHMARKS / "RESULTS.md").read_text()
    committed = results_md.split("ATen ops per update / host ms per phase, d=16")[1].split("\n\n")[1]
    checked = 0
    for row in committed.splitlines()[2:]:
        label, *cells = [cell.strip().replace("**", "") for cell in row.strip("|").split("|")]
        if label.startswith(("6L-6L ", "18L-18L ")):  # a size's first row
            size, label = label.split(maxsplit=1)
            ops, ms = rendered(f"{size}:16: ATen ops"), rendered(f"{size}:16: host ms")
        phase = label.split()[0]
        if phase == "×":
            continue  # the share: the report's table gives it to 2 digits, its checks to 3
        for cell, want_ops, want_ms in zip(cells, ops[phase], ms[phase], strict=True):
            got_ops, got_ms = cell.split(" / ")
            assert got_ops == want_ops, (size, phase)
            assert float(got_ms.replace(",", "")) == pytest.approx(float(want_ms.replace(",", "")), abs=0.051)
            checked += 1
    assert checked == 2 * 7 * 4  # two sizes, seven rows, four configurations
