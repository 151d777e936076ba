#!/usr/bin/env bash
# The Python wheel's tests (#45, docs/python.md), run by tests/it/python.rs: builds the
# wheel with maturin from PyPI (in a virtualenv of its own, through pip's PEP 517 path as
# `pip wheel .` takes it), installs it with NumPy and pytest into a fresh virtualenv, and
# runs tests/python/ there. Everything it makes lives in one temporary directory,
# removed on exit. The release build goes to $CARGO_TARGET_DIR (default: the repository's
# target/), so a second run only relinks.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target}
python=${PYTHON:-python3}
# Run by `cargo test`, the environment carries the test crate's CARGO_MANIFEST_DIR,
# CARGO_PKG_* and the like: build scripts that watch them (ring's) would run again and the
# release build start over (and again at the next plain `cargo build --release`).
for v in $(compgen -e | grep -E '^CARGO_(MANIFEST_|PKG_|CRATE_NAME|BIN_NAME|PRIMARY_PACKAGE)'); do
  unset "$v"
done

tmp=$(mktemp -d /tmp/twofold-python-tests.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'echo "python-tests: FAILED: $BASH_COMMAND (line $LINENO)" >&2' ERR

"$python" -m venv "$tmp/build"
"$tmp/build/bin/python" -m pip install -q --disable-pip-version-check maturin
start=$SECONDS
# maturin's PEP 517 backend runs the `maturin` on PATH: the build virtualenv's.
PATH="$tmp/build/bin:$PATH" "$tmp/build/bin/python" -m pip wheel -q --disable-pip-version-check --no-cache-dir --no-deps \
  --no-build-isolation --wheel-dir "$tmp/wheels" "$repo"
build_s=$((SECONDS - start))
wheel=$(ls "$tmp"/wheels/twofold-*.whl)
size=$(stat -c %s "$wheel")
echo "python-tests: built $(basename "$wheel") ($((size / 1024)) KiB) in ${build_s} s"

"$python" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel" numpy pytest

# The proof's point cache in the run's directory, not the host's /var/cache/twofold;
# no bytecode or pytest cache written into the repository.
status=0
(
  cd "$repo/tests/python"
  PATH="$tmp/venv/bin:$PATH" \
    TWOFOLD_WHEEL="$wheel" TWOFOLD_REPO="$repo" TWOFOLD_INDEX_CACHE="$tmp/index" \
    PYTHONDONTWRITEBYTECODE=1 \
    "$tmp/venv/bin/python" -m pytest -p no:cacheprovider -v -rfEs --basetemp "$tmp/pytest" \
    --rootdir . .
) 2>&1 | tee "$tmp/pytest.log" || status=$?
summary=$(grep -E '^=+ .*(passed|failed|error).* in [0-9.]+s' "$tmp/pytest.log" | tail -1 | tr -d '=' | sed 's/^ *//; s/ *$//')
if [ "$status" = 0 ]; then
  echo "python-tests: ok: ${summary:-no summary} (wheel $((size / 1024)) KiB, built in ${build_s} s)"
else
  echo "python-tests: FAILED: ${summary:-pytest did not run} (wheel $((size / 1024)) KiB)"
fi
exit "$status"
