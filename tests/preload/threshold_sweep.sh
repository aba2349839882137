#!/usr/bin/env bash
# The measurement behind the default FALLOW_THRESHOLD (docs/design.md, "C API and preload").
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q -p fallow-preload
mkdir -p target/capi-tests
gcc -O2 -fno-builtin -o target/capi-tests/threshold_sweep tests/preload/threshold_sweep.c
for round in 1 2; do
    echo "glibc (round $round):"; target/capi-tests/threshold_sweep
    echo "fallow for every size (round $round):"
    FALLOW_THRESHOLD=4096 LD_PRELOAD=$PWD/target/release/libfallow_preload.so target/capi-tests/threshold_sweep
done
