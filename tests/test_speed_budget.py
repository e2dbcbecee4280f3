"""The GPU command's budget (benchmarks/budget.py), with a fake clock and fake variants: nothing is
built or compiled. A lent GPU has minutes; the run must write the question's pair first, whatever
the budget, and skip (with the reason in the JSON) what it cannot finish, instead of being killed
in the middle of it."""

import json

import pytest

from benchmarks import budget

VARIANTS = ["fairseq", "realformer+compiled", "realformer", "fairseq+compiled", "admin", "admin+compiled"]
CELLS = [budget.Cell("6L-6L", 6, 30, 4096), budget.Cell("6L-6L", 6, 30, 16384), budget.Cell("18L-18L", 18, 30, 4096)]


class FakeGPU:
    """Each timing takes STEP_S × the cell's work (relative to the first cell) and, the first time
    a compiled variant is seen, COMPILE_S more; a memory probe takes PROBE_S. Every call is logged,
    and every ``written`` call saves the JSON as speed.py does."""

    STEP_S, COMPILE_S, PROBE_S = 5.0, 100.0, 2.0
    fresh_probes = False  # as on a GPU: measured in this process

    def __init__(self, tmp_path):
        self.now, self.calls, self.compiled, self.path = 0.0, [], set(), tmp_path / "speed.json"
        self.failing = set()

    def clock(self):
        return self.now

    def compiles(self, variant):
        return variant.endswith("+compiled")

    def time(self, variant, cell):
        if variant in self.failing:
            self.now += 1.0
            raise RuntimeError(f"{variant} does not compile here\n(a long traceback)")
        compile_s = self.COMPILE_S if self.compiles(variant) and variant not in self.compiled else 0.0
        self.compiled.add(variant) if self.compiles(variant) else None
        steps_s = self.STEP_S * cell.work() / CELLS[0].work()
        self.now += compile_s + steps_s
        self.calls.append(("time", variant, cell.tokens, cell.layers))
        return {"variant": variant, "tokens_per_batch": cell.tokens, "compile_s": compile_s, "steps_s": steps_s}

    def end_timings(self, cell):
        self.calls.append(("end", cell.tokens, cell.layers))

    def probe(self, variant, cell):
        self.now += self.PROBE_S
        self.calls.append(("probe", variant, cell.tokens, cell.layers))
        return 1000

    def written(self, records, skipped):
        self.path.write_text(json.dumps({"runs": records, "skipped": skipped}))

    def saved(self):
        return json.loads(self.path.read_text())


def run(gpu, seconds, guess=120.0):
    clock = budget.Budget(seconds, clock=gpu.clock)
    expected = budget.Expected(compile_guess_s=guess, setup_guess_s=30.0, baseline="fairseq")
    return budget.run(CELLS, VARIANTS, gpu, clock, expected, gpu.written)


def test_with_too_little_time_the_pair_is_still_written_and_the_rest_skipped_with_the_reason(tmp_path):
    gpu = FakeGPU(tmp_path)
    records, skipped = run(gpu, seconds=60)  # less than the compiled RealFormer's compile alone
    saved = gpu.saved()
    assert [r["variant"] for r in saved["runs"]] == ["fairseq", "realformer+compiled"]
    assert saved["runs"] == records and saved["skipped"] == skipped
    # the pair's timings came before anything else, memory included
    assert gpu.calls[:2] == [("time", "fairseq", 4096, 6), ("time", "realformer+compiled", 4096, 6)]
    # nothing else started; every variant of every cell, and the pair's memory, is in "skipped"
    assert [c for c in gpu.calls if c[0] != "end"] == gpu.calls[:2]
    timing_skips = {(s["variant"], s["tokens_per_batch"], s["size"]) for s in skipped if s["what"] == "timing"}
    assert len(timing_skips) == 4 + 2 * len(VARIANTS)
    assert {s["variant"] for s in skipped if s["what"] == "memory"} == {"fairseq", "realformer+compiled"}
    for s in skipped:  # what did not fit, or a cell whose fairseq did not fit
        assert (
            s["reason"].startswith("expected ")
            and " left" in s["reason"]
            or (
                s["reason"] == "no fairseq at this cell to compare with"
                and (s["size"], s["tokens_per_batch"]) != ("6L-6L", 4096)
            )
        )


def test_the_order_answers_the_question_first_and_a_probe_follows_its_cells_timings(tmp_path):
    gpu = FakeGPU(tmp_path)
    records, skipped = run(gpu, seconds=None)  # no limit: everything, in order
    assert not skipped
    timings = [c[1] for c in gpu.calls if c[0] == "time" and c[2:] == (4096, 6)]
    assert timings == VARIANTS
    first_probe = gpu.calls.index(("probe", "fairseq", 4096, 6))
    assert gpu.calls[first_probe - 1] == ("end", 4096, 6)  # after every timing of its cell
    assert gpu.calls.index(("time", "fairseq", 16384, 6)) > gpu.calls.index(("probe", "admin+compiled", 4096, 6))
    assert gpu.calls[-1] == ("probe", "admin+compiled", 4096, 18)  # ~16k, then 18L-18L
    assert all(r["peak_mem_bytes"] == 1000 for r in records)


