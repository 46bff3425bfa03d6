#!/usr/bin/env python3
"""Fails when the BUILD packages of this workspace depend on each other in a cycle.

A package P depends on a package Q when a target of P names a target of Q
(deps, data, srcs, ...). The package graph must be acyclic so that every
package can be read, built and tested with only what lies below it.

Usage, from the workspace root (.ci/test.sh runs it after `bazel test //...`):

  tools/check_package_cycles.py               # runs the bazel query below itself
  bazel query ... --output=graph | tools/check_package_cycles.py --graph -

The graph is the unfactored target graph of `bazel query --output=graph` over
every target, tests included: deps(//...). A test counts like any other
target, so a test that reaches above its package (an end-to-end test that
starts statecached, a backend's contract test) lives in the package it tests
against or under tests/. External labels (@repo//...) are ignored.

Exit status 0 and "package cycles: none (N packages, M package edges)" when
acyclic; 1 and every cycle (a strongly connected component of packages) with
one target edge per package edge inside it otherwise; 2 on a usage or query
error.
"""

import os
import re
import subprocess
import sys

QUERY = [
    "bazel", "query", "deps(//...)", "--output=graph",
    "--nograph:factored", "--noimplicit_deps",
]
EDGE = re.compile(r'^\s*"([^"]+)"\s*->\s*"([^"]+)"')


def package_of(label):
    """'//a/b:c' -> 'a/b'; None for external or malformed labels."""
    if not label.startswith("//"):
        return None
    return label[2:].split(":", 1)[0]


def package_edges(graph_text):
    """{(pkg_from, pkg_to): (label_from, label_to)} for edges between packages."""
    edges = {}
    for line in graph_text.splitlines():
        m = EDGE.match(line)
        if not m:
            continue
        src, dst = m.group(1), m.group(2)
        a, b = package_of(src), package_of(dst)
        if a is None or b is None or a == b:
            continue
        edges.setdefault((a, b), (src, dst))
    return edges


def cycles(edges):
    """Strongly connected components of more than one package, each sorted."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    # Iterative Tarjan (the graph may be deep enough for Python's recursion limit).
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return sorted(out)


def report(edges):
    """(exit status, report text) for the package edges."""
    found = cycles(edges)
    packages = {p for e in edges for p in e}
    if not found:
        return 0, "package cycles: none (%d packages, %d package edges)" % (
            len(packages), len(edges))
    lines = ["package cycles: %d" % len(found)]
    for component in found:
        members = set(component)
        lines.append("cycle: " + " <-> ".join("//" + p for p in component))
        for (a, b), (src, dst) in sorted(edges.items()):
            if a in members and b in members:
                lines.append("  %s -> %s" % (src, dst))
    return 1, "\n".join(lines)


def main(argv):
    if len(argv) == 1:
        root = os.environ.get("BUILD_WORKSPACE_DIRECTORY") or os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "..")
        proc = subprocess.run(QUERY, cwd=root, stdout=subprocess.PIPE,
                              universal_newlines=True)
        if proc.returncode != 0:
            print("check_package_cycles: bazel query failed", file=sys.stderr)
            return 2
        text = proc.stdout
    elif len(argv) == 3 and argv[1] == "--graph":
        if argv[2] == "-":
            text = sys.stdin.read()
        else:
            with open(argv[2]) as f:
                text = f.read()
    else:
        print(__doc__, file=sys.stderr)
        return 2
    status, text = report(package_edges(text))
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
