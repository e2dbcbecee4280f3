#!/usr/bin/env bash
# Set up (or reuse) the environment, check the style (ruff), then run the whole test suite.
# Extra arguments go to pytest.
#
#   scripts/test.sh                 # everything
#   scripts/test.sh -k incremental  # a subset
#   scripts/test.sh tests/test_radam.py
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup_env.sh"
venv=${REALFORMER_VENV:-$root/.venv}
# The tests' models are tiny: a second OpenMP thread gains nothing, and the tests that start
# several fairseq processes would oversubscribe the cores (spin-waiting threads, 10x slower).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
cd "$root"
# The style first (pyproject.toml): lint, then the formatter's check. `ruff format .` fixes the second.
"$venv/bin/ruff" check --quiet .
"$venv/bin/ruff" format --check --quiet . || { echo "test.sh: run '$venv/bin/ruff format .' (the files above are not formatted)" >&2; exit 1; }
# Two processes, a test module each at a time (fixtures are per module), the longest first
# (tests/conftest.py); REALFORMER_TEST_WORKERS=0, or -n 0, runs it in this one.
exec "$venv/bin/python" -m pytest -n "${REALFORMER_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"  # pytest.ini: testpaths = tests
