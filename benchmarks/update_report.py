"""benchmarks/train_update.py's tables, from its records (a run's, or a result JSON's with
``--summary``): per size, ATen ops and host ms per phase and fairseq-train's words/s, memory and
wall time, each run beside fairseq's; then the fast update's ops against the targets set for it."""

from benchmarks.bench import BASELINE, ratio, table
from benchmarks.update_ops import PHASES

PHASE_NAMES = {"grad_norm": "grad norm / clip", "rest": "rest (logging, zeroing, ...)"}
TARGETS = {"realformer": 0.50, "realformer+compiled": 0.30}  # ops an update over fairseq's, set beforehand


def _fmt(x, digits=0):
    return "—" if x is None else f"{x:,.{digits}f}"


def line(r):
    ops = r.get("ops", {}).get("total")
    return (
        f"[train-update] {r['size']} {r['config']} ({r['precision']}): {_fmt(ops)} ops/update, "
        f"{_fmt(r.get('update_ms_median'), 1)} ms/update, {_fmt(r['wps'])} words/s, wall {r['wall_s']:.0f} s"
    )


def base_config(r):
    """A record's configuration without its ``@PRECISION`` and ``/cudnn-off``."""
    return r["config"].split("@")[0].split("/")[0]


def baseline_of(records, r):
    """The fairseq run *r* is compared with at its size: the one in r's precision with cuDNN
    attention as it comes, else fairseq's fastest there."""
    same = [b for b in records if base_config(b) == BASELINE and b["size"] == r["size"]]
    exact = [b for b in same if b["precision"] == r["precision"] and b["cudnn_attention"]]
    return (exact or [best_fairseq(records, r["size"])])[0]


def best_fairseq(records, size):
    """fairseq's fastest run at *size* (words/s after warm-up), or None."""
    timed = [b for b in records if base_config(b) == BASELINE and b["size"] == size and b["wps"]]
    return max(timed, key=lambda b: b["wps"], default=None)


def _phase_rows(rows, key, digits):
    """A row a phase and the total: each run's *key* (ops or ms) for it."""
    return [[PHASE_NAMES.get(p, p), *(_fmt(r.get(key, {}).get(p), digits) for r in rows)] for p in (*PHASES, "total")]


def _ops_share(r, b):
    """*r*'s ATen ops per update over fairseq's run *b*'s, or None."""
    return r["ops"]["total"] / b["ops"]["total"] if b and r.get("ops") and b.get("ops") else None


def _speed_over(r, b):
    return ratio(r["wps"], b and b["wps"])


def _memory_mib(r):
    peak = r.get("cuda_max_allocated_bytes") or r.get("peak_rss_bytes")
    return _fmt(peak / 2**20) if r.get("peak_rss_bytes") else "—"


def report(records, skipped=()):
    """Per size: ops per update by phase, host ms per phase, words/s and memory, each side by side
    with fairseq's; then the fast path's ops against the targets."""
    lines = []
    for size in dict.fromkeys(r["size"] for r in records):
        rows = [r for r in records if r["size"] == size]
        header = ["phase", *(r["config"] + (f" ({r['precision']})" if "@" not in r["config"] else "") for r in rows)]
        counted = ", ".join(map(str, rows[0].get("counted_updates", [])))
        shares = [_ops_share(r, baseline_of(records, rows[0])) for r in rows]
        ops = _phase_rows(rows, "ops", 0)
        ops.append(["× fairseq's total", *("—" if x is None else _fmt(x, 2) + "×" for x in shares)])
        ops.append(["parameter tensors", *(_fmt(r.get("tensors")) for r in rows)])
        lines += ["", f"{size}: ATen ops per update (updates {counted})", *table(header, ops)]
        lines += ["", f"{size}: host ms per phase (median of the timed updates)"]
        lines += table(header, _phase_rows(rows, "ms", 2))
        train = {"words/s": [_fmt(r["wps"]) for r in rows]}
        train["× fairseq"] = [_speed_over(r, baseline_of(records, r)) for r in rows]
        best = best_fairseq(records, size)
        if best is not None:
            train[f"× fairseq's best ({best['config']}, {best['precision']})"] = [_speed_over(r, best) for r in rows]
        train["target tokens an update (wpb)"] = [_fmt(r["wpb"]) for r in rows]
        train["ms an update (median)"] = [_fmt(r.get("update_ms_median"), 1) for r in rows]
        train["first update s"] = [_fmt(r.get("update_ms", {}).get("1", 0) / 1e3, 1) for r in rows]
        train["compiling s"] = [_fmt(r.get("compile_s"), 1) for r in rows]
        train[f"wall s ({rows[0]['updates']} updates)"] = [_fmt(r["wall_s"]) for r in rows]
        train["loss at the end"] = [_fmt(r["loss_at_end"], 3) for r in rows]
        train["peak memory MiB"] = [_memory_mib(r) for r in rows]
        lines += ["", f"{size}: fairseq-train", *table(header, [[label, *cells] for label, cells in train.items()])]
    checks = []
    for r in records:
        share, target = _ops_share(r, baseline_of(records, r)), TARGETS.get(base_config(r))
        if target is not None and share is not None:
            verdict = "met" if share <= target else "NOT met"
            checks.append(
                f"- {r['size']} {r['config']} ({r['precision']}): {share:.3f}× fairseq's ops per update "
                f"(target ≤ {target:.2f}×: {verdict})"
            )
    if checks:
        lines += ["", "The fast path's ops per update against fairseq's:", *checks]
    lines += [f"skipped: {s['size']} {s['config']}: {s['reason']}" for s in skipped]
    return "\n".join(lines)


def from_json(result):
    """A result JSON's command, machine and tables (``--summary``)."""
    header = f"{result['command']}\n{result['device']}, {result['machine']}; {result['date']}, {result['commit']}"
    return f"{header}\n{report(result['runs'], result.get('skipped', []))}"
