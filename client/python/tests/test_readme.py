"""Every ```python block of client/python/README.md, run as printed (in a
child interpreter, in order, with STATECACHE_SERVER naming a fresh
statecached). A block marked `<!-- not run: why -->` on the line before is
not run; one marked `<!-- run by: FILE -->` is run as printed by that test
(in another venv: tests/transformers_check.py needs torch + transformers).
The expected sets of both are pinned here so none is dropped silently."""
import os
import re
import subprocess
import sys

import pytest

from conftest import PKG_ROOT, Server

README = os.path.join(PKG_ROOT, "README.md")
NOT_RUN = ["needs a CUDA torch worker (tests/dataplane/torch_attached_check.py)",
           "needs a CUDA torch worker (tests/dataplane/torch_ops_check.py)",
           "needs a CUDA torch engine (CPU form: tests/torch_local_check.py)"]
RUN_BY = ["tests/transformers_check.py"]


def blocks():
    text = open(README).read()
    out = []
    for m in re.finditer(r"(?:<!-- (not run|run by): (.*?) -->\n)?```python\n(.*?)```", text,
                         re.S):
        out.append((m.group(1) and (m.group(1), m.group(2)), m.group(3)))
    return out


def test_not_run_blocks_are_the_expected_ones():
    assert [why[1] for why, _ in blocks() if why and why[0] == "not run"] == NOT_RUN
    assert [why[1] for why, _ in blocks() if why and why[0] == "run by"] == RUN_BY
    assert len([1 for why, _ in blocks() if not why]) >= 4


@pytest.fixture(scope="module")
def readme_server(statecached_binary):
    s = Server(statecached_binary, [f"--state_memory_bytes={512 << 20}",
                                    f"--checkpoint_memory_bytes={128 << 20}"])
    yield s
    assert s.stop() == 0, "".join(s.log)


@pytest.mark.parametrize("index", [i for i, (why, _) in enumerate(blocks()) if not why])
def test_readme_block_runs_as_printed(readme_server, index):
    code = blocks()[index][1]
    env = dict(os.environ, STATECACHE_SERVER=readme_server.target,
               PYTHONPATH=os.pathsep.join([PKG_ROOT] + [p for p in sys.path if p]))
    # the test's generated stubs live in another sys.path entry (conftest)
    import statecache
    prelude = "import statecache\nstatecache.__path__.extend(%r)\n" % list(statecache.__path__)
    r = subprocess.run([sys.executable, "-c", prelude + code], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"README block {index}:\n{code}\n--- stderr:\n{r.stderr}"
