#!/usr/bin/env bash
# Build fairseq 0.12.2 from PyPI's source distribution (hash-checked) with
# scripts/fairseq-0.12.2.patch applied, into a wheel for the given interpreter. scripts/setup_env.sh
# calls it where no ve-fairseq wheel exists; its output is the wheel in OUT_DIR.
#
#   scripts/build_fairseq_wheel.sh PYTHON OUT_DIR
#
# Needs a C/C++ compiler and the interpreter's headers (fairseq's Cython and C++ extensions), and
# the package index (the sdist; setuptools, Cython and numpy for the isolated build). Each missing
# one is one line naming the fix, before anything is downloaded.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ $# -ne 2 ]; then sed -n '2,10p' "$0" | cut -c3-; exit 2; fi
py=$1
out=$2
patch_file=$root/scripts/fairseq-0.12.2.patch
sdist_sha256=34f1b18426bf3844714534162f065ab733e049597476daa35fffb4d06a92b524  # PyPI's fairseq-0.12.2.tar.gz

say() { echo "[setup] $*"; }
die() { echo "[setup] error: $*" >&2; exit 1; }

version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
case $(uname -s) in
  Darwin) fix="xcode-select --install" ;;
  *) fix="sudo apt install build-essential python$version-dev (Debian/Ubuntu), sudo dnf install gcc-c++ python3-devel (Fedora), or in conda: conda install -c conda-forge cxx-compiler" ;;
esac
for compiler in "${CC:-cc}" "${CXX:-c++}"; do
  command -v "$compiler" >/dev/null 2>&1 ||
    die "building fairseq 0.12.2 needs a C/C++ compiler ('$compiler' not found): $fix"
done
headers=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[ -e "$headers/Python.h" ] ||
  die "building fairseq 0.12.2 needs Python $version's headers ($headers/Python.h not found): $fix"
command -v patch >/dev/null 2>&1 || command -v git >/dev/null 2>&1 ||
  die "applying scripts/fairseq-0.12.2.patch needs 'patch' or 'git': sudo apt install patch (Debian/Ubuntu)"

work=$(mktemp -d "${TMPDIR:-/tmp}/fairseq-0.12.2-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$SECONDS
say "fairseq 0.12.2: downloading PyPI's sdist (sha256 checked)"
echo "fairseq==0.12.2 --hash=sha256:$sdist_sha256" >"$work/requirement.txt"
"$py" -m pip --disable-pip-version-check download -q --no-deps --no-binary fairseq --require-hashes \
  -r "$work/requirement.txt" -d "$work" >"$work/download.log" 2>&1 || {
  tail -n 5 "$work/download.log" >&2
  die "downloading fairseq 0.12.2's sdist failed (the pip output is above)"
}
tar xzf "$work/fairseq-0.12.2.tar.gz" -C "$work" --no-same-owner

say "fairseq 0.12.2: applying scripts/fairseq-0.12.2.patch"
if command -v patch >/dev/null 2>&1; then
  patch -p1 -s -d "$work/fairseq-0.12.2" <"$patch_file"
else  # outside any repository (the ceiling), so that git applies it to this folder
  (cd "$work/fairseq-0.12.2" && GIT_CEILING_DIRECTORIES="$work" git apply "$patch_file")
fi

say "fairseq 0.12.2: building the wheel (Cython and C++ extensions; about a minute) -> $out"
mkdir -p "$out"
"$py" -m pip --disable-pip-version-check wheel -q --no-deps -w "$work/dist" "$work/fairseq-0.12.2" \
  >"$work/build.log" 2>&1 || {
  grep -E "error|Error" "$work/build.log" | tail -n 5 >&2 || true
  die "building fairseq 0.12.2 failed (its errors are above)"
}
wheel=$(basename "$work"/dist/fairseq-0.12.2-*.whl)
mv "$work/dist/$wheel" "$out/"
say "fairseq 0.12.2: built in $((SECONDS - start)) s: $out/$wheel"
