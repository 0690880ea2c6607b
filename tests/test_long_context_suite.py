"""benchmarks/long_context_suite.py on the CPU: seeded task generation, lengths under the tiny LM's tokenizer,
RULER's scoring, argument errors, and the client against a fake server in a thread (both APIs, both ways of
naming the server: --url and a launched --config, with server_process.Server replaced by the fake)."""

import http.server
import json
import os
import re
import sys
import threading

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))
import long_context_suite as suite  # noqa: E402

TINY = os.path.join(os.path.dirname(HERE), "benchmarks", "models", "tiny-llama-pycode")


@pytest.fixture(scope="module")
def count():
    from transformers import AutoTokenizer

    return suite.token_counter(AutoTokenizer.from_pretrained(TINY))


# ---------------------------------------------------------------------------------------------- generation
@pytest.mark.parametrize("task", suite.TASKS)
@pytest.mark.parametrize("style", suite.STYLES)
def test_samples_are_seeded(task, style, count):
    first = suite.make_samples(task, style, 4096, 2, 7, count)
    assert first == suite.make_samples(task, style, 4096, 2, 7, count)
    assert first[0].prompt != first[1].prompt
    assert first[0].prompt != suite.make_samples(task, style, 4096, 1, 8, count)[0].prompt


@pytest.mark.parametrize("style", suite.STYLES)
def test_needle_once(style, count):
    for s in suite.make_samples("niah_multikey", style, 4096, 4, 0, count):
        (value,) = s.expected
        assert len(value) == suite.VALUE_DIGITS and s.prompt.count(value) == 1
        needle = next(line for line in s.prompt.split("\n") if value in line)
        assert s.prompt.count(needle) == 1
        key = re.search(r"for (\S+) is: " if style == "ruler" else r"^(\w+) = ", needle).group(1)
        assert s.prompt.count(key) == (3 if style == "ruler" else 2)  # the needle and the question (RULER's: twice)
        assert len(re.findall(r"\d{%d}" % suite.VALUE_DIGITS, s.prompt)) == suite.NUM_KEYS


@pytest.mark.parametrize("style", suite.STYLES)
def test_chain_once(style, count):
    for s in suite.make_samples("variable_tracking", style, 4096, 4, 0, count):
        lines = s.prompt.split("\n")
        chain = [line for line in lines if re.fullmatch(r"(VAR )?[A-Z]{5} = .*", line)]
        assert len(chain) == suite.CHAIN_HOPS + 1 and all(lines.count(line) == 1 for line in chain)
        value = chain[0].split(" = ")[1]
        names = [re.match(r"(?:VAR )?([A-Z]{5})", line).group(1) for line in chain]
        assert s.expected == (tuple(names) if style == "ruler" else (value,))
        # ruler: RULER's question and answer prefix repeat the value; python asks the last name's value
        assert s.prompt.count(value) == (3 if style == "ruler" else 1)


@pytest.mark.parametrize("style", suite.STYLES)
def test_common_words_counts(style, count):
    for length, (common, rare) in ((4096, suite.REPEATS), (2048, suite.SHORT_REPEATS)):
        s = suite.make_samples("common_words", style, length, 1, 0, count)[0]
        listed = re.findall(r"\d+\. (\w+)" if style == "ruler" else r'"(\w+)"', s.prompt)
        counts = {w: listed.count(w) for w in set(listed)}
        assert len(s.expected) == suite.COMMON_WORDS and all(counts[w] == common for w in s.expected)
        assert set(counts.values()) == {common, rare}


@pytest.mark.parametrize("task", suite.TASKS)
@pytest.mark.parametrize("style", suite.STYLES)
def test_lengths_hit_target(task, style, count):
    for length in (4096, 8192):
        for s in suite.make_samples(task, style, length, 2, 0, count):
            budget = length - s.max_tokens
            assert s.prompt_tokens == count(s.prompt) and 0.97 * budget <= s.prompt_tokens <= budget


