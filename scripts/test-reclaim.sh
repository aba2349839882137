#!/bin/sh
# Tests of free page reporting (issue 3) and background pre-zeroing (issue 4).
# Runnable from the repository root on a fresh machine; needs only a Rust toolchain.
set -eu
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null 2>&1; then
    echo "test-reclaim: cargo not found; install a Rust toolchain (rustup)" >&2
    exit 1
fi
# Release build: the concurrency tests run tight loops; debug assertions are covered by
# `cargo test -p fallow` in the main suite.
cargo test -p fallow --release --test report --test zero
