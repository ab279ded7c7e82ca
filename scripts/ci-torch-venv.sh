#!/usr/bin/env bash
# Find (cached) or build (first time) the virtualenv with real PyTorch, transformers and Lightning
# that scripts/test.sh runs the whole suite in; print its path as the last line of stdout.
#
# The pins are the `train` extra of pyproject.toml (exact versions). The venv lives outside the
# repo, keyed by the torch version and a hash of the pins and the Python version:
#   ${GPUSCALER_CACHE_DIR:-~/.cache/gpuscaler}/venvs/torch-<torch version>-<hash>/
# It is built in place under a lock (flock on <venv>.lock) and marked complete last
# (<venv>/.gpuscaler-complete); a venv without the marker (a build that died) is removed and built
# again. Built in place because a venv moved by rename keeps its old absolute paths in its scripts.
# torch from PyPI brings its CUDA libraries: about 5 GB installed. The measured cold build is in
# docs/runtime.md ("CI"); a warm lookup takes about a second.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
CACHE="${GPUSCALER_CACHE_DIR:-$HOME/.cache/gpuscaler}"

read -r TORCH_VERSION KEY < <("$PYTHON" - <<'EOF'
import hashlib, sys, tomllib
pins = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["train"]
torch = [p.split("==", 1)[1] for p in pins if p.startswith("torch==")]
if not torch or not all("==" in p for p in pins):
    sys.exit("ci-torch-venv: the train extra of pyproject.toml must pin torch and every package with ==")
text = "\n".join(sorted(pins)) + f"\npython {sys.version_info.major}.{sys.version_info.minor}\n"
print(torch[0], hashlib.sha256(text.encode()).hexdigest()[:12])
EOF
)
VENV="$CACHE/venvs/torch-$TORCH_VERSION-$KEY"
MARKER="$VENV/.gpuscaler-complete"
mkdir -p "$CACHE/venvs"

exec 9>"$VENV.lock"
flock 9
if [ ! -f "$MARKER" ]; then
  echo "ci-torch-venv: building $VENV (torch $TORCH_VERSION; about 5 GB, first time only)" >&2
  started=$(date +%s)
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  pins=$("$PYTHON" -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml","rb"))["project"]["optional-dependencies"]["train"]))')
  # shellcheck disable=SC2086  # the pins are separate words
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check $pins >&2
  "$VENV/bin/python" -c "import torch, transformers, lightning, safetensors; print('torch', torch.__version__)" >&2
  took=$(( $(date +%s) - started ))
  printf 'pins: %s\nbuilt: %s\nseconds: %s\n' "$pins" "$(date -u +%FT%TZ)" "$took" >"$MARKER"
  echo "ci-torch-venv: built in ${took}s" >&2
fi
echo "$VENV"
