#!/usr/bin/env bash
# numpy's whole test suite (`numpy.test("full")`'s set: pytest --pyargs numpy) run twice, without and
# with target/release/libfallow_preload.so, requiring the same outcome for every test. Long: about
# 7 minutes per run for numpy._core alone on a busy 2-core machine, several times that in all.
#   scripts/numpy-full-suite.sh            the whole suite (pytest --pyargs numpy)
#   scripts/numpy-full-suite.sh numpy._core    one package of it
# Reports (JUnit XML, logs, timings) go to target/capi-tests/numpy-full/.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
for pkg in python3-venv python3-pip file time; do
    dpkg -s "$pkg" >/dev/null 2>&1 || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg"; }
done
cargo build --release -p fallow-preload
# meson and ninja: numpy's test_mem_policy and test_array_interface build small C extensions.
if [[ ! -x .venv/bin/meson ]] || ! .venv/bin/python -c 'import numpy, pytest, hypothesis' 2>/dev/null; then
    python3 -m venv .venv
    .venv/bin/pip install -q numpy pytest hypothesis meson ninja
fi
tests/preload/numpy_core.sh "$root/.venv" "$root/target/release/libfallow_preload.so" \
    "$root/target/capi-tests/numpy-full" "${@:-numpy}"
