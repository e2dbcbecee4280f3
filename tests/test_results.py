"""common/results.py, the one writer and reader of the benchmarks' and studies' result JSONs: a
result opens with what it measured and its header (command, machine, date, commit, torch), reads
back equal, and is written whole."""

import datetime
import json
from importlib import metadata

import pytest

from common import repo, results


def test_a_result_opens_with_its_header_and_reads_back_equal(tmp_path):
    path = tmp_path / "results" / "speed.json"  # its folder is made
    argv = ["--json", str(repo.REPO / "benchmarks" / "results" / "x.json"), "--steps", "3"]
    results.write_result(path, repo.REPO / "benchmarks" / "speed.py", argv, "a machine", what="speed", runs=[1.5, 2])
    result = results.read_result(path)
    assert list(result) == ["what", *results.HEADER, "runs"]
    assert result == {
        "what": "speed",
        "command": "python benchmarks/speed.py --json benchmarks/results/x.json --steps 3",
        "machine": "a machine",
        "date": datetime.date.today().isoformat(),
        "commit": repo.commit(),
        "torch": metadata.version("torch"),
        "runs": [1.5, 2],
    }
    assert path.read_text().endswith("]\n}\n")  # indented, a line at its end


def test_a_result_is_written_whole_or_not_at_all(tmp_path):
    """A study skips a run whose record exists: a file is never half written, and no partial is left."""
    path = tmp_path / "dropout_gap.json"
    results.write_json(path, {"rows": [1]})
    with pytest.raises(TypeError):
        results.write_json(path, {"rows": {1, 2}})  # a set: not JSON
    assert json.loads(path.read_text()) == {"rows": [1]}
    assert [p.name for p in tmp_path.iterdir()] == ["dropout_gap.json"]


def test_what_a_result_measured_is_it_without_its_header(tmp_path):
    path = tmp_path / "gap.json"
    results.write_result(path, repo.REPO / "studies" / "dropout_gap.py", [], "m", subset="valid", rows=[])
    assert results.measured(results.read_result(path)) == {"subset": "valid", "rows": []}
