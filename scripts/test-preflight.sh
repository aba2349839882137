#!/usr/bin/env bash
# The first lines of `make test`: what it will run and install, before anything is built. The
# phases install the Debian packages they lack with apt-get (and numpy's into .venv with pip),
# which needs root: without root and with a package missing, stop here, naming the packages,
# instead of failing in the middle of the run.
set -euo pipefail
packages=(gcc pkg-config python3 python3-venv python3-pip file time redis-server redis-tools)
missing=()
for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
echo "== make test: phases lint, rust, debug, loom, bench, capi, install; each prints its counts when done"
echo "== make test: needs Debian packages ${packages[*]} (installed with apt-get when missing: needs root),"
echo "   a Python venv in .venv for numpy (pip), and the Rust toolchain with clippy"
command -v cargo >/dev/null || { echo "== make test: cargo not found: install Rust (rustup) first"; exit 1; }
if ((${#missing[@]})); then
    if [[ $(id -u) != 0 ]]; then
        echo "== make test: missing ${missing[*]}, and installing them needs root: run as root or install them first"
        exit 1
    fi
    echo "== make test: will install ${missing[*]} (running as root)"
else
    echo "== make test: every package is present"
fi
