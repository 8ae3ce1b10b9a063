#!/usr/bin/env python3
"""Checks the layering of the workspace: modules of a crate that import each other, directly or
in a circle (issue #20), and workspace crates that depend on crates their layer may not use.

A module's subtree (its file and its submodules) depends on a sibling module when any of its
files names that sibling by path (`crate::a::b`, `super::b`, `self::b`, or a `use` group of
them). A parent and its child naming each other is Rust's normal shape and is not counted;
test modules (`#[cfg(test)]` to the end of a file) may reach anywhere. Written by hand because
no maintained cargo tool reports circles between modules (cargo-modules draws the graph but
does not fail a build).

Crates: every crates/*/Cargo.toml (and a fuzz/Cargo.toml beside it, counted as tests) is read, and each
dependency on another workspace crate must be listed for it in CRATE_DEPS (what it ships with)
or TEST_DEPS (what only its tests, examples and fuzz targets use). The tables are the graph
docs/ARCHITECTURE.md ("Crates and what each may depend on") states: a new edge fails here until
the table and that page are changed together, and so does an edge listed but no longer there.
NEVER_REACHES names crates a crate may not reach even through others (the CLI and the server).
Exits 1 when a circle or an edge outside the tables exists.
Usage: scripts/module-circles.py [CRATES_DIR]
"""

import os
import re
import sys
from collections import defaultdict

try:
    import tomllib
except ImportError:  # Python before 3.11
    tomllib = None

# What each crate may depend on in the workspace (names without "millrace-"): today's graph,
# every edge going down the layers but the known gaps marked. Keep in step with
# docs/ARCHITECTURE.md.
CRATE_DEPS = {
    "io": set(),
    "parity": set(),
    "rdma-devices": set(),
    "rdma": {"rdma-devices"},  # re-exported as millrace_rdma::devices
    "block": {"io"},
    "array": {"block", "io", "parity"},
    "volume": {"block"},  # the pool is a BlockDevice here: never the array crate
    "nbd": {"block", "io"},
    "nvmf": {"block", "io"},
    "nvmf-rdma": {"io", "nvmf", "rdma"},
    "bench": {"array"},
    # Known gap: the state still holds the NVMe/TCP target and the NBD server themselves (idle
    # in the CLI's in-process mode), so the service layer links those two export crates.
    "service": {"array", "bench", "block", "io", "nbd", "nvmf", "rdma-devices", "volume"},
    "server": {"array", "io", "nvmf-rdma", "rdma", "service", "volume"},
    # The CLI reaches array and volume for types it prints (Level, PoolInfo, ScrubReport,
    # VolumeInfo); `millrace serve` execs the millrace-server program, so no edge to it.
    "cli": {"array", "bench", "service", "volume"},
}
# What tests, examples and fuzz targets may add. Known gap: millrace-nvmf's bench example
# (examples/nvmf_bench.rs) exports a real pool, so an export crate's dev-dependencies reach the
# array.
TEST_DEPS = {
    # The hang-up tests drive `millrace serve` with the crate's own NVMe/TCP initiator; io
    # holds the tests' shared `cannot_run`.
    "cli": {"io", "nvmf"},
    "nvmf": {"array"},
    "nvmf-rdma": {"block"},
    # The server's tests drive its exports with the crates' own initiators and devices.
    "server": {"block", "nbd", "nvmf"},
}
# What a crate must not reach even through others (the closure of CRATE_DEPS): the command a
# user runs for `pool show` links neither the server (axum, hyper, TLS) nor the RDMA binding
# (issue #47), and neither does the service layer it links.
NEVER_REACHES = {
    "service": {"server", "nvmf-rdma", "rdma", "cli"},
    "cli": {"server", "nvmf-rdma", "rdma"},
}
SECTIONS = (
    ("dependencies", "crate"),
    ("build-dependencies", "crate"),
    ("dev-dependencies", "test"),
)

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


def workspace_deps(manifest, names):
    """Names (without "millrace-") of the workspace crates a Cargo.toml depends on, by section
    kind: "crate" for [dependencies] and [build-dependencies], "test" for [dev-dependencies]."""
    with open(manifest, "rb") as f:
        toml = tomllib.load(f)
    tables = [toml] + list(toml.get("target", {}).values())
    out = {"crate": set(), "test": set()}
    for t in tables:
        for section, kind in SECTIONS:
            for name, spec in t.get(section, {}).items():
                name = spec.get("package", name) if isinstance(spec, dict) else name
                short = name.removeprefix("millrace-")
                if name.startswith("millrace-") and short in names:
                    out[kind].add(short)
    return out


def crate_layering(root):
    """Sentences, one per edge of the workspace graph that the tables do not allow, and per
    edge the tables list that is no longer there."""
    if tomllib is None:
        return ["reading Cargo.toml needs Python 3.11 or later (tomllib)"]
    names = {
        c.removeprefix("millrace-")
        for c in os.listdir(root)
        if os.path.isfile(os.path.join(root, c, "Cargo.toml"))
    }
    out = [
        f"millrace-{n}: not in CRATE_DEPS; give it a layer there and in docs/ARCHITECTURE.md"
        for n in sorted(names - CRATE_DEPS.keys())
    ]
    for n in sorted(names & CRATE_DEPS.keys()):
        deps = workspace_deps(os.path.join(root, "millrace-" + n, "Cargo.toml"), names)
        fuzz = os.path.join(root, "millrace-" + n, "fuzz", "Cargo.toml")
        if os.path.isfile(fuzz):
            f = workspace_deps(fuzz, names)
            deps["test"] |= (f["crate"] | f["test"]) - {n}
        tests = deps["test"] - deps["crate"]
        checks = (
            ("depends on", deps["crate"], CRATE_DEPS[n]),
            ("tests depend on", tests, TEST_DEPS.get(n, set())),
        )
        for kind, have, allowed in checks:
            for d in sorted(have - allowed):
                out.append(
                    f"millrace-{n} {kind} millrace-{d}, which its layer may not use"
                    " (CRATE_DEPS/TEST_DEPS in this script, docs/ARCHITECTURE.md)"
                )
            for d in sorted(allowed - have):
                out.append(
                    f"millrace-{n} no longer {kind} millrace-{d}: take it out of this"
                    " script's table and docs/ARCHITECTURE.md"
                )
    return out


def reach_violations():
    """Sentences, one per crate that NEVER_REACHES forbids and CRATE_DEPS lets it reach."""
    out = []
    for n, never in sorted(NEVER_REACHES.items()):
        seen, todo = set(), [n]
        while todo:
            for d in CRATE_DEPS.get(todo.pop(), ()):
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        for d in sorted(seen & never):
            out.append(
                f"millrace-{n} reaches millrace-{d} through its dependencies, which its layer"
                " may never link (NEVER_REACHES in this script, docs/ARCHITECTURE.md)"
            )
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "crates"
    bad = 0
    for line in crate_layering(root) + reach_violations():
        bad += 1
        print(line)
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
