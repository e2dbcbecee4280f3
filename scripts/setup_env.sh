#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install torch, fairseq, the pinned stack
# (requirements.txt) and the plugin.
#
#   scripts/setup_env.sh                          # the environment .venv (REALFORMER_VENV=DIR: another)
#   PYTHON=python3.13 scripts/setup_env.sh        # made with this interpreter (default: python3)
#   REALFORMER_FAIRSEQ=sdist scripts/setup_env.sh # which fairseq: auto (default), ve-fairseq, sdist
#
# Which fairseq (auto): the ve-fairseq wheel where one exists (CPython 3.11/3.12 on Linux x86_64);
# elsewhere fairseq 0.12.2 from PyPI's sdist (hash-checked) with scripts/fairseq-0.12.2.patch applied,
# built once into a wheel kept in ~/.cache/fairseq-realformer (REALFORMER_CACHE=DIR: another) and
# reused; an environment set up before keeps the one it has. A fairseq from elsewhere (e.g. built
# from source) is kept: only the plugin and its own small dependencies are installed, never a
# second copy.
#
# Idempotent: it installs only when requirements.txt, setup.py, the patch or the choice changed.
# A missing prerequisite (Python version, venv, compiler, network) is one line naming the fix.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${REALFORMER_VENV:-$root/.venv}
python=${PYTHON:-python3}
choice=${REALFORMER_FAIRSEQ:-auto}
cache=${REALFORMER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fairseq-realformer}
patch_file=$root/scripts/fairseq-0.12.2.patch
ve_fairseq_reqs=(ve-fairseq==0.12.3 torchaudio==2.11.0)  # ve-fairseq requires torchaudio; pinned to torch 2.13's

say() { echo "[setup] $*"; }
sha256() { if command -v sha256sum >/dev/null 2>&1; then sha256sum "$@"; else shasum -a 256 "$@"; fi; }  # macOS: shasum
die() { echo "[setup] error: $*" >&2; exit 1; }

case $choice in auto | ve-fairseq | sdist) ;; *)
  die "REALFORMER_FAIRSEQ=$choice: auto (the default: ve-fairseq where its wheel exists, else sdist), ve-fairseq or sdist" ;;
esac

# --- prerequisites that need no environment yet: the interpreter and venv ---
if [ ! -x "$venv/bin/python" ]; then
  command -v "$python" >/dev/null 2>&1 ||
    die "no '$python' on PATH: install Python 3.10-3.13, or name one with PYTHON=python3.11"
fi
base_py=$([ -x "$venv/bin/python" ] && echo "$venv/bin/python" || echo "$python")
version=$("$base_py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) ||
  die "'$base_py' does not run here (a pyenv shim of a version not selected?): name a Python 3.10-3.13 that runs, e.g. PYTHON=/path/to/python3.11"
case $version in
  3.10 | 3.11 | 3.12 | 3.13) ;;
  3.[0-9]) die "Python $version ($base_py): torch 2.13 has no wheel for it; use Python 3.10-3.13 (PYTHON=python3.11 $0)" ;;
  *) say "Python $version is untested here (tested: 3.10-3.13; hydra-core 1.3's @hydra.main is reported broken on 3.14, hydra issue 3121): going on" ;;
esac

if [ ! -x "$venv/bin/python" ]; then
  pkg=$([ "$python" = python3 ] && echo python3-venv || echo "python$version-venv")
  "$python" -c 'import venv, ensurepip' 2>/dev/null ||
    die "$python cannot make virtual environments (no venv/ensurepip): sudo apt install $pkg (Debian/Ubuntu), then run this again"
  say "creating virtual environment $venv (with $python, Python $version)"
  if ! out=$("$python" -m venv "$venv" 2>&1) || [ ! -x "$venv/bin/pip" ]; then
    rm -rf "$venv"  # half made: the next run starts again
    die "$python -m venv failed (${out##*$'\n'}): on Debian/Ubuntu, sudo apt install $pkg; then run this again"
  fi
fi
py="$venv/bin/python"

