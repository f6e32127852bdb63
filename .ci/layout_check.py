#!/usr/bin/env python3
"""The layout rules of the gateway crate, checked from its source text (issue 29).

1. No import cycle between source files outside tests: file A imports file B when A names an
   item of B through `use crate::…`/`use super::…`/`use self::…`/a child module, or writes such
   a path inline (`crate::metrics::X`). A path through a module's `pub use` is followed to the
   file that defines the item, so a re-export in a `mod.rs` does not hide or invent a cycle.
2. No stage of the request path (`gateway/stack/`) imports `rollout` or `runtime`.
3. No source file over 500 lines outside tests (`gateway/` and `crates/*/src/`).

Tests are files declared under `#[cfg(test)]` and the inline `#[cfg(test)] mod … {` blocks at
the end of a file; neither counts. Prints every breach and exits 1 when there is one.
Usage: python3 .ci/layout_check.py [repo root]
"""
import os
import re
import sys

MAX_LINES = 500
ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
CRATE = os.path.join(ROOT, "gateway")
FORBIDDEN_FROM_STAGES = ("rollout", "runtime")

ITEM = re.compile(
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:async\s+|const\s+|unsafe\s+)*"
    r"(?:fn|struct|enum|trait|type|const|static|union|mod)\s+(r#)?(\w+)",
    re.M,
)
MACRO = re.compile(r"macro_rules!\s+(\w+)")
TEST_MOD_DECL = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")
TEST_MOD_INLINE = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
PATH_MOD = re.compile(r"#\[path\s*=\s*\"([^\"]+)\"\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")
MOD_DECL = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", re.M)
USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
INLINE = re.compile(r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)")


def strip(text):
    """Source without comments and string or char literals (a small lexer: `"//"` inside a
    string is no comment, `'"'` opens no string), cut before the inline test module."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) \
                and re.match(r'r#*"', text[i:]):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            out.append('""')
            i = n if end < 0 else end + 1 + len(hashes)
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            out.append('""')
            i += 1
        elif c == "'" and re.match(r"'(\\.[^']*|[^'\\])'", text[i:]):
            m = re.match(r"'(\\.[^']*|[^'\\])'", text[i:])
            out.append("' '")
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    text = "".join(out)
    m = TEST_MOD_INLINE.search(text)
    return text[: m.start()] if m else text


class Module:
    def __init__(self, path, segments):
        self.path = path
        self.segments = segments  # module path below `crate`
        self.raw = open(path, encoding="utf-8").read()
        self.text = strip(self.raw)
        self.items = {m.group(2) for m in ITEM.finditer(self.text)} | set(MACRO.findall(self.text))
        self.uses = [(bool(m.group(1)), p) for m in USE.finditer(self.text) for p in expand(m.group(2))]
        self.is_test = False


def expand(tree):
    """`a::{b, c::{d as e}, f::*}` -> [(["a","b"], "b"), (["a","c","d"], "e"), (["a","f","*"], "*")]."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+", "@", tree))
    out = []

    def walk(prefix, s):
        depth, start, parts = 0, 0, []
        for i, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(s[start:i])
                start = i + 1
        parts.append(s[start:])
        for part in filter(None, parts):
            if "{" in part:
                head, _, rest = part.partition("{")
                walk(prefix + [x for x in head.split("::") if x], rest[:-1])
            else:
                name, _, alias = part.partition("@")
                segs = prefix + [x for x in (name if alias else part).split("::") if x]
                if not segs:
                    continue
                last = segs[-1]
                out.append((segs, alias or (prefix[-1] if last == "self" and prefix else last)))

    walk([], tree)
    return out


