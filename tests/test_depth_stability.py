"""studies/depth_stability.py --add-to: new variants join a committed table as rows, variants it
has are re-run as controls and kept beside the rows, and a table of other settings is refused. No
model trains: the merge is given what run_variant returns."""

import json

import pytest

from studies import depth_stability

from .cli import STUDIES, cli_error

RESULTS = STUDIES / "results"


def _run(variant, valid_loss, wall_s=100.0):
    return {
        "variant": variant,
        "first_train_loss": 11.2,
        "final_train_loss": 8.2,
        "valid_loss": valid_loss,
        "diverged": False,
        "grad_norm_encoder_layer0": 1.28,
        "grad_norm_decoder_layer0": 0.845,
        "wall_s": wall_s,
    }


@pytest.fixture
def depth(tmp_path, monkeypatch):
    (tmp_path / "multi30k").mkdir()
    (tmp_path / "multi30k" / "train.en.gz").touch()  # enough for the --data check; nothing trains
    monkeypatch.setattr(depth_stability, "data", tmp_path / "multi30k", raising=False)  # one module for all tests
    return depth_stability


def _settings(depth, *argv):
    args = depth.parse_args(["--data", str(depth.data), *argv])
    return {k: v for k, v in vars(args).items() if k not in depth.RECORD_ONLY}


RECORD = {"date": "2026-11-25", "commit": "abc1234", "command": "python studies/depth_stability.py", "machine": "m"}


def test_new_variants_become_rows_and_known_ones_controls_recorded_once(depth):
    settings = _settings(depth)
    table = {"settings": dict(settings, variants=["post-ln"]), "runs": [_run("post-ln", 9.122, wall_s=883.6)]}
    results = [_run("post-ln-realformer", 8.5), _run("post-ln", 9.122, wall_s=120.0)]

    merged = depth.add_to_table(table, settings, results, RECORD)

    assert [r["variant"] for r in merged["runs"]] == ["post-ln", "post-ln-realformer"]
    assert merged["runs"][0]["wall_s"] == 883.6  # the control does not replace its row
    assert merged["settings"]["variants"] == ["post-ln", "post-ln-realformer"]
    assert merged["additions"] == [
        {"variants": ["post-ln-realformer"], **RECORD, "controls": [{"run": results[1], "same_as_row": True}]}
    ]
    assert table["runs"] == [_run("post-ln", 9.122, wall_s=883.6)] and "additions" not in table  # not in place
    assert depth.add_to_table(merged, settings, results, RECORD) is None  # a re-run of the runner adds nothing


def test_a_control_that_measures_otherwise_is_flagged(depth):
    settings = _settings(depth)
    table = {"settings": dict(settings, variants=["post-ln"]), "runs": [_run("post-ln", 9.122)]}
    merged = depth.add_to_table(table, settings, [_run("post-ln", 9.123)], RECORD)
    assert merged["additions"][0]["variants"] == []
    assert merged["additions"][0]["controls"][0]["same_as_row"] is False


def test_a_table_of_other_settings_is_refused(depth):
    table = {"settings": dict(_settings(depth, "--lr", "6e-3"), variants=["post-ln"]), "runs": [_run("post-ln", 9.4)]}
    with pytest.raises(ValueError, match="lr 0.006 there, 0.003 here"):
        depth.add_to_table(table, _settings(depth), [_run("post-ln-realformer", 8.5)], RECORD)


@pytest.mark.parametrize("lr", ["3e-3", "6e-3"])
def test_the_committed_tables_take_rows_run_with_the_defaults(depth, lr):
    """lr_depth_study.sh adds rows to these tables with the defaults and --lr: their settings must be
    what the defaults are now, or the study's last stage would fail after training."""
    table = json.loads((RESULTS / f"cpu-depth-stability-lr{lr}.json").read_text())
    merged = depth.add_to_table(table, _settings(depth, "--lr", lr), [_run("a-new-variant", 8.5)], RECORD)
    assert merged["runs"][-1]["variant"] == "a-new-variant"


def test_add_to_a_missing_table_is_one_line(depth, capsys, tmp_path):
    line = cli_error(capsys, depth.main, "--data", depth.data, "--add-to", tmp_path / "none.json")
    assert line.endswith(f"error: --add-to {tmp_path / 'none.json'}: no such table (an earlier run's --json)")


@pytest.mark.parametrize("lr", ["3e-3", "6e-3"])
def test_a_merged_addition_is_not_trained_again(depth, lr, capsys, monkeypatch):
    """lr_depth_study.sh's last stage on a machine without its run folders: the committed tables hold
    post-ln-realformer and its post-ln control, so nothing trains; a table without them would."""
    table = RESULTS / f"cpu-depth-stability-lr{lr}.json"
    settings = _settings(depth, "--lr", lr)
    assert depth.added_already(json.loads(table.read_text()), settings, ["post-ln-realformer", "post-ln"])
    fresh = {"settings": dict(settings, variants=["post-ln"]), "runs": [_run("post-ln", 9.122)]}
    assert not depth.added_already(fresh, settings, ["post-ln-realformer", "post-ln"])
    merged = depth.add_to_table(fresh, settings, [_run("post-ln-realformer", 8.5)], RECORD)
    assert depth.added_already(merged, settings, ["post-ln-realformer"])
    assert not depth.added_already(merged, settings, ["post-ln-realformer", "post-ln"])  # post-ln: no control yet
    assert not depth.added_already(merged, _settings(depth, "--lr", "1e-3"), ["post-ln-realformer"])

    monkeypatch.setattr(depth, "prepare", lambda *a: pytest.fail("trained what the table holds"))
    depth.main(
        ["--data", str(depth.data), "--lr", lr, "--variants", "post-ln-realformer,post-ln", "--add-to", str(table)]
    )
    assert capsys.readouterr().out.strip().endswith("holds these runs already: nothing to train")
