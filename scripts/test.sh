#!/usr/bin/env bash
# Set up (or reuse) the environment, then run the whole test suite. Extra arguments go to pytest.
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
exec "$venv/bin/python" -m pytest "$@"  # pytest.ini: testpaths = tests
