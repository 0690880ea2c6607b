"""Test set-up for two worlds in one ``pytest tests`` run.

Without a GPU, Triton kernels run in Triton's CPU interpreter, so CI checks the
kernels themselves. The SGLang plugin tests (``test_plugin_*.py``) import
SGLang, which must not share a process with the interpreted kernels: they run
in one child pytest (a fresh interpreter without TRITON_INTERPRET, SGLang's
CPU stand-ins installed), and each file shows up here as one test carrying the
child's verdict for that file.
"""

import fnmatch
import json
import os
import subprocess
import sys
import tempfile

import pytest

try:
    import torch

    HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    HAS_CUDA = False

PLUGIN_TESTS = "test_plugin_*.py"
CHILD_ENV = "SGLANG_LOCKS_TEST_ENV"  # "sglang" in the child
REPORT_ENV = "SGLANG_LOCKS_TEST_REPORT"  # where the child writes its per-test outcomes
IN_SGLANG_CHILD = os.environ.get(CHILD_ENV) == "sglang"
HERE = os.path.dirname(os.path.abspath(__file__))

if IN_SGLANG_CHILD:
    sys.path.insert(0, HERE)
    import sglang_cpu_env

    sglang_cpu_env.install()
elif not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    return "cuda" if HAS_CUDA else "cpu"


# ---------------------------------------------------------------------- child: record outcomes
def pytest_runtest_logreport(report):
    path = os.environ.get(REPORT_ENV)
    if not IN_SGLANG_CHILD or not path or not (report.when == "call" or report.outcome != "passed"):
        return
    with open(path, "a") as f:
        f.write(json.dumps({"nodeid": report.nodeid, "outcome": report.outcome, "when": report.when,
                            "text": report.longreprtext if report.outcome != "passed" else ""}) + "\n")


# ---------------------------------------------------------------------- parent: delegate plugin tests
def pytest_pycollect_makemodule(module_path, parent):
    if not IN_SGLANG_CHILD and fnmatch.fnmatch(module_path.name, PLUGIN_TESTS):
        return SglangTestFile.from_parent(parent, path=module_path)
    return None


class SglangTestFile(pytest.File):
    def collect(self):
        yield SglangTests.from_parent(self, name="sglang")


class SglangTests(pytest.Item):
    """The child's outcome for one plugin test file."""

    def runtest(self):
        outcomes, output = _child_run(self.session)
        mine = [o for o in outcomes if o["nodeid"].split("::")[0].endswith(self.path.name)]
        failed = [o for o in mine if o["outcome"] == "failed"]
        if failed:
            raise SglangChildFailure("\n\n".join(f"{o['nodeid']} ({o['when']})\n{o['text']}" for o in failed))
        if not mine:
            raise SglangChildFailure(f"no test of {self.path.name} ran in the SGLang child:\n{output[-8000:]}")
        if all(o["outcome"] == "skipped" for o in mine):
            pytest.skip(mine[0]["text"][-300:])

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, SglangChildFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"{self.path.name} (SGLang child process)"


class SglangChildFailure(Exception):
    pass


def _child_run(session):
    """One child pytest for every plugin test file collected here; run once per session."""
    cached = getattr(session, "_sglang_child", None)
    if cached is not None:
        return cached
    files = sorted({str(item.path) for item in session.items if isinstance(item, SglangTests)})
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as f:
        report = f.name
    env.update({CHILD_ENV: "sglang", REPORT_ENV: report})
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
                          cwd=os.path.dirname(HERE), env=env, capture_output=True, text=True, timeout=900)
    with open(report) as f:
        outcomes = [json.loads(line) for line in f]
    os.unlink(report)
    session._sglang_child = (outcomes, proc.stdout + proc.stderr)
    return session._sglang_child
