"""benchmarks/agent_trace.py and agent_serving.py on the CPU: the trace through SGLang's own loader, the radix replay
against SGLang's RadixCache, the server and client command lines through SGLang's own parsers, the row fields.

A plugin test (SGLang's child process): SGLang imports need the CPU stand-ins.
"""

import importlib.util
import inspect
import json
import os
import random
import sys
import types

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))
import agent_serving as serving  # noqa: E402
import agent_trace as at  # noqa: E402

from plugin_helpers import load_sglang_plugins  # noqa: E402

# The kit's dummy model folders exist only where the GPU kit was built (.gpu-kit): these tests read a copy of the
# Llama-3.1-8B one's config and stand-in tokenizer.
import e2e_decode  # noqa: E402

at.KIT = e2e_decode.KIT = os.path.join(HERE, "data", "gpu-kit")
KIT_TOKENIZER = os.path.join(at.KIT, "llama8b-dummy")
SMALL = dict(agents=3, system_tokens=100, task_tokens=(5, 9), turns=(2, 4), tool_tokens=(10, 30), output_tokens=20,
             max_history=400, seed=3)



@pytest.fixture
def stand_ins(monkeypatch):
    """Modules that SGLang's benchmark client and chat endpoint import at module level but these tests never use,
    where not installed: Hugging Face datasets (the MMMU loader), jsonschema (tool-schema checks). For this test
    only: a stand-in in sys.modules makes importlib.util.find_spec raise for its name."""
    for name, module in (("datasets", types.SimpleNamespace(load_dataset=None)),
                         ("jsonschema", types.SimpleNamespace(Draft202012Validator=None, SchemaError=Exception))):
        if importlib.util.find_spec(name) is None:
            monkeypatch.setitem(sys.modules, name, module)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(KIT_TOKENIZER)


@pytest.fixture(scope="module")
def trace(tokenizer):
    return at.make_trace(tokenizer, **SMALL)


def stand_in_replies(tokenizer, conversation):
    return [" ".join([at.single_token_words(tokenizer)[0]] * SMALL["output_tokens"])] * len(conversation)


# ---------------------------------------------------------------------------------------------- trace
def test_trace_loads_in_sglangs_agentic_trace_loader(trace, tokenizer, tmp_path, stand_ins):
    from sglang.benchmark.datasets.agentic_trace import DEFAULT_AGENTIC_OUTPUT_LEN, AgenticTraceDataset
    from sglang.benchmark.serving import _normalize_round_messages

    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    rows = AgenticTraceDataset(dataset_path=str(path), num_requests=0, fixed_output_len=None, offset=0,
                               max_turns=None).load(tokenizer)
    assert len(rows) == SMALL["agents"]
    assert [len(r.prompt) for r in rows] == trace["metadata"]["turns_per_agent"]
    assert all(r.output_len == DEFAULT_AGENTIC_OUTPUT_LEN for r in rows)
    # bench_serving replays a row turn by turn iff its first round is a list of role/content messages.
    assert _normalize_round_messages(rows[0].prompt[0]) is not None
    for r in rows:
        assert [m["role"] for m in r.prompt[0]] == ["system", "user"]
        assert all([m["role"] for m in turn] == ["tool"] for turn in r.prompt[1:])
    systems = {r.prompt[0][0]["content"] for r in rows}
    assert len(systems) == 1  # one shared prompt for every agent


def test_trace_lengths_are_in_range_and_counted_by_the_tokenizer(trace, tokenizer):
    m, n = trace["metadata"], lambda text: len(tokenizer.encode(text, add_special_tokens=False))
    assert n(trace["conversations"][0][0]["messages"][0]["content"]) == SMALL["system_tokens"]
    for conversation, replies in zip(trace["conversations"], [stand_in_replies(tokenizer, c)
                                                               for c in trace["conversations"]]):
        assert 1 <= len(conversation) <= SMALL["turns"][1]
        assert SMALL["task_tokens"][0] <= n(conversation[0]["messages"][1]["content"]) <= SMALL["task_tokens"][1]
        history = []
        for t, turn in enumerate(conversation):
            if t:
                assert SMALL["tool_tokens"][0] <= n(turn["messages"][0]["content"]) <= SMALL["tool_tokens"][1]
                history.append({"role": "assistant", "content": replies[t - 1]})
            history += turn["messages"]
            whole = tokenizer.apply_chat_template(history, chat_template=at.CHAT_TEMPLATE, tokenize=False,
                                                  add_generation_prompt=True)
            assert turn["prompt_tokens"] == len(tokenizer.encode(whole))
        assert conversation[-1]["prompt_tokens"] + SMALL["output_tokens"] <= SMALL["max_history"]
    assert m["final_history_tokens"] == [c[-1]["prompt_tokens"] + SMALL["output_tokens"]
                                         for c in trace["conversations"]]


