"""Build hook: generates statecache/v1/*_pb2*.py into the build tree.

The proto comes from $STATECACHE_PROTO_ROOT, the repository (../../proto), or
statecache/_proto (an sdist's bundled copy, written by this hook).
"""
import importlib.util
import os
import shutil

from setuptools import Extension, setup
from setuptools.command.build_py import build_py as _build_py
from setuptools.command.sdist import sdist as _sdist

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join("statecache", "v1", "statecache.proto")


def _gen_module():
    spec = importlib.util.spec_from_file_location(
        "_statecache_gen", os.path.join(HERE, "statecache", "_gen.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bundle_proto():
    """Copies the repository's proto into statecache/_proto (for sdists)."""
    src = os.path.join(HERE, "..", "..", "proto", PROTO)
    if os.path.isfile(src):
        dst = os.path.join(HERE, "statecache", "_proto", PROTO)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(src, dst)


class build_py(_build_py):
    def run(self):
        super().run()
        _bundle_proto()
        _gen_module().generate(self.build_lib)


class sdist(_sdist):
    def run(self):
        _bundle_proto()
        super().run()


setup(cmdclass={"build_py": build_py, "sdist": sdist},
      # statecache/prefix.py's C chain (loaded with ctypes; optional: pure
      # Python, same keys, when no compiler is at hand).
      ext_modules=[Extension("statecache._prefixhash", ["statecache/_prefixhash.c"],
                             optional=True)])
