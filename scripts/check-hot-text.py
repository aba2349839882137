#!/usr/bin/env python3
"""Check that the preload library's `.text` starts with the functions of
crates/fallow-preload/hot_text.txt (build.rs): no function left out of the list lies between
two listed ones, and `malloc` and `free` are among the first. Fails on a library linked in the
linker's own order (`FALLOW_HOT_TEXT=0`). Usage: scripts/check-hot-text.py LIBRARY
"""
import fnmatch
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIST = os.path.join(ROOT, 'crates', 'fallow-preload', 'hot_text.txt')


def entries():
    """The list's patterns of symbol names, as build.rs puts them in the linker script."""
    return [line.strip() for line in open(LIST) if line.strip() and not line.startswith('#')]


def main():
    lib = sys.argv[1]
    patterns = entries()
    matched = set()

    def listed(symbol):
        hit = next((p for p in patterns if fnmatch.fnmatchcase(symbol, p)), None)
        if hit:
            matched.add(hit)
        return hit is not None

    sections = {}
    for line in subprocess.run(['readelf', '-SW', lib], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.replace('[ ', '[').split()
        if len(parts) > 5 and parts[1].startswith('.'):
            sections[parts[1]] = (int(parts[3], 16), int(parts[3], 16) + int(parts[5], 16))
    text = sections.get('.text')
    assert text, f'{lib}: no .text'
    # The PLT sections beside `.init`, before `.text` (every exit calls `__cxa_finalize`'s).
    for name in ('.plt', '.plt.got', '.plt.sec', '.fini'):
        if name in sections:
            assert sections[name][0] < text[0], f'{lib}: {name} after .text'
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
    unmatched = [p for p in patterns if p not in matched]
    if unmatched:
        # Not a failure: the list is refreshed by scripts/hot-text.py, not by the build.
        print(f'hot-text: {len(unmatched)} of {len(patterns)} entries match no function (e.g. {unmatched[:2]}): run scripts/hot-text.py')
    print(f'hot-text: ok ({len(hot)} of {len(funcs)} functions in the first {span // 1024} KiB of {(text[1] - text[0]) // 1024} KiB)')


if __name__ == '__main__':
    main()
