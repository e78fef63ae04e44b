#!/usr/bin/env bash
# Build (once) the virtualenv of the real-vLLM suite and print its path.
#
# The virtualenv is cached outside the checkout, keyed on the hash of
# tests/vllm/requirements.lock, so CI on a fresh clone builds it once per lock and reuses it
# after; Boomerang itself is reinstalled from this checkout on every call (seconds).
# Boomerang, not only the hook's package (hook/): the suite's fixtures migrate the database and
# start `boomerang registry/router/reaper` from this virtualenv. test_hook_package_alone.py sets
# it aside and shows that vLLM builds the connector from the boomerang-vllm-hook wheel alone.
# BOOMERANG_VLLM_VENV_CACHE moves the cache (default ~/.cache/boomerang).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
lock=tests/vllm/requirements.lock
key=$(sha256sum "$lock" | cut -c1-16)
cache=${BOOMERANG_VLLM_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/boomerang}
venv="$cache/vllm-venv-$key"
quiet=(--quiet --disable-pip-version-check)
mkdir -p "$cache"
# One build at a time per lock: CI starts one early in the background, and `make test-vllm`
# waits here for it instead of starting another.
exec 9>"$cache/vllm-venv-$key.lock"
flock 9
if [ ! -f "$venv/.complete" ]; then
    echo "vllm-suite: building $venv (vLLM 0.33.0, torch 2.13.0 CPU build; once per lock)" >&2
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    # Exactly the lock, nothing resolved: vLLM's own metadata asks for torch 2.14.0 and CUDA
    # packages that this CPU-only suite neither needs nor can use.
    "$venv/bin/python" -m pip install "${quiet[@]}" --no-deps -r "$lock" >&2
    touch "$venv/.complete"
fi
# BOOMERANG_VLLM_VENV_ONLY=1 (CI's early build) stops here: `make test-vllm` reinstalls Boomerang anyway.
if [ -z "${BOOMERANG_VLLM_VENV_ONLY:-}" ]; then
    # From a copy of the sources: setuptools builds where the sources are (build/, *.egg-info),
    # and an egg-info at the checkout's root is the metadata any Python started there reads.
    src=$(mktemp -d)
    trap 'rm -rf "$src"' EXIT
    tar -c --exclude=__pycache__ --exclude='*.egg-info' --exclude=build \
        pyproject.toml README.md client libs services tools hook | tar -x -C "$src"
    "$venv/bin/python" -m pip install "${quiet[@]}" --no-deps --no-build-isolation --force-reinstall \
        "$src/client" "$src" "$src/tools" "$src/hook" >&2
fi
echo "$venv"