def test_fit_is_the_largest_that_fits():
    draft = suite.Draft(("x",), lambda n: "q" + "ab" * n)
    for start in (1, 5, 16, 400):
        assert suite.fit(draft, 101, len, start) == (50, "q" + "ab" * 50, 101)
    capped = suite.Draft(("x",), lambda n: "q" + "ab" * n, max_units=10)
    assert suite.fit(capped, 101, len, 16)[0] == 10
    with pytest.raises(ValueError, match="without haystack"):
        suite.fit(draft, 0, len, 16)


def test_clamp_lengths():
    assert suite.model_max_length(TINY) == 65536
    assert suite.clamp_lengths([4096, 32768], 65536) == ([4096, 32768], None)
    kept, note = suite.clamp_lengths([4096, 16384, 32768], 8192)
    assert kept == [4096, 8192] and "8192" in note


# ---------------------------------------------------------------------------------------------- scoring
def test_string_match_all():
    assert suite.string_match_all(" The numbers: 1234567 and 7654321\n", ("1234567", "7654321")) == 1.0
    assert suite.string_match_all("ABCDE, FGHIJ", ("abcde", "fghij", "KLMNO", "PQRST")) == 0.5
    assert suite.string_match_all("nothing here", ("1234567",)) == 0.0
    assert suite.clean("\x00 abc\tdef \x1f") == "abc\ndef"


