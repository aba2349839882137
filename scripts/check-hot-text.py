#!/usr/bin/env python3
"""Check that the preload library's `.text` starts with the functions of
crates/fallow-preload/hot_text.txt (build.rs): no function left out of the list lies between
two listed ones, and `malloc` and `free` are among the first. Fails on a library linked in the
linker's own order (`FALLOW_HOT_TEXT=0`). Usage: scripts/check-hot-text.py LIBRARY
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIST = os.path.join(ROOT, 'crates', 'fallow-preload', 'hot_text.txt')


def listed_matcher():
    exact, prefixes = set(), []
    for line in open(LIST):
        name = line.strip()
        if not name or name.startswith('#'):
            continue
        # As build.rs matches sections: a Rust symbol up to its hash or a v0 one by prefix.
        if name.endswith('17h') or name.startswith('_R'):
            prefixes.append(name)
        else:
            exact.add(name)
    return lambda s: s in exact or any(s.startswith(p) for p in prefixes)


def main():
    lib = sys.argv[1]
    listed = listed_matcher()
    text = None
    for line in subprocess.run(['readelf', '-SW', lib], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.replace('[ ', '[').split()
        if len(parts) > 5 and parts[1] == '.text':
            text = (int(parts[3], 16), int(parts[3], 16) + int(parts[5], 16))
    assert text, f'{lib}: no .text'
    funcs = []
    for line in subprocess.run(['nm', '-S', '--defined-only', lib], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in 'tTwW':
            addr = int(parts[0], 16)
            if text[0] <= addr < text[1] and int(parts[1], 16) > 0:
                funcs.append((addr, parts[3]))
    funcs.sort()
    hot = [i for i, (_, s) in enumerate(funcs) if listed(s)]
    assert len(hot) > 20, f'{lib}: only {len(hot)} functions of the list found'
    # Between the first and the last listed function, every function is listed.
    strays = [s for _, s in funcs[hot[0]:hot[-1] + 1] if not listed(s)]
    assert not strays, f'{lib}: {len(strays)} functions outside the list among the listed ones, e.g. {strays[:3]}'
    span = funcs[hot[-1]][0] - text[0]
    for name in ('malloc', 'free'):
        addr = next(a for a, s in funcs if s == name)
        assert addr - text[0] < 16384, f'{lib}: {name} at {addr - text[0]:#x} into .text'
    print(f'hot-text: ok ({len(hot)} of {len(funcs)} functions in the first {span // 1024} KiB of {(text[1] - text[0]) // 1024} KiB)')


if __name__ == '__main__':
    main()
