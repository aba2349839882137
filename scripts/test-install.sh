#!/usr/bin/env bash
# Installation as C users expect: `make install` into a temporary prefix, the C API tests
# (tests/c/capi_test.c, capi_small_test.c, capi_fork_test.c) built against that prefix's
# `pkg-config --cflags --libs fallow` and against its static library and run, the installed
# preload library and `fallow` command run; again with DESTDIR staging (the files name PREFIX,
# not DESTDIR); `make uninstall` leaves no file behind. Then `cargo package -p fallow` (with its verifying
# build) and `cargo doc -p fallow --no-deps` without a warning; the README's links stay inside
# the repository (scripts/check-links.py). Everything is written under
# target/install-test, removed at the end. Run from anywhere; needs gcc and pkg-config (installed
# with apt-get when missing, which needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$root/target/install-test
fail() { echo "test-install: FAILED: $*"; exit 1; }
checks=0
ok() { checks=$((checks + 1)); echo "test-install: ok $*"; }

missing=()
for pkg in gcc pkg-config; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
    [[ $(id -u) == 0 ]] || fail "missing ${missing[*]}; installing them needs root (apt-get)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

# The files `make install` must put under a prefix.
expected="bin/fallow
include/fallow.h
lib/libfallow.a
lib/libfallow.so
lib/libfallow_preload.so
lib/pkgconfig/fallow.pc"

files_under() { (cd "$1" && find . -type f -o -type l | sed 's|^\./||' | sort); }

# 1. A plain prefix.
prefix=$work/prefix
make -s install PREFIX="$prefix" >/dev/null
[[ $(files_under "$prefix") == "$expected" ]] || fail "installed files: $(files_under "$prefix" | tr '\n' ' ')"
ok "make install PREFIX puts the six files in place"
grep -qx "libdir=$prefix/lib" "$prefix/lib/pkgconfig/fallow.pc" || fail "fallow.pc does not name $prefix/lib"
grep -qx "includedir=$prefix/include" "$prefix/lib/pkgconfig/fallow.pc" || fail "fallow.pc does not name $prefix/include"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
flags=$(pkg-config --cflags --libs fallow)
[[ $flags == *"-I$prefix/include"* && $flags == *"-L$prefix/lib"* ]] || fail "pkg-config gives: $flags"
[[ $(pkg-config --modversion fallow) == $(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1) ]] \
    || fail "pkg-config version $(pkg-config --modversion fallow)"
ok "pkg-config --cflags --libs fallow: $flags"
# Every C test of the C API (the library's calls, small objects, fork), against the installed
# shared library and the installed static one.
for t in capi_test capi_small_test capi_fork_test; do
    # shellcheck disable=SC2086
    gcc -O2 -Wall -Werror -fno-builtin -o "$work/$t" "tests/c/$t.c" $flags -lpthread
    ldd "$work/$t" > "$work/ldd.txt"
    grep -q "libfallow.so => $prefix/lib/libfallow.so" "$work/ldd.txt" || { cat "$work/ldd.txt"; fail "$t not linked to the installed library"; }
    "$work/$t" > "$work/$t.log" || { cat "$work/$t.log"; fail "$t against the installed library"; }
    ok "$t built against the installed prefix: $(grep -c '^ok' "$work/$t.log") ok"
    gcc -O2 -Wall -Werror -o "$work/${t}_static" "tests/c/$t.c" $(pkg-config --cflags fallow) \
        "$prefix/lib/libfallow.a" -lpthread -ldl -lm
    "$work/${t}_static" > "$work/${t}_static.log" || { cat "$work/${t}_static.log"; fail "$t against the installed libfallow.a"; }
    ok "$t against the installed libfallow.a: $(grep -c '^ok' "$work/${t}_static.log") ok"
done
out=$(LD_PRELOAD=$prefix/lib/libfallow_preload.so FALLOW_STATS=1 python3 -c 'b = bytearray(64 << 20)' 2>&1)
grep -q "alloc_calls" <<<"$out" || fail "the installed preload library printed no statistics: $out"
ok "installed preload library serves a 64 MiB bytearray"
"$prefix/bin/fallow" --help >/dev/null || fail "installed fallow --help"
ok "installed fallow command runs"
make -s uninstall PREFIX="$prefix" >/dev/null
[[ -z $(files_under "$prefix") ]] || fail "left after uninstall: $(files_under "$prefix" | tr '\n' ' ')"
ok "make uninstall removes every file"

# 2. DESTDIR staging: files under DESTDIR, paths inside them name PREFIX.
stage=$work/stage
make -s install DESTDIR="$stage" PREFIX=/opt/fallow >/dev/null
[[ $(files_under "$stage/opt/fallow") == "$expected" ]] || fail "staged files: $(files_under "$stage" | tr '\n' ' ')"
[[ $(files_under "$stage") == "$(sed 's|^|opt/fallow/|' <<<"$expected")" ]] || fail "files outside the prefix"
grep -qx "libdir=/opt/fallow/lib" "$stage/opt/fallow/lib/pkgconfig/fallow.pc" || fail "staged fallow.pc names DESTDIR"
! grep -q "$stage" "$stage/opt/fallow/lib/pkgconfig/fallow.pc" || fail "staged fallow.pc names DESTDIR"
ok "make install DESTDIR PREFIX=/opt/fallow stages the six files, fallow.pc naming /opt/fallow"
make -s uninstall DESTDIR="$stage" PREFIX=/opt/fallow >/dev/null
[[ -z $(files_under "$stage") ]] || fail "left after uninstall: $(files_under "$stage" | tr '\n' ' ')"
ok "make uninstall DESTDIR removes every file"

# 3. The crate as crates.io would take it: packaged and built from the package alone.
cargo package -q -p fallow --allow-dirty 2>"$work/package.err" || { cat "$work/package.err"; fail "cargo package -p fallow"; }
grep -i "warning" "$work/package.err" && fail "cargo package -p fallow warns"
ok "cargo package -p fallow (verified)"
RUSTDOCFLAGS="-D warnings" cargo doc -q -p fallow --no-deps --release 2>"$work/doc.err" \
    || { cat "$work/doc.err"; fail "cargo doc -p fallow --no-deps warns or fails"; }
ok "cargo doc -p fallow --no-deps without warnings"

# 4. The README links only inside the repository, to files and headings that exist.
python3 scripts/check-links.py README.md >/dev/null || { python3 scripts/check-links.py README.md; fail "README links"; }
ok "every README link is inside the repository and resolves"

echo "test-install: all $checks checks passed"
