"""A benchmark that keeps its own time: it measures in the order that answers its question first
and starts a measurement only if it is expected to fit in the seconds left, so that a run with a
hard limit (a lent GPU's few minutes) ends with what it measured instead of being killed.

``Expected`` takes a measurement's time from what this run has seen. Compiling: before anything
compiled, the stated guess; in a compiled variant's first cell, the longest compile seen; in its
later cells, what its latest later cell compiled again (at first nothing: its graphs are dynamic).
The rest: the variant's latest cell, its training steps scaled by a step's work (layers × tokens);
for a variant not seen yet, twice the baseline's (which runs beside every other variant). Each
expectation is taken ``MARGIN`` times over. The first ``always`` measurements (the question) run
whatever the budget says; a cell whose baseline was skipped or failed is skipped, since its other
variants would compare with nothing.
"""

import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from benchmarks.bench import say

MARGIN = 1.25  # expectations are estimates from one earlier measurement: keep a quarter in hand
COMPILE_GUESS_S = 120  # --compile-guess: a compiled measurement's compiling, before any has compiled here


def add_arguments(p):
    """--budget and --compile-guess, on parser *p*."""
    p.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="seconds this run may use: a measurement starts only if it is expected to fit (budget.py); the "
        "first ones (the question) run whatever (default: no limit)",
    )
    p.add_argument(
        "--compile-guess",
        type=float,
        default=COMPILE_GUESS_S,
        metavar="SECONDS",
        help="a compiled measurement's compiling, before any has compiled (default: %(default)s)",
    )


