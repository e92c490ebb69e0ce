#!/usr/bin/env python3
"""structure.py BUILD SOURCE: checks the library's structure as
docs/architecture.md states it: its files call one another only downward,
and no function is longer than one head can hold.

What a file calls is read from the object files the build made (nm: the
global names each object defines and the names it leaves undefined), so a
call through a header, a macro or an inline function counts as the linker
sees it; a call through a function pointer (a vtable, a callback) does not,
which is how a lower layer is told to act without naming the layer above.

Three checks, each failing with what breaks it:
  1. in src/core/, every file listed in docs/architecture.md's layer block
     calls only files listed below it, and every .c file of src/core/ is
     listed (the picture cannot go stale);
  2. no circle of calls among the files of src/ (Tarjan's strongly
     connected components over the whole library);
  3. no function in src/ over MAX_LINES lines, from its signature to its
     closing brace (the project's clang-format style puts a function's
     closing brace alone in column 0).
Exit status 0 when both hold, 1 with the offending calls, 2 on bad input.
"""
import os
import re
import subprocess
import sys
from collections import defaultdict

MAX_LINES = 100


def fail_input(msg):
    print("structure.py: " + msg, file=sys.stderr)
    sys.exit(2)


def objects(build):
    """{source path relative to the project ('src/core/slab.c'): object}."""
    root = os.path.join(build, "CMakeFiles", "mlo_obj.dir")
    found = {}
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".c.o"):
                rel = os.path.relpath(os.path.join(d, f), root)[: -len(".o")]
                found[rel] = os.path.join(d, f)
    if not found:
        fail_input("no library objects under %s (build the project first)" % root)
    return found


def call_graph(objs):
    defined = defaultdict(set)
    wanted = {}
    for src, obj in objs.items():
        out = subprocess.run(["nm", "-g", obj], capture_output=True, text=True, check=True).stdout
        wanted[src] = set()
        for line in out.splitlines():
            f = line.split()
            if len(f) == 2 and f[0] == "U":
                wanted[src].add(f[1])
            elif len(f) == 3 and f[1] in "TDBRCVW":
                defined[f[2]].add(src)
    calls = defaultdict(dict)  # caller -> {callee: one name it takes}
    for src, names in wanted.items():
        for name in sorted(names):
            owners = defined.get(name, set())
            if len(owners) == 1:
                callee = next(iter(owners))
                if callee != src:
                    calls[src].setdefault(callee, name)
    return calls


def documented_order(source):
    """The files of src/core/ as docs/architecture.md lists them, top first."""
    path = os.path.join(source, "docs", "architecture.md")
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        fail_input("cannot read %s: %s" % (path, e))
    m = re.search(r"## Layers\s*\n```\n(.*?)\n```", text, re.S)
    if not m:
        fail_input("%s has no layer block under '## Layers'" % path)
    order, folder = [], None
    for line in m.group(1).splitlines():
        head = re.match(r"^(src/\w+/|tools/\w+/|-- )", line)
        if head:
            folder = head.group(1)
        name = re.match(r"^(?:src/\w+/)?\s+(\w+\.c)\s", line)
        if folder == "src/core/" and name:
            order.append("src/core/" + name.group(1))
    if not order:
        fail_input("%s lists no file under src/core/" % path)
    return order


def long_functions(source):
    """(file, line, name, lines) of each function in src/ over MAX_LINES."""
    found = []
    for d, _, files in os.walk(os.path.join(source, "src")):
        for f in sorted(files):
            if not f.endswith(".c"):
                continue
            path = os.path.join(d, f)
            lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
            i = 0
            while i < len(lines):
                head = re.match(r"^[A-Za-z_][\w \*]*?\b(\w+)\(", lines[i])
                if head and not lines[i].rstrip().endswith(";"):
                    j = i
                    while j < len(lines) and not lines[j].rstrip().endswith(("{", ";")):
                        j += 1
                    if j < len(lines) and lines[j].rstrip().endswith("{"):
                        k = j + 1
                        while k < len(lines) and lines[k] != "}":
                            k += 1
                        if k - i + 1 > MAX_LINES:
                            found.append((os.path.relpath(path, source), i + 1, head.group(1), k - i + 1))
                        i = k
                i += 1
    return found


def circles(calls, nodes):
    index, low, on, stack, found, n = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in calls.get(v, {}):
            if w not in nodes:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


def main():
    if len(sys.argv) != 3:
        fail_input("usage: structure.py BUILD SOURCE")
    build, source = sys.argv[1], sys.argv[2]
    calls = call_graph(objects(build))
    problems = []

    order = documented_order(source)
    rank = {f: i for i, f in enumerate(order)}
    core_dir = os.path.join(source, "src", "core")
    for f in sorted(os.listdir(core_dir)):
        if f.endswith(".c") and "src/core/" + f not in rank:
            problems.append("src/core/%s is not in docs/architecture.md's layer block" % f)
    for caller in order:
        for callee, name in sorted(calls.get(caller, {}).items()):
            if callee in rank and rank[callee] <= rank[caller]:
                problems.append(
                    "%s calls %s (%s), which docs/architecture.md lists above it"
                    % (caller, callee, name)
                )

    lib = {s for s in calls} | {c for cs in calls.values() for c in cs}
    lib = {s for s in lib if s.startswith("src/")}
    for comp in circles(calls, lib):
        ties = [
            "%s -> %s (%s)" % (a, b, calls[a][b]) for a in comp for b in comp if b in calls.get(a, {})
        ]
        problems.append("circle of %d files: %s" % (len(comp), "; ".join(ties)))

    for path, line, name, n in long_functions(source):
        problems.append("%s:%d: %s is %d lines (at most %d)" % (path, line, name, n, MAX_LINES))

    for p in problems:
        print(p)
    if problems:
        return 1
    print("structure: %d files of src/core/ call only downward; no circle among %d files of "
          "src/; no function over %d lines" % (len(order), len(lib), MAX_LINES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
