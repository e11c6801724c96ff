"""tools/architecture_check.py fails on each rule broken by one line, and passes at the limit.

A copy of the library's folders gets one planted file at a time: a file of
501 lines (500 pass), a function of 101 lines (100 pass), a core file that
includes the distributed layer, a public header the umbrella leaves out.
Each must fail with the offending file and its count; at the limit the
plant is not named (the `architecture` test holds the tree itself to the rules).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
CHECK = os.path.join(ROOT, "tools", "architecture_check.py")
FOLDERS = ("include", "src", "python/src", "python/muon_cpp", "tools")


def function_of(lines):
    """A C++ function whose body (from its '{' line to its '}' line) is `lines` lines."""
    body = ["  x += %d;" % i for i in range(lines - 2)]
    return "int planted(int x) {\n" + "\n".join(body) + "\n}\n"


class Planted(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="architecture-")
        for f in FOLDERS:
            shutil.copytree(os.path.join(ROOT, f), os.path.join(cls.tmp, f),
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def check(self, rel, text):
        path = os.path.join(self.tmp, rel)
        with open(path, "w") as f:
            f.write(text)
        try:
            r = subprocess.run([sys.executable, CHECK, "--root", self.tmp], capture_output=True, text=True)
        finally:
            os.remove(path)
        return r.returncode, r.stdout

    def test_a_file_of_501_lines_fails_and_500_pass(self):
        code, out = self.check("src/planted.cpp", "int x;\n" * 501)
        self.assertEqual(code, 1, out)
        self.assertIn("src/planted.cpp: 501 lines (at most 500)", out)
        code, out = self.check("src/planted.cpp", "int x;\n" * 500)
        self.assertNotIn("planted", out)

    def test_a_python_file_of_501_lines_fails(self):
        code, out = self.check("python/muon_cpp/planted.py", "x = 1\n" * 501)
        self.assertEqual(code, 1, out)
        self.assertIn("python/muon_cpp/planted.py: 501 lines", out)

    def test_a_function_of_101_lines_fails_and_100_pass(self):
        code, out = self.check("src/planted.cpp", "namespace muon {\n" + function_of(101) + "}\n")
        self.assertEqual(code, 1, out)
        self.assertIn("src/planted.cpp:2: function planted is 101 lines (at most 100)", out)
        code, out = self.check("src/planted.cpp", "namespace muon {\n" + function_of(100) + "}\n")
        self.assertNotIn("planted", out)

    def test_a_python_function_of_101_lines_fails(self):
        text = "def planted():\n" + "".join("    x = %d\n" % i for i in range(100))
        code, out = self.check("python/muon_cpp/planted.py", text)
        self.assertEqual(code, 1, out)
        self.assertIn("python/muon_cpp/planted.py:1: function planted is 101 lines", out)

    def test_the_core_including_the_distributed_layer_fails(self):
        code, out = self.check("src/planted.cpp", '#include "muon/distributed/runtime/group.h"\n')
        self.assertEqual(code, 1, out)
        self.assertIn("src/planted.cpp:1: the core includes the distributed layer", out)

    def test_a_public_header_left_out_of_the_umbrella_fails(self):
        code, out = self.check("include/muon/planted.h", "#pragma once\n")
        self.assertEqual(code, 1, out)
        self.assertIn("does not include the public header muon/planted.h", out)


if __name__ == "__main__":
    unittest.main()
