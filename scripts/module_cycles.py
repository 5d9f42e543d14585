#!/usr/bin/env python3
"""No import cycles between the library's top-level modules (src/<module>/ or src/<module>.rs).

Reads every `crate::<module>` path in src/ (comments and `#[cfg(test)]` blocks and *tests*.rs
files left out; the binaries in src/bin/ are not part of the library), builds the graph of
top-level modules and fails, naming the files on each edge, when any strongly connected
component holds more than one module.
    python3 scripts/module_cycles.py [SRC_DIR]
"""
import collections
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "src"
tops = {e[:-3] if e.endswith(".rs") else e for e in os.listdir(root) if e not in ("bin", "lib.rs", "main.rs")}
edges = collections.defaultdict(lambda: collections.defaultdict(set))


def strip(t):
    t = re.sub(r"//[^\n]*", "", t)
    return re.sub(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{.*", "", t, flags=re.S)


for dp, _, fs in os.walk(root):
    if os.path.relpath(dp, root).split(os.sep)[0] == "bin":
        continue
    for f in fs:
        if not f.endswith(".rs") or "tests" in f:
            continue
        p = os.path.join(dp, f)
        rel = os.path.relpath(p, root)
        top = rel.split(os.sep)[0]
        top = top[:-3] if top.endswith(".rs") else top
        if top == "lib":
            continue
        txt = strip(open(p, encoding="utf-8").read())
        names = re.findall(r"crate::(\w+)", txt)
        for group in re.findall(r"crate::\{([^}]*)\}", txt):
            names += re.findall(r"(?:^|[,\s{])(\w+)", group)
        for t in names:
            if t in tops and t != top:
                edges[top][t].add(rel)

graph = {a: set(edges[a]) for a in tops}
index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]


def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in graph[v]:
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        scc = []
        while True:
            w = stack.pop()
            on.discard(w)
            scc.append(w)
            if w == v:
                break
        sccs.append(scc)


for v in sorted(tops):
    if v not in index:
        visit(v)
bad = [sorted(s) for s in sccs if len(s) > 1]
for s in bad:
    print("import cycle between top-level modules:", ", ".join(s))
    for a in s:
        for b in s:
            if b in graph[a]:
                print(f"  {a} -> {b}: {', '.join(sorted(edges[a][b])[:4])}")
print(f"module_cycles: {len(tops)} top-level modules, {sum(len(g) for g in graph.values())} edges, {len(bad)} cycles")
sys.exit(1 if bad else 0)
