#!/usr/bin/env python3
"""Rewrites the code blocks of docs/library.md from the examples they quote.

A snippet in the guide is a marker line
    <!-- snippet: examples/FILE.cpp#NAME -->
followed by a ```cpp block; its text is the region between `// [guide:NAME]` and
`// [/guide:NAME]` in examples/FILE.cpp, common indentation removed. The test
LibraryGuide.EverySnippetIsTheExampleCode (tests/install/library_guide_test.cpp) checks the
same rule. Usage: scripts/sync_guide_snippets.py [docs/library.md]
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r"<!-- snippet: (examples/[A-Za-z0-9_]+\.cpp)#([A-Za-z0-9_]+) -->")


def region(path, name):
    lines, inside, found = [], False, False
    with open(os.path.join(ROOT, path)) as f:
        for line in f.read().split("\n"):
            if "// [/guide:%s]" % name in line:
                inside = False
                continue
            if "// [guide:%s]" % name in line:
                inside = found = True
                continue
            if inside:
                lines.append(line)
    if not found:
        sys.exit("%s has no region // [guide:%s]" % (path, name))
    indent = min((len(l) - len(l.lstrip(" ")) for l in lines if l.strip()), default=0)
    return [l[indent:] if len(l) >= indent else "" for l in lines]


def main():
    doc = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "docs/library.md")
    with open(doc) as f:
        lines = f.read().split("\n")
    out, i = [], 0
    while i < len(lines):
        out.append(lines[i])
        m = MARKER.search(lines[i])
        i += 1
        if not m:
            continue
        if i < len(lines) and lines[i] == "```cpp":  # drop the old block
            i += 1
            while i < len(lines) and lines[i] != "```":
                i += 1
            i += 1
        out += ["```cpp"] + region(m.group(1), m.group(2)) + ["```"]
    tmp = doc + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(out))
    os.replace(tmp, doc)


if __name__ == "__main__":
    main()
