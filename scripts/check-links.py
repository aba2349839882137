#!/usr/bin/env python3
"""Every link of the given Markdown files stays inside the repository: no URL (a scheme such as
https:, or a bare www. address), no absolute path; each target file or directory exists; and each
#anchor names a heading of its target (GitHub's slugs: lower case, punctuation dropped, spaces to
hyphens). Prints one line per bad link and exits 1 if there is any.
    scripts/check-links.py README.md [more.md ...]"""
import os
import re
import sys

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://|\bwww\.", re.I)


def strip_code(text):
    # Links are not links inside code blocks or spans.
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slugs(path):
    out = set()
    counts = {}
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"^```.*?^```", "", f.read(), flags=re.S | re.M)
    for line in text.splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = re.sub(r"[^\w\- ]", "", m.group(1).replace("`", "").lower()).replace(" ", "-")
        n = counts.get(s, 0)
        counts[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def check(md):
    bad = []
    base = os.path.dirname(md) or "."
    with open(md, encoding="utf-8") as f:
        text = strip_code(f.read())
    for m in URL.finditer(text):
        line = text[: m.start()].count("\n") + 1
        bad.append(f"{md}: an address outside the repository near line {line}: {text[m.start():m.start() + 60]!r}")
    for m in LINK.finditer(text):
        target = m.group(1)
        if URL.match(target) or target.startswith("/") or target.startswith("mailto:"):
            continue  # reported above, or absolute
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(base, path)) if path else md
        if not os.path.exists(full):
            bad.append(f"{md}: link to {target}: {full} does not exist")
            continue
        if anchor and full.endswith(".md") and anchor not in slugs(full):
            bad.append(f"{md}: link to {target}: no heading #{anchor} in {full}")
    for m in re.finditer(r"\]\((/[^)]*)\)", text):
        bad.append(f"{md}: absolute link {m.group(1)}")
    return bad


def main():
    bad = [b for md in sys.argv[1:] for b in check(md)]
    for b in bad:
        print(b)
    if bad:
        sys.exit(1)
    print(f"check-links: ok {len(sys.argv) - 1} files, every link inside the repository")


if __name__ == "__main__":
    main()