# --- which fairseq ---
# The environment's fairseq: ours (ve-fairseq, or the 0.12.2 this script built: its record says so)
# or the user's own, which is kept.
record="$venv/.fairseq-realformer-fairseq"
installed=$("$py" - "$(cat "$record" 2>/dev/null || true)" <<'PY'
import importlib.metadata as md, sys
ours = sys.argv[1]
for dist in md.distributions():
    if "fairseq/__init__.py" in [str(f) for f in (dist.files or [])]:
        name = f"{dist.metadata['Name']}=={dist.version}"
        kind = "ve-fairseq" if dist.metadata["Name"].lower() == "ve-fairseq" else "sdist" if name == ours else "user"
        print(kind, name)
        break
PY
)
wheel_exists=$("$py" -c 'import platform, sys
ok = (sys.implementation.name == "cpython" and sys.version_info[:2] in ((3, 11), (3, 12))
      and sys.platform == "linux" and platform.machine() == "x86_64"
      and tuple(map(int, (platform.libc_ver()[1] or "0.0").split(".")[:2])) >= (2, 28))  # manylinux_2_28
print(int(ok))')
if [ "$choice" = auto ] && [ -n "$installed" ]; then
  source=${installed%% *}  # what an earlier run installed stays, until REALFORMER_FAIRSEQ says otherwise
elif [ "$choice" = auto ]; then
  source=$([ "$wheel_exists" = 1 ] && echo ve-fairseq || echo sdist)
else
  source=$choice
fi
if [ "${installed%% *}" = user ]; then source=user; fi

stamp="$venv/.fairseq-realformer-setup"
want=$(cat "$root/requirements.txt" "$root/setup.py" "$patch_file" <(echo "$source") | sha256 | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  pip=("$py" -m pip --disable-pip-version-check)
  if [ "$source" = ve-fairseq ] && [ "$wheel_exists" != 1 ]; then
    die "REALFORMER_FAIRSEQ=ve-fairseq: ve-fairseq has wheels for CPython 3.11/3.12 on Linux x86_64 only (this is Python $version on $(uname -s) $(uname -m)); use REALFORMER_FAIRSEQ=sdist or auto"
  fi
  # --- network: every install below needs the package index ---
  index=${PIP_INDEX_URL:-$("${pip[@]}" config get global.index-url 2>/dev/null || echo https://pypi.org/simple)}
  if ! reason=$("$py" - "$index" "${PIP_CERT:-}" <<'PY' 2>&1
import ssl, sys, urllib.request
index, cert = sys.argv[1].rstrip("/"), sys.argv[2]
context = ssl.create_default_context(cafile=cert or None)
try:
    urllib.request.urlopen(f"{index}/pip/", timeout=15, context=context)
except Exception as e:
    sys.exit(str(getattr(e, "reason", e)))
PY
  ); then
    die "cannot reach the package index $index ($reason): connect to the internet, or set PIP_INDEX_URL to a mirror you can reach"
  fi

  torch_index=()
  if ! command -v nvidia-smi >/dev/null 2>&1 && [ -z "${PIP_INDEX_URL:-}${PIP_EXTRA_INDEX_URL:-}" ]; then
    # PyPI's Linux torch wheels are CUDA builds (several GB); PyTorch's own CPU index has
    # `torch==2.13.0+cpu`. Use it when reachable; otherwise pip uses what it already sees.
    cpu_index=https://download.pytorch.org/whl/cpu
    if "$py" -c "import urllib.request; urllib.request.urlopen('$cpu_index/torch/', timeout=5)" 2>/dev/null; then
      say "no NVIDIA GPU: taking torch from $cpu_index"
      torch_index=(--extra-index-url "$cpu_index")
    fi
  fi

  # One fairseq package at a time: switching source removes the other of ours first.
  if [ "${installed%% *}" != user ] && [ -n "$installed" ] && [ "${installed%% *}" != "$source" ]; then
    say "removing ${installed#* } (switching to $source)"
    "${pip[@]}" uninstall -q -y "$(echo "${installed#* }" | cut -d= -f1)"
  fi

  fairseq_reqs=()
  case $source in
    ve-fairseq) fairseq_reqs=("${ve_fairseq_reqs[@]}") ;;
    sdist)
      # one wheel per patch and Python version (its name says which Python and platform)
      wheels="$cache/fairseq-0.12.2-patch-$(sha256 "$patch_file" | cut -c1-12)"
      cp=cp${version/./}
      wheel=$(ls "$wheels"/fairseq-0.12.2-"$cp"-*.whl 2>/dev/null | head -n 1 || true)
      if [ -n "$wheel" ]; then
        say "fairseq 0.12.2: reusing the wheel built before, $wheel"
      else
        "$root/scripts/build_fairseq_wheel.sh" "$py" "$wheels"
        wheel=$(ls "$wheels"/fairseq-0.12.2-"$cp"-*.whl | head -n 1)
      fi
      fairseq_reqs=("$wheel")
      ;;
  esac
  if [ "$source" = user ]; then
    # the user's fairseq, and the torch it runs on, stay as they are
    say "keeping the fairseq already installed (${installed#* }); installing the plugin only"
    "${pip[@]}" install -q ${torch_index[@]+"${torch_index[@]}"} -e "$root[test]"
  else
    say "installing torch, fairseq ($source) and the pinned stack (requirements.txt) in one pip command"
    # One command: without torch pinned beside them, pip would pick the newest torch (a CUDA build).
    "${pip[@]}" install -q ${torch_index[@]+"${torch_index[@]}"} -r "$root/requirements.txt" "${fairseq_reqs[@]}"
    if [ "$source" = sdist ]; then
      # a wheel of the same version built with an earlier patch counts as installed for pip
      "${pip[@]}" install -q --force-reinstall --no-deps "$wheel"
    fi
    "${pip[@]}" install -q --no-deps -e "$root"
  fi
  if [ "$source" = sdist ]; then
    "$py" -c 'import importlib.metadata as md; print("fairseq==" + md.version("fairseq"))' >"$record"
  else
    rm -f "$record"
  fi
  echo "$want" >"$stamp"
fi

"$py" - <<'PY'
import logging
logging.disable(logging.WARNING)  # fairseq's import-time hints are not this check's business
import importlib.metadata as md
import fairseq
from fairseq.models import ARCH_MODEL_REGISTRY
import fairseq_realformer
assert "realformer_wmt_en_de" in ARCH_MODEL_REGISTRY, "fairseq_realformer did not register its architectures"
dist = next(d for d in md.distributions() if "fairseq/__init__.py" in [str(f) for f in (d.files or [])])
print(f"[setup] ok: fairseq {fairseq.__version__} ({dist.metadata['Name']}) imports, fairseq_realformer registers "
      f"{sum(a.startswith(('realformer', 'admin')) for a in ARCH_MODEL_REGISTRY)} architectures")
PY