def test_max_history_cuts_agents_short(tokenizer):
    short = at.make_trace(tokenizer, **dict(SMALL, turns=(6, 6), max_history=250))
    assert all(2 <= len(c) < 6 for c in short["conversations"])
    assert max(short["metadata"]["final_history_tokens"]) <= 250


def test_trace_is_seeded(tokenizer, trace):
    assert at.make_trace(tokenizer, **SMALL) == trace
    assert at.make_trace(tokenizer, **dict(SMALL, seed=4)) != trace


def test_trace_rejects_a_history_too_short_for_the_first_turn(tokenizer):
    with pytest.raises(ValueError, match="--max-history 50"):
        at.make_trace(tokenizer, **dict(SMALL, max_history=50))


# ---------------------------------------------------------------------------------------------- radix replay
def test_cached_tokens_by_hand():
    r = np.arange
    primer = (r(40), r(500, 505))  # leaves 40 + 4 tokens in the cache, page-aligned: 32
    a = (np.concatenate([r(35), r(100, 125)]), r(600, 620))  # the primer's first 35 tokens, 32 of them cached
    b = (np.concatenate([a[0], a[1], r(700, 710)]), r(800, 803))  # a's 60 + 20 generated: 60 + 19 have KV -> 64
    c = (r(32), r(900, 901))  # all 32 in the cache, but the last prompt token is always computed: 16
    d = (r(1000, 1100), r(5, 9))  # nothing in common
    cached = at.cached_tokens([primer, a, b, c, d])
    assert cached == [0, 32, 64, 16, 0]
    assert at.reused_pages(cached) == 2 + 4 + 1


def _sglang_radix_cached(requests):
    """The same requests through SGLang's RadixCache (page size 16): match the prompt but its last token, then
    insert the prompt and all but the last generated token, page-aligned, as cache_finished_req does."""
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

    radix = RadixCache(CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=None,
                                       page_size=16))
    cached = []
    for prompt, generated in requests:
        key = RadixKey([int(x) for x in prompt[:-1]])
        cached.append(len(radix.match_prefix(MatchPrefixParams(key=key)).device_indices))
        seq = [int(x) for x in np.concatenate([prompt, generated[:-1]])]
        n = len(seq) // 16 * 16
        radix.insert(InsertParams(key=RadixKey(seq[:n]), value=torch.arange(n, dtype=torch.int64)))
    return cached


def test_cached_tokens_match_sglangs_radix_cache():
    rng = random.Random(0)
    left, requests = [], []
    for _ in range(60):  # prompts continuing earlier ones at random points, with few distinct token ids
        base = rng.choice(left) if left and rng.random() < 0.8 else []
        prompt = np.array(base[: rng.randint(0, len(base))] + [rng.randrange(4) for _ in range(rng.randint(1, 70))])
        generated = np.array([rng.randrange(4) for _ in range(rng.randint(1, 30))])
        requests.append((prompt, generated))
        left.append(list(prompt) + list(generated))
    assert at.cached_tokens(requests) == _sglang_radix_cached(requests)