def load():
    modules = {}

    def add(path, segments):
        if path in modules or not os.path.exists(path):
            return
        mod = Module(path, segments)
        modules[path] = mod
        base = os.path.dirname(path) if os.path.basename(path) in ("mod.rs", "lib.rs", "main.rs") else path[:-3]
        tests = set(TEST_MOD_DECL.findall(mod.raw))
        explicit = {name: rel for rel, name in PATH_MOD.findall(mod.raw)}
        for name in MOD_DECL.findall(re.sub(r"//[^\n]*", "", mod.raw)):
            if name in explicit:
                candidates = [os.path.join(os.path.dirname(path), explicit[name])]
            else:
                candidates = [os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")]
            for c in candidates:
                if os.path.exists(c):
                    add(c, segments + [name])
                    if name in tests or mod.is_test:
                        mark_test(c)
                    break

    def mark_test(path):
        modules[path].is_test = True
        prefix = modules[path].segments
        for m in modules.values():
            if m.segments[: len(prefix)] == prefix:
                m.is_test = True

    add(os.path.join(CRATE, "lib.rs"), [])
    return modules


def resolve(modules, by_segments, segs, seen=None):
    """The file defining the item at absolute module path `segs` (best effort)."""
    seen = seen or set()
    key = tuple(segs)
    if key in seen:
        return None
    seen.add(key)
    for n in range(len(segs), -1, -1):
        mod = by_segments.get(tuple(segs[:n]))
        if mod is None:
            continue
        rest = segs[n:]
        if not rest or rest == ["*"] or rest[0] in mod.items:
            return mod.path
        # A re-export: follow `pub use` in that module.
        for public, (path, alias) in ((p, u) for p, u in mod.uses):
            if not public:
                continue
            target = absolute(mod, path)
            if target is None:
                continue
            if alias == rest[0]:
                found = resolve(modules, by_segments, target + rest[1:], seen)
                if found:
                    return found
            elif alias == "*":
                found = resolve(modules, by_segments, target[:-1] + rest, seen)
                if found:
                    return found
        return mod.path
    return None


def absolute(mod, segs):
    """A `use` path made absolute below `crate`; None for external crates."""
    here = mod.segments if os.path.basename(mod.path) in ("mod.rs", "lib.rs") else mod.segments
    head, rest = segs[0], segs[1:]
    if head == "crate":
        return list(rest)
    if head == "self":
        return here + list(rest)
    if head == "super":
        up = list(here)
        while segs and segs[0] == "super":
            up = up[:-1]
            segs = segs[1:]
        return up + list(segs)
    return None  # an external crate, or a child module handled by the caller


def edges(modules):
    by_segments = {tuple(m.segments): m for m in modules.values()}
    graph = {}
    for mod in modules.values():
        if mod.is_test:
            continue
        children = {tuple(m.segments[-1:]) for m in modules.values() if m.segments[:-1] == mod.segments and m.segments}
        targets = {}
        paths = [segs for _, (segs, _) in mod.uses]
        paths += [m.group(1).split("::") for m in INLINE.finditer(re.sub(r"\buse\s+[^;]+;", "", mod.text))]
        for segs in paths:
            if (segs[0],) in children:
                segs = ["self"] + segs
            full = absolute(mod, segs)
            if full is None:
                continue
            target = resolve(modules, by_segments, [s for s in full if s != "self"])
            if target and target != mod.path and not modules[target].is_test \
                    and not is_ancestor(modules[target], mod):
                targets.setdefault(target, set()).add(segs[-1])
        graph[mod.path] = targets
    return graph


def is_ancestor(parent, child):
    """`parent` is the root file of a module enclosing `child` (its mod.rs, lib.rs or x.rs).

    A child reading its enclosing module's items through `super::` is Rust's nesting, not a
    dependency between rooms: the parent declares the child. Such imports are not edges.
    """
    return len(parent.segments) < len(child.segments) and child.segments[: len(parent.segments)] == parent.segments


def cycles(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
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
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main():
    modules = load()
    graph = edges(modules)
    rel = lambda p: os.path.relpath(p, ROOT)
    breaches = []
    for comp in cycles(graph):
        lines = [f"import cycle between {len(comp)} files:"]
        for a in comp:
            for b, names in sorted(graph[a].items()):
                if b in comp:
                    lines.append(f"  {rel(a)} -> {rel(b)}: {', '.join(sorted(names))}")
        breaches.append("\n".join(lines))
    for path, targets in sorted(graph.items()):
        if not rel(path).startswith("gateway/stack/"):
            continue
        for b, names in sorted(targets.items()):
            if any(rel(b).startswith(f"gateway/{f}/") or rel(b) == f"gateway/{f}.rs" for f in FORBIDDEN_FROM_STAGES):
                breaches.append(f"stage {rel(path)} imports {rel(b)} ({', '.join(sorted(names))}): stages do not depend on the rollout or the runtime")
    sources = [m.path for m in modules.values() if not m.is_test]
    crates = os.path.join(ROOT, "crates")
    if os.path.isdir(crates):
        for dirpath, _, files in os.walk(crates):
            if f"{os.sep}src" not in dirpath:
                continue
            for f in files:
                if f.endswith(".rs") and not re.search(r"(^|_)tests?\.rs$|proptests\.rs$", f):
                    sources.append(os.path.join(dirpath, f))
    for path in sorted(sources):
        n = sum(1 for _ in open(path, encoding="utf-8"))
        if n > MAX_LINES:
            breaches.append(f"{rel(path)} has {n} lines (at most {MAX_LINES} outside tests): split it by concern")
    tests = sum(1 for m in modules.values() if m.is_test)
    print(f"layout: {len(graph)} source files of the gateway crate read ({tests} test files left out), "
          f"{sum(len(t) for t in graph.values())} imports between files")
    for b in breaches:
        print(b)
    if breaches:
        print(f"layout: {len(breaches)} breach(es)")
        return 1
    print("layout: no import cycle, no stage imports rollout/runtime, no source file over 500 lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
