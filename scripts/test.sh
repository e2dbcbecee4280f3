#!/usr/bin/env bash
# Set up (or reuse) the environment, then run the whole test suite. Extra arguments go to pytest.
#
#   scripts/test.sh                 # everything
#   scripts/test.sh -k incremental  # a subset
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup_env.sh"
venv=${REALFORMER_VENV:-$root/.venv}
cd "$root"
exec "$venv/bin/python" -m pytest tests "$@"