def test_a_variant_starts_only_if_its_expected_time_fits(tmp_path):
    """With 300 s: the pair (5 + 105 s), realformer eager (5 s), then fairseq+compiled expected
    at the longest compile seen (100 s + twice fairseq's 5 s, × 1.25 = 137.5 s) fits in 185 s left;
    admin fits; admin+compiled (137.5 s) does not fit in 75 s and is skipped; the memory probes,
    in this process, expect no compiling; the next cell's compiled RealFormer, whose graphs are
    made, expects none either and is measured."""
    gpu = FakeGPU(tmp_path)
    records, skipped = run(gpu, seconds=300)
    first = [r["variant"] for r in records if r["tokens_per_batch"] == 4096][:5]
    assert first == ["fairseq", "realformer+compiled", "realformer", "fairseq+compiled", "admin"]
    skip = next(s for s in skipped if s["variant"] == "admin+compiled")
    assert skip["tokens_per_batch"] == 4096 and skip["what"] == "timing"
    assert "compiling 100 s, the longest seen" in skip["reason"]
    at_16k = [r["variant"] for r in records if r["tokens_per_batch"] == 16384]
    assert "realformer+compiled" in at_16k  # compiled before: no compile expected again
    assert {s["variant"] for s in skipped if s["what"] == "memory" and s["tokens_per_batch"] == 4096} == set()
    assert gpu.now <= 300 + 2  # never started what it expected not to finish (a probe is 2 s)


def test_the_first_compile_is_expected_from_the_guess_then_from_what_was_seen():
    expected = budget.Expected(compile_guess_s=120.0, setup_guess_s=30.0, baseline="fairseq")
    cell, bigger = CELLS[0], CELLS[2]
    seconds, why = expected.timing("fairseq", cell, compiles=False)
    assert seconds == pytest.approx(1.25 * 30.0) and "the guess" in why
    expected.saw_timing("fairseq", cell, seconds=4.0, compile_s=0.0, steps_s=4.0)
    seconds, why = expected.timing("realformer+compiled", cell, compiles=True)
    assert seconds == pytest.approx(1.25 * (120.0 + 2 * 4.0)) and "the guess" in why
    expected.saw_timing("realformer+compiled", cell, seconds=70.0, compile_s=60.0, steps_s=10.0)
    seconds, why = expected.timing("admin+compiled", cell, compiles=True)
    assert seconds == pytest.approx(1.25 * (60.0 + 8.0)) and "longest seen" in why
    # its own graphs are made: a 3x larger cell expects 3x the rest and no compiling
    assert expected.timing("realformer+compiled", bigger, compiles=True)[0] == pytest.approx(1.25 * 30.0)
    expected.saw_timing("realformer+compiled", bigger, seconds=40.0, compile_s=10.0, steps_s=30.0)  # compiled again
    assert expected.timing("realformer+compiled", bigger, compiles=True)[0] == pytest.approx(1.25 * (10.0 + 30.0))


def test_a_memory_probe_in_a_fresh_process_expects_to_compile_again():
    expected = budget.Expected(compile_guess_s=120.0, setup_guess_s=30.0, baseline="fairseq")
    assert expected.probe("realformer+compiled", (105.0, 100.0), fresh=True)[0] == pytest.approx(1.25 * 105.0)
    assert expected.probe("realformer+compiled", (105.0, 100.0), fresh=False)[0] == pytest.approx(1.25 * 5.0)
    expected.saw_probe("realformer+compiled", 40.0)
    assert expected.probe("realformer+compiled", (105.0, 100.0), fresh=True)[0] == pytest.approx(1.25 * 40.0)


def test_a_variant_that_fails_is_kept_with_its_error_and_the_others_go_on(tmp_path):
    gpu = FakeGPU(tmp_path)
    gpu.failing = {"fairseq+compiled"}
    records, skipped = run(gpu, seconds=None)
    assert "fairseq+compiled" not in {r["variant"] for r in records}
    failures = [s for s in skipped if s["variant"] == "fairseq+compiled"]
    assert [s["reason"] for s in failures] == ["failed: RuntimeError: fairseq+compiled does not compile here"] * 3
    assert {r["variant"] for r in records} == set(VARIANTS) - {"fairseq+compiled"}
    assert gpu.saved()["skipped"] == skipped


def test_only_the_training_steps_grow_with_a_cells_work():
    """Building a model and its first step take about as long at ~16k tokens as at ~4k; the
    training steps are what grows (at most with the work: on a GPU waiting on the host, less)."""
    expected = budget.Expected(compile_guess_s=120.0, setup_guess_s=30.0, baseline="fairseq")
    expected.saw_timing("fairseq", CELLS[0], seconds=10.0, compile_s=0.0, steps_s=2.0)
    assert expected.timing("fairseq", CELLS[1], compiles=False)[0] == pytest.approx(1.25 * (8.0 + 4 * 2.0))


def test_a_cell_without_its_baseline_is_skipped(tmp_path):
    gpu = FakeGPU(tmp_path)
    gpu.failing = {"fairseq"}
    records, skipped = run(gpu, seconds=None)
    assert [r["variant"] for r in records] == []
    assert [c for c in gpu.calls if c[0] == "time"] == []
    others = [s for s in skipped if s["variant"] != "fairseq"]
    assert len(others) == 5 * len(CELLS)
    assert {s["reason"] for s in others} == {"no fairseq at this cell to compare with"}
