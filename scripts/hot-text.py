#!/usr/bin/env python3
"""Write crates/fallow-preload/hot_text.txt: the preload's functions that programs execute.

The preload library's build places these functions first in its `.text` (build.rs, the linker
script it writes from this list), so that the code a program runs lies in a few pages: the
kernel maps a file's pages 64 KiB around each page fault ("fault-around"), and code scattered
over the library's 444 KiB of text made all of its text mapping (448 KiB) resident in a small
program, against 208 KiB with the executed code together (docs/measurements.md, "The preload's hot text").

How: run programs of our own (small and large requests, calloc and realloc, threads, a Python
run; small objects off and on, the workers on) under callgrind with the preload, and list every
function of the preload that executed at least one instruction, the most executed first. A Rust
symbol is written without its hash (`..17h*`), and the standard library's
(v0) symbols with `Cs*_` for their crates' hashes, so that the list survives changes of the code
and of the toolchain; a function missing from it only lies where the linker puts it otherwise.

Usage: scripts/hot-text.py  (needs valgrind, gcc, python3; about two minutes). Run it again when
the paths a program takes change (a new function on the hot path, a new start-up step);
`scripts/check-hot-text.py` (make test) checks the layout, not the list's freshness.
"""
import collections
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIST = os.path.join(ROOT, 'crates', 'fallow-preload', 'hot_text.txt')
# callgrind names an object by its real path.
SO = os.path.realpath(os.path.join(os.environ.get('CARGO_TARGET_DIR', os.path.join(ROOT, 'target')), 'release', 'libfallow_preload.so'))

# (program and arguments, FALLOW_SMALL)
PYTHON_WORK = "import json, random; d = [{'k': str(i) * (i % 50), 'v': list(range(i % 9))} for i in range(20000)]; s = json.dumps(d); json.loads(s); sorted(s.split(','))"


def runs(tmp):
    pair, threads = os.path.join(tmp, 'pair_loop'), os.path.join(tmp, 'hot_threads')
    out = []
    for small in ('0', '1'):
        out += [
            ([pair, '64', '200000', 'm+'], small),
            ([pair, '4096', '50000', 'c+'], small),
            ([pair, '1000', '50000', 'r'], small),
            ([pair, '524288', '3000', 'm'], small),
            ([threads, '2048', '2', 'm', '2'], small),
            ([threads, '1048576', '2', 'c', '2'], small),
            (['python3', '-c', PYTHON_WORK], small),
        ]
    return out


def executed(path, obj):
    """Functions of `obj` with instructions in a callgrind output file (name compression:
    `fn=(id) name` defines an id, `fn=(id)` uses it; the counts of a call line belong to the
    callee and are skipped)."""
    names = {'ob': {}, 'fn': {}}
    cur_ob = cur_fn = None
    skip_next = False
    counts = collections.Counter()
    for line in open(path, errors='replace'):
        m = re.match(r'(c?)(ob|fn)=\((\d+)\)(?: (.*))?$', line.rstrip('\n'))
        if m:
            caller, kind, ident, name = m.groups()
            if name:
                names[kind][ident] = name
            if not caller:
                if kind == 'ob':
                    cur_ob = names['ob'].get(ident)
                else:
                    cur_fn = names['fn'].get(ident)
            continue
        if line.startswith('calls='):
            skip_next = True
            continue
        if line[:1].isdigit() or line[:1] in '+-*':
            if skip_next:
                skip_next = False
                continue
            if cur_ob == obj and cur_fn:
                parts = line.split()
                if len(parts) >= 2:
                    counts[cur_fn] += int(parts[1])
    return counts


def pattern(symbol):
    """The list's pattern for a symbol (the linker's and the check's, as it stands): a Rust
    legacy symbol up to its hash, then `*`; a v0 one (the standard library's) with `Cs*_` for its
    crates' hashes, which change with the toolchain, then `*` (an `.llvm.N` suffix); a C symbol
    exactly."""
    symbol = symbol.split("'")[0]  # callgrind's mark of a recursion level
    m = re.match(r'(_ZN.*?17h)[0-9a-f]{16}E', symbol)
    if m:
        return m.group(1) + '*'
    symbol = re.sub(r'\.llvm\.\d+$', '', symbol)
    if symbol.startswith('_R'):
        return re.sub(r'Cs[0-9A-Za-z]+_', 'Cs*_', symbol) + '*'
    return symbol


def main():
    subprocess.run(['cargo', 'build', '--release', '-q', '-p', 'fallow-preload'], cwd=ROOT, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in ('pair_loop', 'hot_threads'):
            subprocess.run(['gcc', '-O2', '-pthread', '-o', os.path.join(tmp, name), os.path.join(ROOT, 'scripts', name + '.c')], check=True)
        total = collections.Counter()
        for i, (cmd, small) in enumerate(runs(tmp)):
            out = os.path.join(tmp, f'cg.{i}')
            env = dict(os.environ, LD_PRELOAD=SO, FALLOW_SMALL=small)
            subprocess.run(['valgrind', '--tool=callgrind', '--demangle=no', f'--callgrind-out-file={out}'] + cmd,
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            got = executed(out, SO)
            if not got:
                sys.exit(f'no function of {SO} executed in {cmd[0]}: was the library loaded?')
            print(f'{" ".join(os.path.basename(c) for c in cmd[:2])} FALLOW_SMALL={small}: {len(got)} functions', file=sys.stderr)
            total.update(got)
    order = []
    for symbol, _ in total.most_common():
        p = pattern(symbol)
        # Addresses (the C start files' functions, which the script places by file) and
        # duplicates are left out.
        if not p.startswith('0x') and p not in order:
            order.append(p)
    with open(LIST, 'w') as f:
        f.write('# The preload\'s functions that programs execute, the most executed first: build.rs places\n')
        f.write('# them first in the library\'s .text. Written by scripts/hot-text.py; each line a pattern of\n')
        f.write('# symbol names (`*` for a Rust symbol\'s hash and a crate\'s).\n')
        for p in order:
            f.write(p + '\n')
    print(f'{len(order)} functions written to {os.path.relpath(LIST, ROOT)}', file=sys.stderr)


if __name__ == '__main__':
    main()