# ---------------------------------------------------------------------------------------------- arguments
@pytest.mark.parametrize("argv, flag", [
    (["--url", "u", "--lengths", "4k"], "--lengths"),
    (["--url", "u", "--lengths", "100"], "--lengths"),
    (["--url", "u", "--samples", "0"], "--samples"),
    (["--url", "u", "--tasks", "niah,qa"], "--tasks"),
    (["--url", "u", "--styles", "prose"], "--styles"),
    (["--config", "no label", "--model", TINY], "--config"),
    (["--config", "=--page-size 16", "--model", TINY], "--config"),
    (["--config", "dense=--page-size 16"], "--config"),
    (["--config", "a=", "--config", "a=--enable-locks", "--model", TINY], "--config"),
    (["--url", "u", "--config", "a=", "--model", TINY], "--config"),
    ([], "--config"),
])
def test_bad_arguments_exit_2(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        suite.main(argv)
    assert e.value.code == 2 and flag in capsys.readouterr().err


def test_length_too_short_for_a_task_exits_2(capsys, tmp_path):
    argv = ["--url", "http://127.0.0.1:1", "--tokenizer", TINY, "--tasks", "common_words", "--lengths", "512",
            "--out", str(tmp_path / "out.json")]
    assert suite.main(argv) == 2
    err = capsys.readouterr().err
    assert "--lengths" in err and "common_words" in err and not (tmp_path / "out.json").exists()


def test_help(capsys):
    with pytest.raises(SystemExit) as e:
        suite.main(["--help"])
    assert e.value.code == 0 and "--config LABEL=FLAGS" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------- client
class FakeServer(http.server.BaseHTTPRequestHandler):
    """Answers a python-style needle prompt with its needle's value (any other prompt: 'no idea'), as
    /v1/completions or /generate; /model_info names the tiny LM's tokenizer, /v1/models a served name,
    /server_info has LOCKS counters."""

    requests = []

    def log_message(self, *args):  # keep pytest's output clean
        pass

    def reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/model_info":
            self.reply(dict(model_path=TINY, tokenizer_path=TINY))
        elif self.path == "/v1/models":
            self.reply(dict(data=[dict(id="tiny-served")]))
        elif self.path == "/server_info":
            self.reply(dict(internal_states=[dict(locks=dict(locks_decode_steps=3))]))
        else:
            self.send_error(404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeServer.requests.append((self.path, body))
        prompt = body.get("prompt", body.get("text", ""))
        asked = re.search(r'assert (\w+) == "$', prompt)
        found = asked and re.search(r'^%s = "(\d+)"$' % asked.group(1), prompt, re.M)
        text = found.group(1) + '"\n' if found else "no idea"
        if self.path == "/v1/completions":
            self.reply(dict(choices=[dict(text=text)]))
        elif self.path == "/generate":
            self.reply(dict(text=text))
        else:
            self.send_error(404)


@pytest.fixture
def fake_url():
    FakeServer.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def run(argv, tmp_path) -> dict:
    out = tmp_path / "suite.json"
    assert suite.main([*argv, "--lengths", "1024", "--samples", "3", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_client_completions(fake_url, tmp_path, capsys):
    # no --tokenizer or --model: the tokenizer path comes from the server's /model_info, the name from /v1/models
    result = run(["--url", fake_url, "--label", "dense", "--server-flags", "--page-size 16", "--tasks",
                  "niah_multikey,variable_tracking", "--styles", "ruler,python"], tmp_path)
    assert result["tokenizer"] == TINY and result["lengths"] == [1024] and "long_context_suite.py" in result["command"]
    assert result["servers"] == [dict(label="dense", flags="--page-size 16", url=fake_url,
                                      locks=dict(locks_decode_steps=3))]
    scores = {(r["task"], r["style"]): r["score"] for r in result["rows"]}
    assert scores == {("niah_multikey", "ruler"): 0.0, ("niah_multikey", "python"): 1.0,
                      ("variable_tracking", "ruler"): 0.0, ("variable_tracking", "python"): 0.0}
    assert all(r["label"] == "dense" and r["samples"] == 3 and r["context_len"] == 1024 for r in result["rows"])
    path, body = FakeServer.requests[0]
    assert path == "/v1/completions" and body["model"] == "tiny-served" and body["temperature"] == 0 and body["max_tokens"] == suite.MAX_TOKENS[
        "niah_multikey"]
    assert len(FakeServer.requests) == 12
    table = capsys.readouterr().out
    assert re.search(r"niah_multikey\s+python\s+1024\s+1\.000", table)


def test_client_generate_and_launched_configs(fake_url, tmp_path, monkeypatch):
    launched = []

    class Launched:  # server_process.Server's interface, pointing at the fake server
        def __init__(self, name, port, args, log_dir, ready_timeout):
            launched.append((name, args))
            if "--broken" in args:
                raise RuntimeError(f"server {name} exited with 1")
            self.url, self.startup_s, self.log = fake_url, 1.0, os.path.join(log_dir, f"server_{name}.log")

        def stop(self):
            launched.append("stopped")

    monkeypatch.setattr(suite, "Server", Launched)
    out = tmp_path / "suite.json"
    argv = ["--model", TINY, "--api", "generate", "--tasks", "niah_multikey", "--styles", "python",
            "--config", "dense=--attention-backend flashinfer", "--config", "locks budget 256=--enable-locks "
            "--locks-token-budget 256", "--config", "broken=--broken", "--common-flags", "--page-size 16",
            "--log-dir", str(tmp_path), "--lengths", "1024", "--samples", "2", "--out", str(out)]
    assert suite.main(argv) == 1  # the server that did not start
    result = json.loads(out.read_text())
    assert [(r["label"], r["score"], r["error"]) for r in result["rows"]] == [
        ("dense", 1.0, None), ("locks budget 256", 1.0, None), ("broken", None, "server broken exited with 1")]
    assert launched[0] == ("dense", ["--model-path", TINY, "--context-length", "1024", "--page-size", "16",
                                     "--attention-backend", "flashinfer"])
    assert launched[2][0] == "locks_budget_256" and launched.count("stopped") == 2
    assert result["servers"][1]["flags"] == "--enable-locks --locks-token-budget 256"
    assert all(path == "/generate" and body["sampling_params"]["temperature"] == 0
               for path, body in FakeServer.requests)
