#!/usr/bin/env python3
"""Finds modules of a crate that import each other, directly or in a circle (issue #20).

A module's subtree (its file and its submodules) depends on a sibling module when any of its
files names that sibling by path (`crate::a::b`, `super::b`, `self::b`, or a `use` group of
them). A parent and its child naming each other is Rust's normal shape and is not counted;
test modules (`#[cfg(test)]` to the end of a file) may reach anywhere. Written by hand because
no maintained cargo tool reports circles between modules (cargo-modules draws the graph but
does not fail a build). Exits 1 when a circle exists.
Usage: scripts/module-circles.py [CRATES_DIR]
"""

import os
import re
import sys
from collections import defaultdict

PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP = re.compile(r"\buse\s+(crate|super|self)::\{([^;]*)\}", re.DOTALL)


def modules(src):
    """Module path (a tuple) -> file, for every .rs file under src but binaries."""
    out = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib", "main"):
                rel = rel[:-1]
            if rel and rel[0] == "bin":
                continue
            out[tuple(rel)] = os.path.join(dirpath, f)
    return out


def code_of(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    cut = text.find("#[cfg(test)]")
    return text if cut < 0 else text[:cut]


def references(text):
    for m in PATH.finditer(text):
        yield m.group(1), [p for p in m.group(2).split("::") if p]
    for m in USE_GROUP.finditer(text):
        for item in re.split(r"[,{}]", m.group(2)):
            name = item.strip().split("::")[0].split(" ")[0]
            if name:
                yield m.group(1), [name]


def resolve(module, kind, parts, mods):
    """The longest module path the reference names, or None (an item of the crate root)."""
    if kind == "crate":
        base = ()
    elif kind == "self":
        base = module
    else:
        base = module[:-1]
        while parts and parts[0] == "super":
            base, parts = base[:-1], parts[1:]
    best, path = None, base
    for p in parts:
        path = (*path, p)
        if path not in mods:
            break
        best = path
    return best


def sibling_edges(mods):
    deps = defaultdict(set)
    for module, path in mods.items():
        for kind, parts in references(code_of(path)):
            target = resolve(module, kind, parts, mods)
            if target is None:
                continue
            n = 0
            while n < min(len(module), len(target)) and module[n] == target[n]:
                n += 1
            if n < len(module) and n < len(target):
                deps[module[: n + 1]].add(target[: n + 1])
    return deps


def circles(deps):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in deps.get(v, ()):
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

    for v in list(deps):
        if v not in index:
            visit(v)
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "crates"
    bad = 0
    for crate in sorted(os.listdir(root)):
        src = os.path.join(root, crate, "src")
        if not os.path.isdir(src):
            continue
        for comp in circles(sibling_edges(modules(src))):
            bad += 1
            names = ", ".join("::".join(m) for m in comp)
            print(
                f"{crate}: these modules import each other: {names}; move what they share into a module below both"
            )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
