#!/usr/bin/env python3
"""No module imports itself back: for every crate of the workspace, the graph of its top-level
modules (a file, or a folder as one) made from `crate::` paths in code (comments and
`#[cfg(test)] mod` blocks left out) must have no cycle. Cargo refuses crate cycles itself.
Prints each cycle found and exits 1; run by ci/test.sh."""
import os
import re
import sys
import tomllib

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
members = tomllib.load(open(os.path.join(root, "Cargo.toml"), "rb"))["workspace"]["members"]
found = []
for member in members:
    src = os.path.join(root, member, "src")
    if not os.path.isdir(src):
        continue
    graph = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)[:-3]
            top = rel.split(os.sep)[0]
            if top in ("main", "lib") or (os.sep not in rel and dirpath != src):
                continue
            text = re.split(r"#\[cfg\(test\)\]\s*mod\s", open(os.path.join(dirpath, f)).read())[0]
            code = "\n".join(l for l in text.split("\n") if not l.strip().startswith("//"))
            deps = set(re.findall(r"\bcrate::([a-z_0-9]+)", code)) - {top}
            graph.setdefault(top, set()).update(deps)
    graph = {m: {d for d in ds if d in graph} for m, ds in graph.items()}
    state = {}

    def visit(m, path):
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                found.append(f"{member}: " + " -> ".join(path[path.index(d):] + [d]))
            elif d not in state:
                visit(d, path)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
for c in found:
    print("module cycle:", c)
if found:
    sys.exit(1)
print(f"no module cycles in {len(members)} crates")
