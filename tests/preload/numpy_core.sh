#!/usr/bin/env bash
# Run numpy's own tests twice, without and with libfallow_preload.so, and require the same
# outcome for every test. The interpreter binary itself runs under LD_PRELOAD (the venv's python
# is a symlink to it, not a wrapper script).
#   tests/preload/numpy_core.sh VENV PRELOAD_SO OUTDIR [pytest --pyargs targets..., default numpy._core]
set -euo pipefail
venv=$1 so=$2 out=$3
shift 3
targets=("${@:-numpy._core}")
mkdir -p "$out"
# The venv's python is a symlink to the interpreter binary: running it by that path keeps the venv.
py=$venv/bin/python
file -L "$py" | grep -q ELF || { echo "$py is not an ELF binary"; exit 1; }
export PYTHONPATH= PYTHONHASHSEED=0
run() {
    local name=$1; shift
    # Run from an empty directory so that pytest imports the installed numpy.
    ( cd "$out" && env "$@" /usr/bin/time -f "%e s wall, %U s user, %S s sys, max RSS %M KiB" \
        "$py" -m pytest --pyargs "${targets[@]}" -q -p no:cacheprovider --hypothesis-seed=0 \
        --basetemp="$out/$name-tmp" --junitxml="$out/$name.xml" > "$out/$name.log" 2>&1 ) || true
    # pytest's temporary files (numpy's C extension builds among them) stay out of /tmp.
    rm -rf "$out/$name-tmp"
    echo "$name: $(tail -n 2 "$out/$name.log" | tr '\n' ' ')"
}
export PATH="$venv/bin:$PATH"
run without FALLOW_UNUSED=1
run with LD_PRELOAD="$so"
python3 "$(dirname "$0")/compare_junit.py" "$out/without.xml" "$out/with.xml"
