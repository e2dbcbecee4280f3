"""The build path of scripts/setup_env.sh, on every run of the suite: where no ve-fairseq wheel
exists, it builds fairseq 0.12.2 from PyPI's sdist with scripts/fairseq-0.12.2.patch, and the
plugin trains and translates with that fairseq.

It runs on this Python in a throwaway environment whose packages, but for fairseq and the plugin,
are the suite's own: a .pth file points at links to them, so torch is not downloaded again and
setup_env.sh finds every pin but fairseq installed. What is downloaded is the sdist (9.6 MB) and
the isolated build's setuptools, Cython and numpy (pip's cache keeps them). The wheel is built
anew each time (an empty REALFORMER_CACHE), beside the rest of the suite.
"""

import importlib.metadata as md
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from .background import Job
from .cli import N_TEST, SCRIPTS, clean_env
from .helpers import REPO, USER_DIR
from .interchange import (
    BIN,
    PRINTED,
    SMALL,
    assert_same_as_printed,
    fixture_made_under,
    last_checkpoint,
    translation_lines,
)


def suite_packages_but_fairseq(links: Path) -> None:
    """Links in *links* to every entry of the suite's site-packages, except those of fairseq's
    distribution (ve-fairseq, or a fairseq) and of the plugin."""
    site = Path(sysconfig.get_paths()["purelib"])
    theirs = set()
    for dist in md.distributions(path=[str(site)]):
        files = [str(f) for f in dist.files or []]
        if "fairseq/__init__.py" in files or dist.metadata["Name"].lower() == "fairseq-realformer":
            theirs |= {f.split("/")[0] for f in files if not f.startswith("..")}
    links.mkdir()
    for entry in site.iterdir():
        if entry.name not in theirs and not entry.name.endswith(".pth") and not entry.name.startswith("__editable__"):
            (links / entry.name).symlink_to(entry)


def build(job):
    """The throwaway environment, set up by scripts/setup_env.sh with REALFORMER_FAIRSEQ=sdist."""
    venv = job.folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    suite_packages_but_fairseq(job.folder / "suite-packages")
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "suite-packages.pth").write_text(f"{job.folder / 'suite-packages'}\n")
    env = {**clean_env(), "REALFORMER_VENV": str(venv), "REALFORMER_FAIRSEQ": "sdist"}
    env["REALFORMER_CACHE"] = str(job.folder / "cache")
    result = job.run([SCRIPTS / "setup_env.sh"], env=env, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return venv, result.stdout


# about 2 minutes, mostly compiling: beside the rest of the suite (tests/background.py)
BUILD = Job(build)
BACKGROUND = [BUILD]


@pytest.fixture(scope="module")
def built():
    return BUILD.result()


def run_in(venv, program, *args, cwd, stdin=None):
    result = subprocess.run(
        [venv / "bin" / program, *map(str, args)],
        env={**clean_env(), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"},
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, f"{program}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def test_setup_builds_the_patched_sdist_and_installs_it(built):
    venv, log = built
    assert "fairseq 0.12.2: applying scripts/fairseq-0.12.2.patch" in log
    assert log.strip().splitlines()[-1].startswith("[setup] ok: fairseq 0.12.2 (fairseq) imports")
    probe = "import fairseq, torch; print(fairseq.__file__); print(torch.__file__)"
    fairseq_file, torch_file = run_in(venv, "python", "-c", probe, cwd=REPO).stdout.split()
    assert fairseq_file.startswith(str(venv)) and not torch_file.startswith(str(venv))  # the suite's torch


def test_the_plugin_trains_and_translates_with_the_built_fairseq(built, tmp_path):
    venv, _ = built
    run_in(
        venv,
        "fairseq-train",
        BIN,
        *("--user-dir", USER_DIR, "--arch", "realformer_iwslt_de_en", *SMALL, "--share-all-embeddings"),
        *("--encoder-layers", "2", "--decoder-layers", "2", "--encoder-attention-heads", "2"),
        *("--decoder-attention-heads", "2", "--optimizer", "adam", "--lr", "5e-3", "--max-tokens", "1000"),
        *("--criterion", "label_smoothed_cross_entropy", "--max-update", "20", "--seed", "1", "--num-workers", "0"),
        *("--save-dir", tmp_path / "checkpoints", "--no-epoch-checkpoints"),
        cwd=tmp_path,
    )
    result = run_in(
        venv,
        "fairseq-generate",
        BIN,
        *("--user-dir", USER_DIR, "--path", tmp_path / "checkpoints" / "checkpoint_last.pt", "--beam", "4"),
        cwd=tmp_path,
    )
    assert len([line for line in translation_lines(result.stdout) if line.startswith("H-")]) == N_TEST


def test_a_ve_fairseq_checkpoint_translates_identically_with_the_built_fairseq(built, tmp_path):
    """The crossing from ve-fairseq to the built fairseq, in every run of the suite (the other
    crossing: tests/test_fairseq_interchange.py under ve-fairseq)."""
    venv, _ = built
    fixture = fixture_made_under("ve-fairseq")
    last = last_checkpoint(fixture / "checkpoints")
    result = run_in(
        venv,
        "fairseq-generate",
        BIN,
        *("--user-dir", USER_DIR, "--path", last, "--beam", "4", "--max-len-b", "12"),
        cwd=tmp_path,
    )
    expected = json.loads((fixture / "expected.json").read_text())["generate"]
    assert_same_as_printed(translation_lines(result.stdout), expected, PRINTED["generate"])