class Budget:
    """*seconds* from now (None: no limit), on *clock*."""

    def __init__(self, seconds: Optional[float], clock: Callable[[], float] = time.monotonic):
        self.seconds, self.clock, self.start = seconds, clock, clock()

    def used(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - self.used()

    def fits(self, expected_s: float) -> bool:
        return expected_s <= self.left()

    def unaffordable(self, expected_s: float, why: str) -> str:
        """Why a measurement expected to take *expected_s* seconds (for reason *why*) does not start."""
        return f"expected {expected_s:.0f} s ({why}), {self.left():.0f} s of {self.seconds:.0f} left"

    def spent(self) -> dict:
        """The budget and what was used of it, for a result's JSON."""
        return {"seconds": self.seconds, "used_s": round(self.used(), 1)}


@dataclass(frozen=True)
class Cell:
    """One size, sentence length and batch (target tokens) that every variant is measured at."""

    size: str
    layers: int
    length: int
    tokens: int
    width: Optional[int] = None  # train_update.py's: on a CPU a step's time grows (roughly) with it too

    def work(self) -> int:  # what a training step's time grows with, near enough for a budget
        return self.layers * self.tokens * (1 if self.width is None else self.width + 16)

    def describe(self) -> str:
        return f"{self.size}, length {self.length}, {self.tokens} tokens"


class Expected:
    """What the next measurement should take, from what this run has seen (see the module)."""

    def __init__(self, compile_guess_s: float, setup_guess_s: float, baseline: str):
        self.compile_guess_s, self.setup_guess_s, self.baseline = compile_guess_s, setup_guess_s, baseline
        self.rest: Dict[str, Tuple[Cell, float, float]] = {}  # variant -> its latest cell, fixed s, steps s
        self.compiled: Dict[str, List[float]] = {}  # variant -> compile seconds in each cell, in order
        self.probes: Dict[str, float] = {}  # variant -> its latest memory probe's seconds

    def timing(self, variant: str, cell: Cell, compiles: bool) -> Tuple[float, str]:
        """Seconds expected for *variant* at *cell*, and why."""
        if not compiles:
            compile_s, why = 0.0, ""
        elif variant in self.compiled:  # its graphs are made: a later cell compiles only what one did again
            later = self.compiled[variant][1:]
            compile_s = later[-1] if later else 0.0
            why = f"compiling {compile_s:.0f} s as in its latest cell, "
        elif any(self.compiled.values()):
            compile_s = max(max(seen) for seen in self.compiled.values() if seen)
            why = f"compiling {compile_s:.0f} s, the longest seen, "
        else:
            compile_s, why = self.compile_guess_s, f"compiling {self.compile_guess_s:.0f} s, the guess, "
        if variant in self.rest:
            rest, from_what = self._scaled(self.rest[variant], cell), "its latest cell"
        elif self.baseline in self.rest and variant != self.baseline:
            rest, from_what = 2 * self._scaled(self.rest[self.baseline], cell), f"twice {self.baseline}'s"
        else:
            rest, from_what = self.setup_guess_s, "the guess"
        return MARGIN * (compile_s + rest), f"{why}the rest {rest:.0f} s from {from_what}; ×{MARGIN}"

    @staticmethod
    def _scaled(seen: Tuple[Cell, float, float], cell: Cell) -> float:
        """What took *seen* (its cell, fixed seconds, seconds of training steps) takes at *cell*:
        the steps grow with a step's work, building and the first step do not (much)."""
        seen_cell, fixed_s, steps_s = seen
        return fixed_s + steps_s * cell.work() / seen_cell.work()

    def saw_timing(self, variant: str, cell: Cell, seconds: float, compile_s: float, steps_s: float) -> None:
        """*variant* took *seconds* at *cell*: *compile_s* compiling, *steps_s* in training steps
        after its first (its own and the baseline's beside them), the rest building and starting."""
        self.rest[variant] = (cell, max(seconds - compile_s - steps_s, 0.0), steps_s)
        if compile_s > 0 or variant in self.compiled:
            self.compiled.setdefault(variant, []).append(compile_s)

    def probe(self, variant: str, timing: Tuple[float, float], fresh: bool) -> Tuple[float, str]:
        """A memory probe of *variant*: as long as its latest probe; the first, as long as its
        *timing* (seconds, of which compiling) at this cell took, without the compiling unless
        the probe is a *fresh* process (which compiles again)."""
        if variant in self.probes:
            return MARGIN * self.probes[variant], f"its latest probe {self.probes[variant]:.0f} s; ×{MARGIN}"
        seconds = timing[0] if fresh else timing[0] - timing[1]
        return MARGIN * seconds, f"its timing here{'' if fresh else ' besides compiling'} {seconds:.0f} s; ×{MARGIN}"

    def saw_probe(self, variant: str, seconds: float) -> None:
        self.probes[variant] = seconds


def run(
    cells: List[Cell],
    variants: List[str],
    measurer,
    budget: Budget,
    expected: Expected,
    written: Callable[[List[dict], List[dict]], None],
    always: int = 2,
) -> Tuple[List[dict], List[dict]]:
    """Every variant at every cell, in order: a cell's timings, then its memory probes. Each
    record and each skip is kept the moment it is known and ``written(records, skipped)`` is
    called, so a run stopped from outside keeps what it measured. Returns (records, skipped).

    *measurer* (speed.py's Timings, or a test's fake on a fake clock): ``time(variant, cell)``, its
    record with ``compile_s`` and ``steps_s``; ``compiles(variant)``; ``end_timings(cell)`` frees
    what the cell's timings held; ``probe(variant, cell)``, peak memory in bytes; ``fresh_probes``,
    whether a probe runs in a new process (and compiles again)."""
    records: List[dict] = []
    skipped: List[dict] = []

    def skip(what: str, variant: str, cell: Cell, reason: str) -> None:
        where = {"size": cell.size, "length": cell.length, "tokens_per_batch": cell.tokens}
        skipped.append({"what": what, "variant": variant, **where, "reason": reason})
        say("budget", f"skipped {what} of {variant} at {cell.describe()}: {reason}")
        written(records, skipped)

    def measured(what: str, variant: str, cell: Cell, measure: Callable[[], object]):
        """*measure*(), or None where it failed: one variant's error (a compiler's, say) must not
        cost a lent GPU's run the others; it is kept as a skip with the error."""
        try:
            return measure()
        except Exception as e:
            first_line = (str(e).strip().splitlines() or [""])[0][:300]
            skip(what, variant, cell, f"failed: {type(e).__name__}: {first_line}")
            return None

    for cell in cells:
        timed: Dict[str, Tuple[dict, Tuple[float, float]]] = {}
        for variant in variants:
            if expected.baseline in variants and variant != expected.baseline and expected.baseline not in timed:
                skip("timing", variant, cell, f"no {expected.baseline} at this cell to compare with")
                continue
            expected_s, why = expected.timing(variant, cell, measurer.compiles(variant))
            if len(records) >= always and not budget.fits(expected_s):
                skip("timing", variant, cell, budget.unaffordable(expected_s, why))
                continue
            start = budget.clock()
            record = measured("timing", variant, cell, lambda: measurer.time(variant, cell))
            seconds = budget.clock() - start
            if record is None:
                continue
            expected.saw_timing(variant, cell, seconds, record.get("compile_s", 0.0), record.get("steps_s", 0.0))
            records.append(record)
            timed[variant] = (record, (seconds, record.get("compile_s", 0.0)))
            written(records, skipped)
        measurer.end_timings(cell)
        for variant, (record, timing) in timed.items():
            expected_s, why = expected.probe(variant, timing, measurer.fresh_probes)
            if not budget.fits(expected_s):
                skip("memory", variant, cell, budget.unaffordable(expected_s, why))
                continue
            start = budget.clock()
            peak = measured("memory", variant, cell, lambda: measurer.probe(variant, cell))
            expected.saw_probe(variant, budget.clock() - start)
            if peak is not None:
                record["peak_mem_bytes"] = peak
                written(records, skipped)
    return records, skipped
