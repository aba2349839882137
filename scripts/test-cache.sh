#!/usr/bin/env bash
# Tests of the per-thread page caches (issue 5): the cache tests, then the core tests (model,
# stress, errors, backing), which must pass unchanged with caches on (the default), in debug (overflow
# checks, debug assertions) and release builds. Runnable from the repo root on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "cargo not found: install Rust (rustup) first" >&2; exit 1; }
cargo test -p fallow --test cache
cargo test -p fallow --release --test cache --test model --test stress --test errors --test backing