def test_agent_expectation_replays_the_trace_as_sglangs_radix_cache_does(trace, tokenizer):
    encoder = at.PromptEncoder(tokenizer)
    reply = stand_in_replies(tokenizer, [None])[0]
    primer = at.History(encoder)
    for m in at.primer_messages(trace):
        primer.add(m)
    requests = [(primer.prompt(), encoder.encode_text(reply))]
    for c in trace["conversations"]:
        requests += at.conversation_requests(encoder, c, stand_in_replies(tokenizer, c))
    server = _sglang_radix_cached(requests)[1:]
    turns = sum(map(len, trace["conversations"]))
    result = {"generated_texts": [reply] * turns, "cached_tokens": server, "output_lens": [SMALL["output_tokens"]] * turns}
    got = serving.agent_expectation(encoder, trace, result, reply)
    assert got["expected_reused_pages"] == sum(c // 16 for c in server) == trace["metadata"]["expected_reused_pages"]
    assert (got["expected_reused_pages_most"], got["replies_not_reencoded"]) == (got["expected_reused_pages"], 0)
    assert (got["turns_off_expectation"], got["turns"], got["agents"]) == (0, turns, SMALL["agents"])
    assert got["max_prompt_tokens"] == max(len(p) for p, _ in requests)
    # The primer puts the shared prefix in the cache: every agent's first turn reuses its pages.
    first = np.cumsum([0] + [len(c) for c in trace["conversations"]])[:-1]
    assert [server[i] for i in first] == [trace["metadata"]["shared_pages"] * 16] * SMALL["agents"]
    assert trace["metadata"]["shared_prefix_tokens"] > SMALL["system_tokens"]
    off = serving.agent_expectation(encoder, trace, dict(result, cached_tokens=[0] * turns), reply)
    assert off["turns_off_expectation"] == turns


def test_agent_expectation_bounds_replies_that_do_not_reencode_to_their_ids(trace, tokenizer):
    """Replies generated as a word and an id that decodes to nothing in turn (what the kit's dummy models send):
    the server caches twice the ids that the next prompt holds. Its cached tokens lie between the replay's bounds,
    which differ."""
    encoder = at.PromptEncoder(tokenizer)
    silent = tokenizer.all_special_ids[0]
    assert tokenizer.decode([silent], skip_special_tokens=True) == ""
    primer = at.History(encoder)
    for m in at.primer_messages(trace):
        primer.add(m)
    requests = [(primer.prompt(), np.array([], dtype=np.int64))]
    texts = []
    for c in trace["conversations"]:
        replies = stand_in_replies(tokenizer, c)
        for prompt, words in at.conversation_requests(encoder, c, replies):
            requests.append((prompt, np.stack([words, np.full_like(words, silent)], axis=1).reshape(-1)))
        texts += replies
    server = _sglang_radix_cached(requests)[1:]
    turns = len(texts)
    result = {"generated_texts": texts, "cached_tokens": server, "output_lens": [2 * SMALL["output_tokens"]] * turns}
    got = serving.agent_expectation(encoder, trace, result, "")
    assert got["replies_not_reencoded"] == turns and got["turns_off_expectation"] == 0
    assert got["expected_reused_pages"] <= sum(c // 16 for c in server) <= got["expected_reused_pages_most"]
    assert got["expected_reused_pages"] < got["expected_reused_pages_most"]
    off = serving.agent_expectation(encoder, trace, dict(result, cached_tokens=[0] * turns), "")
    assert off["turns_off_expectation"] == turns


# ---------------------------------------------------------------------------------------------- commands
@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return serving.prepare_model("llama8b", str(tmp_path_factory.mktemp("m") / "llama8b-chat"))


def test_model_copy_has_the_chat_template_and_a_word_for_every_id(model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    assert tok.chat_template == at.CHAT_TEMPLATE
    assert tok.decode([128255, 999, 1000]) == "t128255 t999 t1000"


def test_sglangs_chat_endpoint_builds_the_prompts_the_replay_expects(model, trace, stand_ins):
    """SGLang's chat endpoint's own rendering (_apply_jinja_template; its constructor needs a running tokenizer
    manager, so the attributes the rendering reads are set here as SGLang's template manager sets them for the
    model copy) gives each turn's prompt ids as conversation_requests does."""
    from transformers import AutoTokenizer

    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.parser.conversation import get_conv_template_by_model_path
    from sglang.srt.parser.jinja_template_utils import detect_jinja_template_content_format
    from sglang.srt.parser.template_detection import detect_reasoning_pattern

    tok = AutoTokenizer.from_pretrained(model)
    # The template manager's choices: no template guessed from the path, so the tokenizer's; no reasoning tags.
    assert get_conv_template_by_model_path(model) is None and detect_reasoning_pattern(tok.chat_template)[1] is None
    chat = OpenAIServingChat.__new__(OpenAIServingChat)
    chat.tokenizer_manager = types.SimpleNamespace(tokenizer=tok)
    chat.template_manager = types.SimpleNamespace(
        jinja_template_content_format=detect_jinja_template_content_format(tok.chat_template), reasoning_config=None)
    chat.chat_encoding_spec, chat._tokenizer_auto_adds_specials = None, len(tok.encode("")) > 0
    conversation = trace["conversations"][0]
    rng = random.Random(0)
    replies = [" ".join(f"t{rng.randrange(3, 128256)}" for _ in range(5)) for _ in conversation]
    expected = at.conversation_requests(at.PromptEncoder(tok), conversation, replies)
    history = []
    for t, turn in enumerate(conversation):
        if t:
            history.append({"role": "assistant", "content": replies[t - 1]})
        history += turn["messages"]
        got = chat._apply_jinja_template(ChatCompletionRequest(model=model, messages=history), tools=None,
                                         is_multimodal=False)
        assert list(got.prompt_ids) == expected[t][0].tolist()
        assert list(got.prompt_ids) == tok.encode(tok.apply_chat_template(history, tokenize=False,
                                                                          add_generation_prompt=True))


def test_server_flags_are_the_same_but_locks_ones_and_parse(model):
    from sglang.srt.server_args import prepare_server_args

    fullkv, locks, prefiltered = (serving.server_flags(model, mode, 131072, 2048) for mode in serving.MODES)
    assert locks[:len(fullkv)] == fullkv and locks[len(fullkv):] == ["--enable-locks", "--locks-token-budget", "2048"]
    assert prefiltered[:len(locks)] == locks and prefiltered[len(locks):] == ["--locks-prefilter", "8",
                                                                              "--locks-prefilter-rank", "2"]
    load_sglang_plugins()
    parsed = [prepare_server_args(f + ["--device", "cpu"]) for f in (fullkv, locks, prefiltered)]
    for sa in parsed:
        assert (sa.page_size, sa.attention_backend, sa.load_format, sa.context_length) == (16, "flashinfer", "dummy",
                                                                                           131072)
        assert (sa.cuda_graph_max_bs_decode, sa.enable_metrics, sa.mem_fraction_static) == (64, True, 0.85)
        assert not sa.skip_tokenizer_init  # bench_serving sends text
        assert sa.kv_cache_dtype == "auto"
    assert parsed[0].locks_config is None and parsed[1].locks_config.token_budget == 2048
    assert (parsed[2].locks_config.prefilter, parsed[2].locks_config.prefilter_rank) == (8, 2)
    fp8 = [prepare_server_args(serving.server_flags(model, mode, 131072, 2048, "fp8_e4m3") + ["--device", "cpu"])
           for mode in ("fullkv", "locks")]
    assert [sa.kv_cache_dtype for sa in fp8] == ["fp8_e4m3", "fp8_e4m3"] and fp8[1].locks_config is not None


def _bench_args(cmd, monkeypatch):
    """bench_serving's own parser on cmd (its run replaced by capturing the arguments)."""
    import sglang.benchmark.serving as bench

    assert cmd[:3] == [sys.executable, "-m", "sglang.bench_serving"]
    got = {}
    monkeypatch.setattr(bench, "run_benchmark", lambda args: got.setdefault("args", args))
    monkeypatch.setattr(sys, "argv", ["bench_serving", *cmd[3:]])
    bench.cli_main()
    return got["args"]


def test_bench_commands_parse_with_sglangs_client(model, monkeypatch, stand_ins):
    gsp = serving.Case(serving.GSP, 8, 4, 8, 32768, 2048, 256)
    a = _bench_args(serving.bench_command(gsp, model, 30041, "out.jsonl", 1), monkeypatch)
    assert (a.backend, a.dataset_name, a.max_concurrency, a.num_prompts) == ("sglang", serving.GSP, 8, 32)
    assert (a.gsp_num_groups, a.gsp_prompts_per_group, a.gsp_system_prompt_len, a.gsp_question_len,
            a.gsp_output_len, a.gsp_range_ratio) == (4, 8, 32768, 2048, 256, 1.0)
    agent = serving.Case(serving.AGENTIC, 8, 1, 8, 32768, 2670, 220)
    b = _bench_args(serving.bench_command(agent, model, 30041, "out.jsonl", 1, "trace.json", 8), monkeypatch)
    assert (b.backend, b.dataset_name, b.dataset_path, b.num_prompts, b.sharegpt_output_len) == (
        "sglang-oai-chat", serving.AGENTIC, "trace.json", 8, 220)
    for args in (a, b):
        assert (args.host, args.port, args.model, args.tokenizer) == ("127.0.0.1", 30041, model, model)
        assert (args.warmup_requests, args.cache_report, args.output_details, args.output_file) == (0, True, True,
                                                                                                    "out.jsonl")
        assert not args.disable_ignore_eos  # every reply has the requested length


def test_gsp_cases_leave_out_more_concurrency_than_prompts():
    cases = serving.gsp_cases([100000], [(1, 32), (4, 8)], [32, 64], 2048, 256)
    assert [(c.groups, c.prompts_per_group, c.concurrency) for c in cases] == [(1, 32, 32), (4, 8, 32)]


def test_bad_case_lists_are_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        serving.parse_args(["--gsp-groups", "1x"])
    assert "--gsp-groups" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        serving.parse_args(["--modes", "dense"])
    assert "--modes" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- rows
def test_every_result_key_read_is_one_bench_serving_writes(stand_ins):
    import sglang.benchmark.serving as bench

    source = inspect.getsource(bench.benchmark)
    for key in (*serving.BENCH_KEYS, "cached_tokens", "generated_texts", "errors", "output_lens", "itls"):
        assert f'"{key}"' in source, key


SAMPLE = {"backend": "sglang", "dataset_name": serving.GSP, "completed": 4, "duration": 2.0,
          "total_output_tokens": 1024, "output_throughput": 512.0, "total_throughput": 2560.0,
          "median_ttft_ms": 310.0, "p99_ttft_ms": 7100.0, "median_itl_ms": 12.5, "p99_itl_ms": 30.0,
          "mean_itl_ms": 13.0, "cached_tokens": [0, 102400, 102400, 102415], "errors": ["", "", "", ""],
          "generated_texts": ["t5 t6"] * 4, "output_lens": [256] * 4,
          "itls": [[0.0375] * 85] * 4}  # a streamed chunk every 3 tokens
METRICS = """# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{is_streaming="true",model_name="m"} %d
sglang:prompt_tokens_created{is_streaming="true",model_name="m"} 1.7e9
sglang:cached_tokens_total{cache_source="device",model_name="m"} %d
"""


class FakeServer:
    def __init__(self, prompt, cached, locks):
        self.text, self.info = METRICS % (prompt, cached), {"internal_states": [{"locks": locks} if locks else {}]}

    def metrics(self):
        return self.text

    def server_info(self):
        return self.info


def test_row_fields_from_a_result_line_and_the_servers_counters(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(dict(SAMPLE, completed=1)) + "\n" + json.dumps(SAMPLE) + "\n")
    result = serving.read_result(str(path))  # the last line: bench_serving appends
    assert serving.bench_metrics(result) == dict({k: SAMPLE[k] for k in serving.BENCH_KEYS}, tokens_per_itl=3.0)
    locks = dict(built_pages=10, reused_pages=3, released_pages=0)
    before = serving.counters(FakeServer(1000, 100, locks))
    after = serving.counters(FakeServer(1000 + 4 * 104448, 100 + 307215, dict(locks, built_pages=6410,
                                                                               reused_pages=3 + 19200)))
    got = serving.server_deltas(before, after, result)
    assert got == dict(input_tokens=4 * 104448, cache_hit_rate=307215 / (4 * 104448),
                       total_throughput=(4 * 104448 + 1024) / 2.0, cached_pages=3 * 6400, built_pages=6400,
                       reused_pages=19200)
    fullkv = serving.server_deltas(serving.counters(FakeServer(0, 0, None)), serving.counters(FakeServer(10, 5, None)),
                                   result)
    assert (fullkv["built_pages"], fullkv["reused_pages"], fullkv["cache_hit_rate"]) == (None, None, 0.5)


def test_failed_or_missing_results_are_errors(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(dict(SAMPLE, errors=["", "Traceback ...\nValueError: boom\n", "", ""])) + "\n")
    with pytest.raises(RuntimeError, match="1 failed requests, first: ValueError: boom"):
        serving.read_result(str(path))
    path.write_text("")
    with pytest.raises(RuntimeError, match="no result"):
        serving.read_result(str(path))


def test_plot_draws_both_modes(tmp_path):
    rows = [dict(dataset=serving.GSP, shape="llama8b", mode=mode, concurrency=c, groups=1, prompts_per_group=32,
                 system_len=100000, output_throughput=t * c) for mode, t in (("fullkv", 10.0), ("locks", 50.0))
            for c in (8, 32)]
    rows.append(dict(rows[0], concurrency=1, output_throughput=None, error="boom"))
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"rows": rows}))
    out = serving.plot(str(path))
    assert out == str(tmp_path / "a.png")
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
