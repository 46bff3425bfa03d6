"""Build hooks of the statecache package.

build_py writes into the build tree:
  - statecache/v1/*_pb2*.py, generated from the proto of
    $STATECACHE_PROTO_ROOT, the repository (../../proto), or statecache/_proto
    (an sdist's bundled copy, written by this hook);
  - statecache/_native/libstatecache_dataplane.so, the attached-mode library
    of statecache.attached / statecache.torch (see _native_library below),
    or statecache/_native/NOT_BUILT saying why it is absent.

Build-time settings (read here only; this is the build's process edge):
  STATECACHE_PREBUILT_DATAPLANE_LIB=PATH  bundle this library, run no bazel
  STATECACHE_BUILD_NATIVE=auto|bazel|off  auto (default): in the repository
      with bazel on PATH, `bazel build //client/python:libstatecache_dataplane.so`
      and bundle its output, else warn and install without the library;
      bazel: the same, but an error when bazel or the repository is missing;
      off: no library (statecache.attached then needs one at run time).
"""
import importlib.util
import os
import shutil
import subprocess

from setuptools import Distribution, Extension, setup
from setuptools.command.build_py import build_py as _build_py
from setuptools.command.sdist import sdist as _sdist

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PROTO = os.path.join("statecache", "v1", "statecache.proto")
NATIVE_LIB = "libstatecache_dataplane.so"
NATIVE_TARGET = "//client/python:" + NATIVE_LIB
NATIVE_MODES = ("auto", "bazel", "off")


def _gen_module():
    spec = importlib.util.spec_from_file_location(
        "_statecache_gen", os.path.join(HERE, "statecache", "_gen.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bundle_proto():
    """Copies the repository's proto into statecache/_proto (for sdists)."""
    src = os.path.join(REPO, "proto", PROTO)
    if os.path.isfile(src):
        dst = os.path.join(HERE, "statecache", "_proto", PROTO)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(src, dst)


def _bazel_build(bazel: str) -> str:
    """Builds NATIVE_TARGET in the repository; the path of its output."""
    print(f"statecache: bazel build {NATIVE_TARGET} ({bazel} in {REPO}; minutes when "
          "the CUDA objects are not cached)", flush=True)
    run = subprocess.run([bazel, "build", NATIVE_TARGET], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    if run.returncode != 0:
        tail = "\n".join(run.stdout.splitlines()[-40:])
        raise RuntimeError(
            f"`bazel build {NATIVE_TARGET}` failed (exit {run.returncode}):\n{tail}\n"
            "Fix the build, give a prebuilt library with "
            "STATECACHE_PREBUILT_DATAPLANE_LIB=/path/to/" + NATIVE_LIB + ", or install "
            "without it with STATECACHE_BUILD_NATIVE=off.")
    bin_dir = subprocess.run([bazel, "info", "bazel-bin"], cwd=REPO, check=True,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True).stdout.strip()
    return os.path.join(bin_dir, "client", "python", NATIVE_LIB)


def _native_source(mode: str, prebuilt: str):
    """(path of the library to bundle, None) or (None, why there is none)."""
    if mode not in NATIVE_MODES:
        raise RuntimeError(f"STATECACHE_BUILD_NATIVE={mode!r}: want one of "
                           f"{', '.join(NATIVE_MODES)}")
    if prebuilt:
        if mode == "off":
            raise RuntimeError("STATECACHE_PREBUILT_DATAPLANE_LIB and "
                               "STATECACHE_BUILD_NATIVE=off contradict each other")
        if not os.path.isfile(prebuilt):
            raise RuntimeError(f"STATECACHE_PREBUILT_DATAPLANE_LIB={prebuilt!r}: no such file")
        return prebuilt, None
    if mode == "off":
        return None, "skipped: STATECACHE_BUILD_NATIVE=off"
    in_repo = os.path.isfile(os.path.join(REPO, "WORKSPACE")) and os.path.isfile(
        os.path.join(HERE, "BUILD"))
    bazel = shutil.which("bazel")
    why = None if in_repo and bazel else (
        "not built from the statecache repository" if not in_repo else "no bazel on PATH")
    if why is None:
        return _bazel_build(bazel), None
    if mode == "bazel":
        raise RuntimeError(f"STATECACHE_BUILD_NATIVE=bazel: {why}")
    return None, why


def _native_library(build_lib: str) -> None:
    """Puts NATIVE_LIB into build_lib/statecache/_native/, or a NOT_BUILT file
    with the reason (statecache.attached.find_library quotes it)."""
    dst = os.path.join(build_lib, "statecache", "_native")
    shutil.rmtree(dst, ignore_errors=True)  # never a stale library of an earlier build
    os.makedirs(dst)
    src, why = _native_source(os.environ.get("STATECACHE_BUILD_NATIVE", "auto"),
                              os.environ.get("STATECACHE_PREBUILT_DATAPLANE_LIB", ""))
    if src is not None:
        shutil.copyfile(src, os.path.join(dst, NATIVE_LIB))
        os.chmod(os.path.join(dst, NATIVE_LIB), 0o755)
        print(f"statecache: bundled {src} as statecache/_native/{NATIVE_LIB}", flush=True)
        return
    with open(os.path.join(dst, "NOT_BUILT"), "w") as f:
        f.write(why + "\n")
    print(f"WARNING: statecache: installing without {NATIVE_LIB} ({why}); "
          "statecache.attached and statecache.torch will need STATECACHE_DATAPLANE_LIB "
          "at run time. To bundle it: install from the repository with bazel on PATH, or "
          "set STATECACHE_PREBUILT_DATAPLANE_LIB=/path/to/" + NATIVE_LIB, flush=True)


class build_py(_build_py):
    def run(self):
        super().run()
        _bundle_proto()
        _gen_module().generate(self.build_lib)
        _native_library(self.build_lib)


class sdist(_sdist):
    def run(self):
        _bundle_proto()
        super().run()


class BinaryDistribution(Distribution):
    """The wheel holds native code built for this machine (the _prefixhash
    extension, the attached-mode library): a platform wheel, never
    py3-none-any."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": build_py, "sdist": sdist},
      distclass=BinaryDistribution,
      # statecache/prefix.py's C chain (loaded with ctypes; optional: pure
      # Python, same keys, when no compiler is at hand).
      ext_modules=[Extension("statecache._prefixhash", ["statecache/_prefixhash.c"],
                             optional=True)])
