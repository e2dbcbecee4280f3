"""What the GPU run reads from its profile (benchmarks/speed.py --profile): the device's busy time
and its share of a training step. Pure arithmetic on spans, so it is tested here without a GPU."""

import json
from pathlib import Path

import pytest

from benchmarks import bench, cuda_profile, speed, speed_report

RESULTS = Path(speed.__file__).parent / "results"
SPEED_RESULTS = [
    p for p in sorted(RESULTS.glob("*.json")) if "benchmarks/speed.py" in json.loads(p.read_text())["command"]
]


def test_busy_time_is_the_union_of_kernel_spans():
    # two streams overlapping (10-30 and 20-40), one kernel inside another (50-60 in 45-70), a gap
    spans = [(20.0, 40.0), (10.0, 30.0), (45.0, 70.0), (50.0, 60.0), (100.0, 101.5)]
    assert cuda_profile.busy_us(spans) == 30.0 + 25.0 + 1.5
    assert cuda_profile.busy_us([]) == 0.0


def test_busy_share_and_attention_time_in_the_report():
    run = {"train_step_ms": 20.0, "cuda_kernels": {"busy_us": 5000.0, "attention_us": {"memory-efficient": 1234.0}}}
    assert speed_report.busy_share(run) == "25%"
    assert speed_report.attention_ms(run) == "memory-efficient 1.23"
    # a CPU rehearsal or a failed profile has neither: the table says so instead of failing
    assert speed_report.busy_share({"train_step_ms": 20.0, "cuda_kernels": {"error": "no CUDA"}}) == "—"
    assert speed_report.attention_ms({"train_step_ms": 20.0}) == "—"


def test_a_compiled_variant_is_its_variant_with_compiled_layers():
    """speed.py's ``+compiled`` rows: a plugin variant with --compile-layers; fairseq's own model,
    whose layers build() compiles by hand; nothing else."""
    assert bench.variant_flags("realformer+compiled") == [*bench.variant_flags("realformer"), "--compile-layers"]
    assert bench.variant_flags("fairseq+compiled") == bench.variant_flags("fairseq") == ["--arch", "transformer"]
    for unknown in ("realformer+fused", "nothing+compiled"):
        assert not bench.known_variant(unknown)


@pytest.mark.parametrize("path", SPEED_RESULTS, ids=lambda path: path.stem)
def test_every_committed_speed_result_prints_its_summary(path, capsys):
    """``speed.py --summary JSON``: a line a run, each committed result, the oldest included (their
    batch size in the settings, not in each run: cpu-speed-quick-value-residual-resi-dual.json)."""
    speed.main(["--summary", str(path)])
    runs = json.loads(path.read_text())["runs"]
    lines = capsys.readouterr().out.splitlines()
    assert len([line for line in lines if line.startswith("| ") and "/" in line.split("|")[1]]) == len(runs)
