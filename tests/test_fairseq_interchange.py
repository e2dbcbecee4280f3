"""Checkpoints cross between the two fairseqs scripts/setup_env.sh installs, ve-fairseq 0.12.3 and
fairseq 0.12.2 built from its sdist with scripts/fairseq-0.12.2.patch: a tiny RealFormer trained
under one translates (fairseq-generate, fairseq-interactive, the hub, scripts/score.py), averages,
is analysed (realformer-analyze) and resumes training under the other exactly as under its own.

tests/data/across-fairseqs/ holds one made under each (``tests.interchange.make``; its README),
with what each gave under its own fairseq. Run under either fairseq, the suite checks the one made
under the other: under ve-fairseq (CI) the crossing from the built 0.12.2; under the built 0.12.2,
the crossing from ve-fairseq (which tests/test_fairseq_build.py also checks on every run, for
fairseq-generate). A checkpoint of the official 0.12.2, with its BetterTransformer copies of the
encoder layers' weights, translates under either.
"""

import json

import pytest
import torch

from .background import Job
from .cli import run
from .helpers import USER_DIR
from .interchange import (
    BIN,
    FIXTURES,
    PRINTED,
    assert_same_as_printed,
    installed_fairseq,
    last_checkpoint,
    outcomes,
    translation_lines,
)


def cross(job):
    """What the checkpoints made under the other fairseq give under this one, and what they gave
    under their own."""
    made_under = next(name for name in FIXTURES if name != installed_fairseq())
    fixture = FIXTURES[made_under]
    expected = json.loads((fixture / "expected.json").read_text())
    return outcomes(fixture, job.folder), expected


# a minute of fairseq commands one after the other: beside the rest of the suite (tests/background.py)
CROSS = Job(cross)
BACKGROUND = [CROSS]


@pytest.fixture(scope="module")
def crossed():
    return CROSS.result()


@pytest.mark.parametrize(
    "outcome", ["generate", "interactive", "hub", "average_score", "average_hypotheses", "analysis", "resume_losses"]
)
def test_a_checkpoint_of_the_other_fairseq_gives_what_it_gave_there(crossed, outcome):
    got, expected = crossed
    assert_same_as_printed(got[outcome], expected[outcome], PRINTED.get(outcome))


def with_better_transformer_copies(model: dict) -> dict:
    """A model's state as the official fairseq 0.12.2 saves it after loading it: each encoder
    layer also holds its weights' copies for the BetterTransformer fast path, in_proj_* = q, k
    and v stacked (its TransformerEncoderLayerBase._load_from_state_dict)."""
    copied = dict(model)
    layers = sorted(
        {key.split(".self_attn.")[0] for key in model if key.startswith("encoder.layers.") and ".self_attn." in key}
    )
    for layer in layers:
        attn = f"{layer}.self_attn"
        for kind in ("weight", "bias"):
            copied[f"{layer}.in_proj_{kind}"] = torch.cat([model[f"{attn}.{p}_proj.{kind}"] for p in "qkv"])
            copied[f"{layer}.out_proj_{kind}"] = model[f"{attn}.out_proj.{kind}"]
            copied[f"{layer}.fc1_{kind}"] = model[f"{layer}.fc1.{kind}"]
            copied[f"{layer}.fc2_{kind}"] = model[f"{layer}.fc2.{kind}"]
    assert len(copied) == len(model) + 8 * len(layers) and layers
    return copied


@pytest.mark.parametrize("fixes", ["on", "off"])
def test_a_checkpoint_of_the_official_fairseq_0_12_2_translates(tmp_path, fixes):
    """Its 8 copies per encoder layer are dropped (patches.fixes.drop_better_transformer_copies);
    without the plugin's fixes, this fairseq refuses them as fairseq alone does."""
    fixture = FIXTURES[installed_fairseq()]
    state = torch.load(last_checkpoint(fixture / "checkpoints"), weights_only=False)
    state["model"] = with_better_transformer_copies(state["model"])
    torch.save(state, tmp_path / "official.pt")
    args = ("--user-dir", USER_DIR, "--path", tmp_path / "official.pt", "--beam", "4", "--max-len-b", "12")
    env = {"REALFORMER_FAIRSEQ_FIXES": "1" if fixes == "on" else "0"}
    result = run("fairseq-generate", BIN, *args, cwd=tmp_path, env=env, check=fixes == "on")
    if fixes == "on":
        expected = json.loads((fixture / "expected.json").read_text())["generate"]
        assert_same_as_printed(translation_lines(result.stdout), expected, PRINTED["generate"])
    else:
        assert (
            result.returncode != 0
            and 'Unexpected key(s) in state_dict: "encoder.layers.0.in_proj_weight"' in result.stderr
        )
