#!/usr/bin/env python3
"""Print the import cycles among the `crate::` modules of one crate.

Usage: scripts/import-cycles.py [-v] CRATE_SRC_DIR   (e.g. crates/tenure-bench/src)

A module is a file `a.rs` or a folder `a/` (with `a/mod.rs` or `a.rs` beside
it); `a/b.rs` is the submodule `a::b`. A path `crate::a::b::Item` in a file
(in a `use`, or written out in code) is an edge from that file's module to
the deepest module the path names: `a::b` if that submodule exists, else `a`.
A path to an item at the crate root (`crate::Error`, often a re-export) is no
edge, and neither is a path from a module to itself or to one of its own
submodules or parents (a parent declares its children; a child reaching up
into its parent is the usual `super` pattern). Grouped imports
(`use crate::{a::X, b::{Y, Z}}`) give one edge per group member. Comments and
string literals are ignored, and so are `super::` and `self::` paths (only
`crate::` paths are followed).

Prints each strongly connected component of more than one module (with one
cycle through it, as `a -> b -> a`) and exits 1 if there is any; prints
"no import cycles" and exits 0 otherwise. With -v, first prints every edge
and the paths that make it.
"""

import os
import re
import sys


def module_of(src, path):
    """The module name of a file: `lib.rs`/`main.rs` -> '' (the root),
    `a.rs` or `a/mod.rs` -> 'a', `a/b.rs` -> 'a::b'."""
    rel = os.path.relpath(path, src)[: -len(".rs")].split(os.sep)
    if rel[-1] == "mod":
        rel = rel[:-1]
    if len(rel) == 1 and rel[0] in ("lib", "main"):
        return ""
    return "::".join(rel)


def strip(text):
    """The text without comments, string and char literals (replaced by a
    space), so that a path in a doc comment or a message is no edge."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            out.append(" ")
        elif c == "r" and re.match(r'r#*"', text[i:]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            i = n if end < 0 else end + 1 + len(hashes)
            out.append(" ")
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append(" ")
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:]):
            i += len(re.match(r"'(\\.[^']*|[^\\'])'", text[i:]).group(0))
            out.append(" ")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand(tree):
    """The paths a `use` tree names: 'a::{b, c::{d, e}}' ->
    ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+", "", tree)
    depth = 0
    for i, c in enumerate(tree):
        if c == "{":
            if depth == 0:
                prefix, inner = tree[:i], tree[i + 1 : tree.rindex("}")]
                parts, depth2, start = [], 0, 0
                for j, d in enumerate(inner):
                    if d == "{":
                        depth2 += 1
                    elif d == "}":
                        depth2 -= 1
                    elif d == "," and depth2 == 0:
                        parts.append(inner[start:j])
                        start = j + 1
                parts.append(inner[start:])
                return [p2 for p in parts if p for p2 in expand(prefix + p)]
            depth += 1
    return [tree]


def crate_paths(text):
    """Every `crate::...` path in a file's code, group imports expanded."""
    code = strip(text)
    paths = []
    # Grouped imports first: `crate::{...}` or `crate::a::{...}`.
    pos = 0
    group = re.compile(r"\bcrate::((?:\w+::)*)\{")
    while True:
        m = group.search(code, pos)
        if not m:
            break
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        paths.extend(expand(code[m.start() + len("crate::") : j]))
        code = code[: m.start()] + " " * (j - m.start()) + code[j:]
        pos = m.start()
    paths.extend(re.findall(r"\bcrate((?:::\w+)+)", code))
    return [re.sub(r"::self$", "", p.lstrip(":")) for p in paths]


def target(path, modules):
    """The deepest existing module a path names, or None for the root."""
    parts = [p for p in path.split("::") if p]
    for k in range(len(parts), 0, -1):
        name = "::".join(parts[:k])
        if name in modules:
            return name
    return None


def related(a, b):
    """Whether one module is the other's ancestor (or the same)."""
    return a == b or a.startswith(b + "::") or b.startswith(a + "::")


def graph(src):
    files = []
    for root, _, names in os.walk(src):
        files += [os.path.join(root, n) for n in names if n.endswith(".rs")]
    modules = {module_of(src, f) for f in files} - {""}
    edges = {m: set() for m in modules}
    why = {}
    for f in sorted(files):
        here = module_of(src, f)
        if not here:
            continue
        with open(f, encoding="utf-8") as fh:
            for path in crate_paths(fh.read()):
                to = target(path, modules)
                if to is not None and not related(here, to):
                    edges[here].add(to)
                    why.setdefault((here, to), set()).add("crate::" + path)
    return edges, why


def components(edges):
    """Tarjan's strongly connected components, each sorted, in a stable order."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
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
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def one_cycle(comp, edges):
    """A shortest cycle through the component's first module (BFS)."""
    start, members = comp[0], set(comp)
    prev, queue = {start: None}, [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges[v] & members):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1] + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return None


def main():
    args = sys.argv[1:]
    verbose = args[:1] == ["-v"]
    if verbose:
        args = args[1:]
    if len(args) != 1 or not os.path.isdir(args[0]):
        sys.exit(__doc__.strip().splitlines()[2])
    edges, why = graph(args[0])
    if verbose:
        for m in sorted(edges):
            for to in sorted(edges[m]):
                print(f"{m} -> {to}: {', '.join(sorted(why[(m, to)]))}")
    cycles = [c for c in components(edges) if len(c) > 1]
    for comp in cycles:
        cycle = one_cycle(comp, edges)
        print(f"cycle among {', '.join(comp)}:")
        print("  " + " -> ".join(cycle))
        for m in comp:
            for to in sorted(edges[m] & set(comp)):
                print(f"  {m} uses {to}: {', '.join(sorted(why[(m, to)]))}")
    if cycles:
        sys.exit(1)
    print("no import cycles")


if __name__ == "__main__":
    main()
