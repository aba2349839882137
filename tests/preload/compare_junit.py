"""Compare two pytest JUnit XML reports test by test: same outcome for every test id, or a
non-zero exit listing the differences. Usage: compare_junit.py WITHOUT.xml WITH.xml"""
import sys
import xml.etree.ElementTree as ET


def outcomes(path):
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        key = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        if "failure" in kinds or "error" in kinds:
            out[key] = "failed"
        elif "skipped" in kinds:
            out[key] = "skipped"
        else:
            out[key] = "passed"
    return out


def summary(o):
    counts = {}
    for v in o.values():
        counts[v] = counts.get(v, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))


def main():
    a, b = outcomes(sys.argv[1]), outcomes(sys.argv[2])
    print(f"without preload: {summary(a)}")
    print(f"with preload:    {summary(b)}")
    diff = [(k, a.get(k, "absent"), b.get(k, "absent")) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    for k, x, y in diff[:50]:
        print(f"DIFFERENT {k}: without {x}, with {y}")
    if not a:
        print("no tests ran")
        return 1
    if diff:
        print(f"{len(diff)} tests differ")
        return 1
    print(f"same outcome for all {len(a)} tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
