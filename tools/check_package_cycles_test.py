#!/usr/bin/env python3
"""Tests of check_package_cycles.py on synthetic `bazel query --output=graph` text."""

import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_package_cycles as cpc  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_package_cycles.py")


def graph(*edges):
    lines = ["digraph mygraph {", '  node [shape=box];']
    for a, b in edges:
        lines.append('  "%s"' % a)
        lines.append('  "%s" -> "%s"' % (a, b))
    lines.append("}")
    return "\n".join(lines) + "\n"


def run_script(text):
    proc = subprocess.run([sys.executable, SCRIPT, "--graph", "-"], input=text, stdout=subprocess.PIPE,
                          universal_newlines=True)
    return proc.returncode, proc.stdout


class CheckPackageCyclesTest(unittest.TestCase):

    def test_acyclic_graph_passes(self):
        text = graph(("//server:server", "//server/dataplane:data_plane"),
                     ("//server/dataplane:data_plane", "//kernels/backend:backend_interface"),
                     ("//kernels/cpu:cpu_backend", "//kernels/backend:backend_interface"))
        code, out = run_script(text)
        self.assertEqual(code, 0, out)
        self.assertIn("package cycles: none (4 packages, 3 package edges)", out)

    def test_two_package_cycle_fails_and_names_the_edges(self):
        text = graph(("//server:server", "//server/dataplane:data_plane"),
                     ("//server/dataplane:data_plane", "//server:log"))
        code, out = run_script(text)
        self.assertEqual(code, 1, out)
        self.assertIn("cycle: //server <-> //server/dataplane", out)
        self.assertIn("//server:server -> //server/dataplane:data_plane", out)
        self.assertIn("//server/dataplane:data_plane -> //server:log", out)

    def test_longer_cycle_is_one_component(self):
        edges = {("kernels/backend", "kernels/cpu"), ("kernels/cpu", "kernels/cuda"),
                 ("kernels/cuda", "kernels/backend"), ("kernels/cuda", "kernels/formats")}
        found = cpc.cycles(edges)
        self.assertEqual(found, [["kernels/backend", "kernels/cpu", "kernels/cuda"]])

    def test_two_separate_cycles(self):
        edges = {("a", "b"), ("b", "a"), ("c", "d"), ("d", "c"), ("b", "c")}
        self.assertEqual(cpc.cycles(edges), [["a", "b"], ["c", "d"]])

    def test_edges_inside_a_package_and_to_external_repos_are_ignored(self):
        text = graph(("//a:x", "//a:y"), ("//a:y", "//a:x"), ("//a:x", "@system_absl//:absl"),
                     ("@system_absl//:absl", "//a:x"))
        code, out = run_script(text)
        self.assertEqual(code, 0, out)
        self.assertIn("package cycles: none (0 packages, 0 package edges)", out)

    def test_usage_error(self):
        proc = subprocess.run([sys.executable, SCRIPT, "--bogus"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True)
        self.assertEqual(proc.returncode, 2)

    def test_root_package_label(self):
        self.assertEqual(cpc.package_of("//:README.md"), "")
        self.assertEqual(cpc.package_of("//kernels/cuda:kernels"), "kernels/cuda")
        self.assertIsNone(cpc.package_of("@local_cuda//:cudart"))

    def test_query_covers_test_targets(self):
        # Tests are part of the graph: the query names every target of the
        # workspace and leaves none out.
        self.assertIn("deps(//...)", cpc.QUERY)
        self.assertNotIn("except", " ".join(cpc.QUERY))
        self.assertNotIn("tests(", " ".join(cpc.QUERY))

    def test_test_target_edge_closes_a_cycle(self):
        # A test in a lower package that depends on a higher one is a cycle.
        status, text = cpc.report(cpc.package_edges(graph(
            ("//kernels/cpu:cpu_backend", "//kernels/backend:backend_interface"),
            ("//kernels/backend:stream_ops_cpu_test", "//kernels/cpu:cpu_backend"))))
        self.assertEqual(status, 1)
        self.assertIn("cycle: //kernels/backend <-> //kernels/cpu", text)
        self.assertIn("//kernels/backend:stream_ops_cpu_test -> //kernels/cpu:cpu_backend", text)


if __name__ == "__main__":
    unittest.main()
