#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install the pinned stack + the plugin.
#
#   scripts/setup_env.sh            # environment in .venv (REALFORMER_VENV=DIR to choose another)
#
# Idempotent: it re-installs only when requirements.txt or setup.py changed. If the environment
# already has a fairseq distribution (e.g. fairseq installed from source), that one is kept and
# only the plugin and its own small dependencies are installed, so there is never a second copy.
# On a machine without an NVIDIA GPU it asks for PyTorch's CPU build (no CUDA downloads).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${REALFORMER_VENV:-$root/.venv}
python=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating virtual environment $venv (with $python)"
  "$python" -m venv "$venv"
fi
py="$venv/bin/python"
"$py" - <<'PY'
import sys
if sys.version_info < (3, 9):
    sys.exit(f"[setup] error: Python >= 3.9 is required, {sys.executable} is {sys.version.split()[0]}")
PY

stamp="$venv/.fairseq-realformer-setup"
want=$(cat "$root/requirements.txt" "$root/setup.py" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  pip_args=(--disable-pip-version-check)
  if ! command -v nvidia-smi >/dev/null 2>&1 && [ -z "${PIP_INDEX_URL:-}${PIP_EXTRA_INDEX_URL:-}" ]; then
    # PyPI's Linux torch wheels are CUDA builds (several GB); PyTorch's own CPU index has
    # `torch==2.13.0+cpu`. Use it when reachable; otherwise pip uses what it already sees.
    cpu_index=https://download.pytorch.org/whl/cpu
    if "$py" -c "import urllib.request; urllib.request.urlopen('$cpu_index/torch/', timeout=5)" 2>/dev/null; then
      echo "[setup] no NVIDIA GPU: taking torch from $cpu_index"
      pip_args+=(--extra-index-url "$cpu_index")
    fi
  fi
  # A fairseq from another distribution (e.g. built from source) is the user's: keep it.
  # ve-fairseq is the one requirements.txt pins, so it does not count.
  existing_fairseq=$("$py" - <<'PY'
import importlib.metadata as md
for dist in md.distributions():
    if "fairseq/__init__.py" in [str(f) for f in (dist.files or [])]:
        name = dist.metadata["Name"]
        if name.lower() not in ("fairseq-realformer", "ve-fairseq"):
            print(f"{name}=={dist.version}")
            break
PY
)
  if [ -n "$existing_fairseq" ]; then
    echo "[setup] keeping the fairseq already installed ($existing_fairseq); installing the plugin only"
    "$py" -m pip install "${pip_args[@]}" -q -e "$root[test]"
  else
    echo "[setup] installing the pinned stack from requirements.txt (torch, ve-fairseq, ...)"
    "$py" -m pip install "${pip_args[@]}" -q -r "$root/requirements.txt"
    "$py" -m pip install "${pip_args[@]}" -q --no-deps -e "$root"
  fi
  echo "$want" > "$stamp"
fi

"$py" - <<'PY'
import logging
logging.disable(logging.WARNING)  # fairseq's import-time hints are not this check's business
import fairseq
from fairseq.models import ARCH_MODEL_REGISTRY
import fairseq_realformer
assert "realformer_wmt_en_de" in ARCH_MODEL_REGISTRY, "fairseq_realformer did not register its architectures"
print(f"[setup] ok: fairseq {fairseq.__version__} imports, fairseq_realformer registers "
      f"{sum(a.startswith(('realformer', 'admin')) for a in ARCH_MODEL_REGISTRY)} architectures")
PY
