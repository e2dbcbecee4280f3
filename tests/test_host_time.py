"""benchmarks/host_time.py: the ratios its table reports, worked out by hand on made-up timings, and
one short run whose operation counts are kernel_count.py's for the same model."""

import json

import pytest

from .cli import BENCHMARKS, load_script


def _run(variant, train_ms, decode_ms, train_ops=100, decode_ops=1000):
    return {
        "variant": variant,
        "size": "6L-6L",
        "params": 1,
        "train_ms": train_ms,
        "decode_ms": decode_ms,
        "train_ops": train_ops,
        "decode_ops": decode_ops,
    }


def test_the_table_takes_the_fastest_repeat_and_the_median_paired_ratio():
    host_time = load_script("host_time", BENCHMARKS)
    fairseq = _run("fairseq", [10.0, 20.0, 12.0], [50.0, 40.0, 60.0])
    ours = _run("realformer", [11.0, 30.0, 12.0], [44.0, 48.0, 66.0], train_ops=125, decode_ops=800)
    base, row = host_time.summary([fairseq, ours])
    assert (base["train_ratio"], base["train_paired"], base["decode_paired"]) == (1.0, 1.0, 1.0)
    assert row["train_ms"] == 11.0 and row["train_ratio"] == pytest.approx(11.0 / 10.0)
    assert row["train_paired"] == pytest.approx(1.1)  # 1.1, 1.5, 1.0: the median
    assert row["train_spread"] == pytest.approx((12.0 - 11.0) / 11.0)  # the median repeat over the fastest
    assert row["decode_ratio"] == pytest.approx(44.0 / 40.0)
    assert row["decode_paired"] == pytest.approx(1.1)  # 0.88, 1.2, 1.1
    assert row["train_ops_ratio"] == 1.25 and row["decode_ops_ratio"] == 0.8
    assert row["train_us_per_op"] == pytest.approx(11.0 * 1e3 / 125)


def test_a_short_run_reports_every_variant_with_kernel_counts_operations(tmp_path, capsys):
    host_time = load_script("host_time", BENCHMARKS)
    kernel_count = load_script("kernel_count", BENCHMARKS)
    out = tmp_path / "host.json"
    host_time.main(
        ["--sizes", "6L-6L", "--variants", "realformer", "--steps", "1", "--repeats", "2", "--json", str(out)]
    )
    assert "| 6L-6L | realformer |" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert [r["variant"] for r in result["summary"]] == ["fairseq", "realformer"]  # fairseq added: every ratio is to it
    assert all(len(r["train_ms"]) == 2 and min(r["train_ms"]) > 0 for r in result["runs"])
    bench = host_time.Narrow("realformer", 6, host_time.parse_args([]).length, "fp32")
    counting = kernel_count.Counting()
    kernel_count.train_step(bench.model, bench.sample, counting)
    assert result["runs"][1]["train_ops"] == sum(counting.counts.values())
