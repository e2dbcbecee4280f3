"""scripts/setup_env.sh and scripts/build_fairseq_wheel.sh: each missing prerequisite is one line
that says the fix, before anything long starts (the build itself: tests/test_fairseq_build.py)."""

import subprocess
import sys

import pytest

from .cli import SCRIPTS, clean_env, free_port

SETUP = SCRIPTS / "setup_env.sh"


def fake_python(folder, version, venv_works=True):
    """An interpreter that reports *version*, has no Python.h and, unless *venv_works*, no
    venv/ensurepip: the answers the scripts ask for before they start anything."""
    path = folder / f"python{version}"
    path.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        "  *sysconfig*) echo /nonexistent/include ;;\n"
        f"  *ensurepip*) exit {0 if venv_works else 1} ;;\n"
        f"  *) echo {version} ;;\n"
        "esac\n"
    )
    path.chmod(0o755)
    return path


def last_line(script, *args, **env):
    result = subprocess.run(
        [script, *map(str, args)], env={**clean_env(), **env}, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert "Traceback" not in result.stderr
    return lines[-1], lines


@pytest.mark.parametrize(
    "env, says",
    [
        (
            {"REALFORMER_FAIRSEQ": "latest"},
            "REALFORMER_FAIRSEQ=latest: auto (the default: ve-fairseq where its wheel exists, else sdist), ve-fairseq or sdist",
        ),
        (
            {"PYTHON": "python2.5"},
            "no 'python2.5' on PATH: install Python 3.10-3.13, or name one with PYTHON=python3.11",
        ),
    ],
    ids=["unknown-fairseq-source", "no-such-python"],
)
def test_a_bad_setting_is_one_line(tmp_path, env, says):
    line, _ = last_line(SETUP, REALFORMER_VENV=str(tmp_path / "venv"), **env)
    assert line == f"[setup] error: {says}"


def test_python_3_9_is_refused_with_the_reason(tmp_path):
    python = fake_python(tmp_path, "3.9")
    line, _ = last_line(SETUP, REALFORMER_VENV=str(tmp_path / "venv"), PYTHON=str(python))
    assert line == (
        f"[setup] error: Python 3.9 ({python}): torch 2.13 has no wheel for it; use Python 3.10-3.13 "
        f"(PYTHON=python3.11 {SETUP})"
    )


def test_python_3_14_is_untested_and_goes_on_and_no_venv_names_the_package(tmp_path):
    python = fake_python(tmp_path, "3.14", venv_works=False)
    line, lines = last_line(SETUP, REALFORMER_VENV=str(tmp_path / "venv"), PYTHON=str(python))
    assert lines[0].startswith("[setup] Python 3.14 is untested here (tested: 3.10-3.13;")
    assert line == (
        f"[setup] error: {python} cannot make virtual environments (no venv/ensurepip): "
        "sudo apt install python3.14-venv (Debian/Ubuntu), then run this again"
    )
    assert not (tmp_path / "venv").exists()


def test_no_package_index_is_one_line(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp_path / "venv"], check=True)
    index = f"http://127.0.0.1:{free_port()}/simple"  # nothing listens there
    line, _ = last_line(SETUP, REALFORMER_VENV=str(tmp_path / "venv"), PIP_INDEX_URL=index)
    assert line.startswith(f"[setup] error: cannot reach the package index {index} (")
    assert line.endswith("): connect to the internet, or set PIP_INDEX_URL to a mirror you can reach")


def test_building_fairseq_without_a_compiler_or_headers_is_one_line(tmp_path):
    build = SCRIPTS / "build_fairseq_wheel.sh"
    line, _ = last_line(build, sys.executable, tmp_path / "out", CC="no-such-cc")
    assert line.startswith(
        "[setup] error: building fairseq 0.12.2 needs a C/C++ compiler ('no-such-cc' not found): sudo apt install "
        f"build-essential python{sys.version_info[0]}.{sys.version_info[1]}-dev (Debian/Ubuntu)"
    )
    python = fake_python(tmp_path, "3.13")
    line, _ = last_line(build, python, tmp_path / "out")
    assert line.startswith(
        "[setup] error: building fairseq 0.12.2 needs Python 3.13's headers (/nonexistent/include/Python.h not "
        "found): sudo apt install build-essential python3.13-dev (Debian/Ubuntu)"
    )
    assert not (tmp_path / "out").exists()
