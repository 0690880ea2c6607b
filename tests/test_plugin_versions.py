"""The SGLang releases the plugin supports: the declared range, the `serve` extra and the start-up check agree,
and what differs between the releases (plugin/compat.py) works on the one installed."""

import inspect
import os
import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from plugin_helpers import load_sglang_plugins
from sglang_locks.plugin import check_installed
from sglang_locks.plugin.compat import SUPPORTED_SGLANG_VERSIONS
from test_plugin_args import parse
from test_plugin_graph_variants import FakeBackend, FakeRunner

HERE = os.path.dirname(os.path.abspath(__file__))
PYPROJECT = os.path.join(os.path.dirname(HERE), "pyproject.toml")
FIRST, LAST = Version(SUPPORTED_SGLANG_VERSIONS[0]), Version(SUPPORTED_SGLANG_VERSIONS[-1])
BELOW = f"{FIRST.major}.{FIRST.minor}.{FIRST.micro - 1}"
ABOVE = f"{LAST.major}.{LAST.minor}.{LAST.micro + 1}"


def serve_extra() -> Requirement:
    with open(PYPROJECT, "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["serve"]
    (sglang,) = [Requirement(r) for r in extra if Requirement(r).name == "sglang"]
    return sglang


def test_declared_versions_are_ascending_releases():
    versions = [Version(v) for v in SUPPORTED_SGLANG_VERSIONS]
    assert versions == sorted(set(versions))
    assert all(str(v) == s for v, s in zip(versions, SUPPORTED_SGLANG_VERSIONS))  # as SGLang spells __version__


def test_serve_extra_spans_exactly_the_declared_versions():
    spec = serve_extra().specifier
    assert {(s.operator, s.version) for s in spec} == {(">=", str(FIRST)), ("<=", str(LAST))}
    assert all(spec.contains(v) for v in SUPPORTED_SGLANG_VERSIONS)
    assert not spec.contains(BELOW) and not spec.contains(ABOVE)


@pytest.mark.parametrize("version", SUPPORTED_SGLANG_VERSIONS)
def test_start_up_check_accepts_every_declared_version(version, monkeypatch):
    import sglang

    load_sglang_plugins()
    monkeypatch.setattr(sglang, "__version__", version)
    check_installed()


@pytest.mark.parametrize("version", [BELOW, ABOVE, f"{LAST}.post1"])
def test_start_up_check_refuses_others_naming_the_range(version, monkeypatch):
    import sglang

    load_sglang_plugins()
    monkeypatch.setattr(sglang, "__version__", version)
    with pytest.raises(RuntimeError, match=rf"^--enable-locks supports SGLang {re.escape(str(FIRST))} to "
                                           rf"{re.escape(str(LAST))}, not {re.escape(version)}$"):
        check_installed()


def test_cpu_pins_are_the_installed_sglangs_own():
    """Each package pinned for the CPU tests (tests/requirements-sglang-cpu*.txt) that the installed SGLang pins
    exactly is installed at SGLang's pin, so that each release runs with the libraries it declares."""
    from importlib.metadata import requires, version

    with open(os.path.join(HERE, "requirements-sglang-cpu.txt")) as f:
        ours = {canonicalize_name(Requirement(l).name) for l in map(str.strip, f) if l and not l.startswith("#")}
    exact = {}
    for r in map(Requirement, requires("sglang")):
        pins = [s.version for s in r.specifier if s.operator == "=="]
        if pins and canonicalize_name(r.name) in ours and (r.marker is None or r.marker.evaluate({"extra": ""})):
            exact[r.name] = pins[0]
    assert exact  # SGLang pins some of them (transformers, xgrammar, ...): the check is not vacuous
    assert {n: version(n) for n in exact} == exact


def test_graph_key_keeps_sglangs_attention_variant():
    """From 0.5.18 the decode runner passes its own attention variant to _make_graph_key, positionally at replay
    and by name at capture (dsa_variant, later attention_variant): the hook hands it on either way."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    load_sglang_plugins()
    params = list(inspect.signature(DecodeCudaGraphRunner._make_graph_key.__wrapped__).parameters)
    if len(params) < 5:
        pytest.skip(f"this SGLang's _make_graph_key takes {params[1:]}: no attention variant")
    name = params[4]
    runner = FakeRunner(FakeBackend())
    for key in (DecodeCudaGraphRunner._make_graph_key(runner, 4, None, "lora", "dense"),
                DecodeCudaGraphRunner._make_graph_key(runner, 4, variant_label="lora", **{name: "dense"})):
        assert (key.variant_label, getattr(key, name)) == ("lora+locks-locks", "dense")


def test_metadata_glue_graph_refused_where_sglang_has_it(monkeypatch):
    from sglang.srt.environ import envs

    monkeypatch.setenv("SGLANG_ENABLE_METADATA_GLUE_GRAPH", "1")
    if not hasattr(envs, "SGLANG_ENABLE_METADATA_GLUE_GRAPH"):
        assert parse("--enable-locks").locks_config is not None  # unknown to this SGLang: no effect
        return
    with pytest.raises(ValueError, match=r"does not support SGLANG_ENABLE_METADATA_GLUE_GRAPH=1: it replays"):
        parse("--enable-locks")
    assert parse().locks_config is None  # without --enable-locks nothing is refused


@pytest.mark.parametrize("flags, capture_bs", [
    (["--cuda-graph-bs-decode", "1", "2", "4"], (1, 2, 4)),
    (["--cuda-graph-backend-decode", "disabled"], ()),
])
def test_decoder_reserve_reads_the_resolved_cuda_graph_sizes(flags, capture_bs):
    """memory.captured_batch_sizes, on server_args as the model runner gets them: resolved by the launcher
    (ServerArgs.resolve_once, from 0.5.19; earlier releases resolve while parsing)."""
    from sglang_locks.plugin.memory import captured_batch_sizes

    sa = parse("--enable-locks", *flags)
    if hasattr(sa, "resolve_once"):
        sa.resolve_once()
    assert captured_batch_sizes(sa) == capture_bs
