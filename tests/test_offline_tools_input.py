"""Bad input to the offline tools (sglang_locks.evaluate, sglang_locks.synthetic): exit 2 with one line on
stderr naming the field or flag and its allowed range, no traceback, no figure and no file written."""

import os
import subprocess
import sys

import pytest
import torch

from sglang_locks import evaluate as ev
from sglang_locks import synthetic as sy

EVALUATE = "python -m sglang_locks.evaluate: error: "
SYNTHETIC = "python -m sglang_locks.synthetic: error: "


def _refused(main, argv, capsys, prefix):
    """main(argv)'s one stderr line, after checking it exits 2 and prints nothing on stdout."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out, err = capsys.readouterr()
    assert exit_.value.code == 2
    assert out == ""
    assert len(err.splitlines()) == 1 and err.startswith(prefix), err
    return err


def _kv(n=40, hkv=2, hq=4, d=8, m=3, values=True):
    gen = torch.Generator().manual_seed(0)
    data = {"keys": torch.randn(n, hkv, d, generator=gen), "queries": torch.randn(m, hq, d, generator=gen)}
    if values:
        data["values"] = torch.randn(n, hkv, d, generator=gen)
    return data


def _with(**fields):
    return {**_kv(), **fields}


def _poisoned(name, value):
    data = _kv()
    data[name].view(-1)[5] = value
    return data


@pytest.fixture
def good_kv(tmp_path):
    path = tmp_path / "kv.pt"
    torch.save(_kv(), path)
    return str(path)


def test_good_input_still_evaluates(good_kv, capsys):
    """The control for the refusals below: the same small file and flags run and print finite figures."""
    assert ev.main(["--kv", good_kv, "--budget", "48", "--selectors", "locks,quest,shared:3,oracle"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    assert len(lines) == 4
    for line in lines:
        recall, rel_error = map(float, line.split()[-2:])
        assert 0 < recall <= 1 and rel_error >= 0


@pytest.mark.parametrize("contents, message", [
    (None, "cannot read it: No such file"),
    (b"", "empty file"),
    (b"keys,queries\n1,2\n", "not a torch.save file"),
])
def test_unreadable_files(tmp_path, capsys, contents, message):
    path = tmp_path / "kv.pt"
    if contents is not None:
        path.write_bytes(contents)
    err = _refused(ev.main, ["--kv", str(path), "--budget", "64"], capsys, EVALUATE)
    assert f"--kv {path}: {message}" in err


@pytest.mark.parametrize("data, message", [
    ([torch.zeros(3)], "holds a list; need a dict of keys [N, H_kv, d]"),
    ({"queries": torch.zeros(1, 1, 8)}, "missing 'keys'"),
    (_with(keys=[[0.0] * 8] * 40), "keys must be a 3-dim floating-point tensor, got list"),
    (_with(queries=3), "queries must be a 3-dim floating-point tensor, got int"),
    (_with(values=torch.zeros(40, 2)), "values must be a 3-dim floating-point tensor"),
    (_with(keys=torch.zeros(40, 2, 8, dtype=torch.long)), "keys must be a 3-dim floating-point tensor, got torch.int64"),
    (_kv(n=0), "N >= 1 tokens"),
    (_kv(hkv=0, hq=0), "H_kv >= 1 heads"),
    (_kv(d=0), "d >= 1"),
    (_kv(m=0), "M >= 1 queries"),
    (_kv(hq=0), "H_q a positive multiple of the keys' H_kv = 2"),
    (_kv(hq=3), "H_q a positive multiple of the keys' H_kv = 2"),
    (_with(queries=torch.zeros(3, 4, 6)), "the keys' d = 8"),
    (_with(values=torch.zeros(40, 2, 6)), "values must have the keys' shape (40, 2, 8)"),
    (_poisoned("keys", float("nan")), "keys must be finite, got 1 NaN or Inf"),
    (_poisoned("keys", float("inf")), "keys must be finite, got 1 NaN or Inf"),
    (_poisoned("queries", float("-inf")), "queries must be finite, got 1 NaN or Inf"),
    (_poisoned("values", float("nan")), "values must be finite, got 1 NaN or Inf"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_bad_contents(tmp_path, capsys, data, message):
    path = tmp_path / "kv.pt"
    torch.save(data, path)
    err = _refused(ev.main, ["--kv", str(path), "--budget", "64"], capsys, EVALUATE)
    assert message in err


@pytest.mark.parametrize("flags, message", [
    (["--budget", ""], "--budget: need at least one token budget"),
    (["--budget", ","], "--budget: need at least one token budget"),
    (["--budget", "40"], "token_budget must be a multiple of 16 and >= (sink_pages + local_pages + 1) * page_size = 48"),
    (["--budget", "0"], "token_budget must be a multiple of 16"),
    (["--budget", "-64"], "token_budget must be a multiple of 16"),
    (["--budget", "64", "--rank", "0"], "rank must be in [1, page_size=16], got 0"),
    (["--budget", "64", "--sink-pages", "-1"], "sink_pages must be >= 0"),
    (["--budget", "64", "--selectors", ""], "--selectors: need at least one of locks"),
    (["--budget", "64", "--selectors", ",,"], "--selectors: need at least one of locks"),
    (["--budget", "64", "--selectors", "rocket"], "unknown selector 'rocket'"),
    (["--budget", "64", "--selectors", "quest:2"], "unknown selector 'quest:2'"),
    (["--budget", "64", "--selectors", "shared:-1"], "selector 'shared:-1': shared:RANK takes RANK >= 1"),
    (["--budget", "64", "--selectors", "shared:0"], "selector 'shared:0': shared:RANK takes RANK >= 1"),
    (["--budget", "64", "--selectors", "shared:two"], "selector 'shared:two': shared:RANK takes RANK >= 1"),
    (["--budget", "64", "--selectors", "locks:int3"], "selector 'locks:int3': locks:PRECISION takes one of fp32"),
    (["--budget", "64", "--selectors", "locks-prefilter:-2"], "F >= 1 candidate pages"),
    (["--budget", "64", "--rank", "4", "--selectors", "locks-prefilter:8:5"], "R in [0, rank = 4]"),
])
def test_bad_flags(good_kv, capsys, flags, message):
    err = _refused(ev.main, ["--kv", good_kv, *flags], capsys, EVALUATE)
    assert message in err


def test_a_bad_selector_is_refused_before_any_runs(monkeypatch, good_kv, capsys):
    ran = []
    monkeypatch.setattr(ev, "select_pages", lambda *a: ran.append(a))
    _refused(ev.main, ["--kv", good_kv, "--budget", "48", "--selectors", "locks,shared:-1"], capsys, EVALUATE)
    assert not ran


def test_a_selector_that_cannot_summarise_the_keys_is_named(tmp_path, capsys):
    path = tmp_path / "kv.pt"
    torch.save(_kv(d=7), path)
    err = _refused(ev.main, ["--kv", str(path), "--budget", "48", "--selectors", "locks"], capsys, EVALUATE)
    assert "selector 'locks': head_dim must be even, got 7" in err


def test_float32_overflow_gives_no_figure(tmp_path, capsys):
    """Finite keys and queries whose logits overflow float32: an error, not a NaN recall."""
    data = _kv()
    data["keys"] *= 1e20
    data["queries"] *= 1e20
    path = tmp_path / "kv.pt"
    torch.save(data, path)
    err = _refused(ev.main, ["--kv", str(path), "--budget", "48", "--selectors", "oracle"], capsys, EVALUATE)
    assert "selector 'oracle' at budget 48" in err and "overflows float32" in err


def test_library_evaluate_refuses_the_same_input():
    with pytest.raises(ValueError, match="N >= 1 tokens"):
        ev.evaluate(_kv(n=0), [64])
    with pytest.raises(ValueError, match="--budget: need at least one"):
        ev.evaluate(_kv(), [])
    with pytest.raises(ValueError, match="shared:RANK takes RANK >= 1"):
        ev.evaluate(_kv(), [64], ["shared:-1"])


def test_shared_ranks_beyond_head_dim_are_the_exact_keys():
    """Why shared:RANK has no upper bound: from rank d the shared basis spans every direction, so it
    ranks pages like the oracle (as LOCKS' --rank beyond d pads zero rows)."""
    data = _kv(n=640, d=6, m=6, values=False)
    rows = {(r["selector"], r["budget"]): r["recall"]
            for r in ev.evaluate(data, [48, 96], ["shared:3", "shared:6", "shared:300", "oracle"])}
    for b in (48, 96):
        assert rows["shared:6", b] == pytest.approx(rows["oracle", b], abs=1e-6)
        assert rows["shared:300", b] == pytest.approx(rows["oracle", b], abs=1e-6)
        assert rows["shared:3", b] < rows["oracle", b] - 1e-3  # below d the data tells ranks apart


# ---------------------------------------------------------------------- synthetic
SMALL = ["--tokens", "40", "--head-dim", "8", "--queries", "2"]


@pytest.mark.parametrize("flags, message", [
    (["--tokens", "0"], "--tokens must be an integer >= 1, got 0"),
    (["--kv-heads", "0"], "--kv-heads must be an integer >= 1, got 0"),
    (["--group", "-1"], "--group must be an integer >= 1, got -1"),
    (["--head-dim", "0"], "--head-dim must be an integer >= 1, got 0"),
    (["--queries", "0"], "--queries must be an integer >= 1, got 0"),
    (["--page-rank", "0"], "--page-rank must be an integer in [1, --head-dim = 8], got 0"),
    (["--page-rank", "9"], "--page-rank must be an integer in [1, --head-dim = 8], got 9"),
    (["--targets", "0"], "--targets must be an integer >= 1, got 0"),
    (["--spread", "-1"], "--spread must be a finite number >= 0.0, got -1.0"),
    (["--key-noise", "nan"], "--key-noise must be a finite number >= 0.0, got nan"),
    (["--strength", "inf"], "--strength must be a finite number >= 0.0, got inf"),
    (["--query-noise", "-0.5"], "--query-noise must be a finite number >= 0.0, got -0.5"),
    (["--seed", "-1"], "--seed must be an integer in [0, 18446744073709551615], got -1"),
    (["--seed", str(2**64)], "--seed must be an integer in [0, 18446744073709551615]"),
])
def test_synthetic_refuses_out_of_range_flags(tmp_path, capsys, flags, message):
    out = tmp_path / "kv.pt"
    err = _refused(sy.main, ["--out", str(out), *SMALL, *flags], capsys, SYNTHETIC)
    assert message in err
    assert not out.exists()


@pytest.mark.parametrize("where", ["missing/kv.pt", "."])
def test_synthetic_refuses_an_unwritable_out(tmp_path, capsys, where):
    out = str(tmp_path / where)
    err = _refused(sy.main, ["--out", out, *SMALL], capsys, SYNTHETIC)
    assert f"--out {out}: need a file name in an existing, writable directory" in err


def test_synthetic_edges_of_the_ranges_write_a_file_evaluate_takes(tmp_path, capsys):
    out = str(tmp_path / "kv.pt")
    edges = ["--tokens", "1", "--kv-heads", "1", "--group", "1", "--head-dim", "2", "--queries", "1",
             "--page-rank", "2", "--targets", "1", "--spread", "0", "--key-noise", "0", "--strength", "0",
             "--query-noise", "0", "--seed", str(2**64 - 1)]
    assert sy.main(["--out", out, *edges]) == 0
    assert ev.main(["--kv", out, "--budget", "48", "--json"]) == 0
    assert '"recall": 1.0' in capsys.readouterr().out  # one token: attended densely


def test_structured_kv_refuses_the_same_values():
    with pytest.raises(ValueError, match=r"--page-rank must be an integer in \[1, --head-dim = 4\], got 5"):
        sy.structured_kv(tokens=16, head_dim=4, page_rank=5)
    with pytest.raises(ValueError, match="--tokens must be an integer >= 1, got 2.5"):
        sy.structured_kv(tokens=2.5)


# ---------------------------------------------------------------------- through python -m
@pytest.mark.parametrize("argv, message", [
    (["sglang_locks.evaluate", "--kv", "no-such.pt", "--budget", "64"], EVALUATE + "--kv no-such.pt: cannot read it"),
    (["sglang_locks.synthetic", "--out", "kv.pt", "--kv-heads", "0"], SYNTHETIC + "--kv-heads must be an integer >= 1"),
])
def test_module_entry_points_exit_2_with_one_line(tmp_path, argv, message):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and proc.stderr.startswith(message), proc.stderr
    assert not os.listdir(tmp_path)
