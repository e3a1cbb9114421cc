#!/usr/bin/env python3
"""Fails when the files of a crate import each other in a cycle.

    scripts/check-imports.py CRATE_SRC...     # e.g. operator/src operator/bidbrain/src
    scripts/check-imports.py --self-test      # shows that it finds a planted cycle

A file depends on another when its non-test code names a path into it: `use crate::…`,
`use super::…`, `use self::…` (use trees expanded) or an inline `crate::…` / `super::…` path,
resolved to the longest module prefix that is a file. Comments and `#[cfg(test)] mod tests`
blocks are ignored, and so are `tests.rs` / `*_tests.rs` files (tests may reach anywhere). A
parent module naming its children is the module tree, not an import; a child naming its parent
module (`super::Context` from `controller/relay.rs` into `controller/mod.rs`) is. Rust allows
such cycles; we keep every dependency running one way so each file can be read after the ones
it uses (issue 37).
"""
import os
import re
import sys
import tempfile


def module_path(rel):
    parts = rel[:-3].split("/")
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def code_of(src):
    cut = re.search(r"#\[cfg\(test\)\]\s*mod tests\s*\{", src)
    if cut:
        src = src[: cut.start()]
    return re.sub(r"//[^\n]*", "", src)


def expand(tree):
    """`a::{b, c::{d, e}}` -> [`a::b`, `a::c::d`, `a::c::e`]."""
    tree = re.sub(r"\s+", "", tree)
    match = re.match(r"^(.*?)\{(.*)\}$", tree)
    if not match:
        return [tree]
    prefix, inner = match.groups()
    items, depth, item = [], 0, ""
    for ch in inner:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            items.append(item)
            item = ""
        else:
            item += ch
    if item:
        items.append(item)
    return [prefix + path for i in items for path in expand(i)]


def graph(root):
    files = {}
    for directory, _, names in os.walk(root):
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(directory, name)
                files[os.path.relpath(path, root)] = open(path, encoding="utf-8").read()
    modules = {module_path(rel): rel for rel in files if not rel.startswith("bin/")}

    def resolve(here, path):
        segments = path.split(" as ")[0].split("::")
        if segments[0] == "crate":
            base, segments = [], segments[1:]
        elif segments[0] in ("super", "self"):
            base = list(here)
            while segments and segments[0] == "super":
                base, segments = base[:-1], segments[1:]
            if segments and segments[0] == "self":
                segments = segments[1:]
        else:
            return None
        found = None
        for i in range(len(segments) + 1):
            found = modules.get(tuple(base + segments[:i]), found)
        return found

    edges = {}
    for rel, src in files.items():
        if rel.startswith("bin/") or rel.endswith("tests.rs"):
            continue
        here = module_path(rel)
        code = code_of(src)
        deps = set()
        for use in re.finditer(r"\buse\s+((?:crate|super|self)::[^;]+);", code, re.S):
            for path in expand(use.group(1)):
                deps.add(resolve(here, path))
        for path in re.finditer(r"\b((?:crate|super)(?:::[A-Za-z_][A-Za-z0-9_]*)+)", code):
            deps.add(resolve(here, path.group(1)))
        edges[rel] = {d for d in deps if d and d != rel}
    return edges


def cycles(edges):
    """Strongly connected components with more than one file (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def check(root, quiet=False):
    edges = graph(root)
    found = cycles(edges)
    for component in [] if quiet else found:
        print(f"check-imports: error: {root}: these files import each other in a cycle:", file=sys.stderr)
        for f in component:
            print(f"  {f} -> {', '.join(sorted(d for d in edges[f] if d in component))}", file=sys.stderr)
    return not found, len(edges)


def self_test():
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "controller"))
        sources = {
            "lib.rs": "pub mod controller;\npub mod coordinator;\n",
            "controller/mod.rs": "pub mod plan;\n/// Ctx.\npub struct Context;\n",
            # the child names its parent module: controller/plan.rs -> controller/mod.rs
            "controller/plan.rs": "use super::{Context, plan_helper};\n",
            "coordinator.rs": "// crate::controller::plan in a comment is not an import\n"
            "#[cfg(test)]\nmod tests {\n    use crate::controller::plan;\n}\n",
        }
        for rel, text in sources.items():
            with open(os.path.join(root, rel), "w", encoding="utf-8") as f:
                f.write(text)
        ok, _ = check(root)
        assert ok, "a tree without cycles was flagged"
        # plant a cycle: mod.rs uses plan.rs, which uses mod.rs
        with open(os.path.join(root, "controller/mod.rs"), "a", encoding="utf-8") as f:
            f.write("use self::plan::Decision;\n")
        ok, _ = check(root, quiet=True)
        assert not ok, "a planted cycle (controller/mod.rs <-> controller/plan.rs) was not found"
    print("check-imports: self-test passed (a planted cycle is found, comments and tests are ignored)")


def main(argv):
    if argv == ["--self-test"]:
        self_test()
        return 0
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    failed = False
    for root in argv:
        ok, count = check(root)
        failed |= not ok
        if ok:
            print(f"check-imports: {root}: {count} files, no import cycles")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
