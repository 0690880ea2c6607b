"""Server throughput under shared-prefix and multi-turn agent load: stock FullKV vs --enable-locks, SGLang's client.

On the H200, from the repository root (after the kit's install, as benchmarks/h200_run.sh does):
    GIT_REV=$(git rev-parse --short HEAD) python3 benchmarks/agent_serving.py --out $OUT/agent_serving.json \
        --log-dir $OUT/agent_logs
    python3 benchmarks/agent_serving.py --plot $OUT/agent_serving.json        # -> $OUT/agent_serving.png

One ``sglang.launch_server`` process at a time on one GPU (dummy weights, loopback), per mode: FullKV is
``--attention-backend flashinfer --page-size 16``, LOCKS the same flags plus ``--enable-locks
--locks-token-budget 2048`` (``--modes locks_prefilter``: also ``--locks-prefilter 8
--locks-prefilter-rank 2``); all ``--context-length 131072 --mem-fraction-static 0.85
--cuda-graph-max-bs-decode 64 --disable-prefill-cuda-graph --enable-metrics`` and ``--kv-cache-dtype``
(``auto``; ``fp8_e4m3`` for both modes: each row's ``kv_cache_dtype``). Each case is one
``python -m sglang.bench_serving`` run against it, bounded by its prompt count and ``--run-timeout``:

* ``generated-shared-prefix``: SGLang's own generator, G groups x P prompts, each its group's system
  prompt + its own question, ``--backend sglang``;
* ``agentic-trace``: a trace written by agent_trace.py (default ``AGENT_TRACE``: 8 agents over one 32K
  system + tools prompt, 10-14 turns each adding 1-4K tokens of tool output, 220 output tokens a turn,
  histories of ~55-75K), replayed turn by turn through ``--backend sglang-oai-chat``, each reply fed back.

Model. A copy of the kit's dummy model folder (config and tokenizer; no weights exist) whose stand-in
tokenizer has one word per token id of the model's vocabulary (e2e_decode.full_vocab_model: the kit's
has 1000 and decodes the rest to nothing, and bench_serving counts a streamed token only when the text
grows), with agent_trace.CHAT_TEMPLATE added as ``chat_template`` to its tokenizer_config.json (SGLang's
chat endpoint renders the history with it; the kit's tokenizer has none). The tokenizer loads:
bench_serving sends text.

Each run: the radix cache flushed; one warm-up request of our own (shared prefix: 20,000 random tokens,
32 out, so that sparse steps and a chunked prefill on a cached prefix run before the measurement, see
docs/performance.md on the first server of a device call; agent trace: the shared system prompt alone,
32 out, so that every agent's first turn finds it cached whatever the order of the first turns); counters
read; bench_serving with ``--warmup-requests 0 --cache-report --output-details`` and ignore_eos (its
default: every reply has the requested length); counters read again. Row fields:

* from bench_serving's ``--output-file`` line: ``output_throughput`` (tok/s), ``median_ttft_ms``,
  ``p99_ttft_ms``, ``median_itl_ms``, ``p99_itl_ms``, ``completed``, ``duration`` (s),
  ``total_output_tokens``; ``tokens_per_itl``: the tokens an ITL spans (the client times a streamed chunk,
  and a chat stream sends one only when the text grows: 2 where every other id decodes to nothing);
* ``input_tokens``: the server's prompt tokens over the run (/metrics ``sglang:prompt_tokens_total``);
  ``total_throughput`` = (input_tokens + total_output_tokens) / duration (bench_serving's own counts no
  input tokens for a multi-turn replay);
* ``cache_hit_rate``: the server's cached / prompt tokens over the run (/metrics
  ``sglang:cached_tokens_total`` / ``sglang:prompt_tokens_total``; the gauge ``sglang:cache_hit_rate``
  holds only the last prefill batch's);
* ``cached_pages``: the sum of each request's (turn's) cached tokens // 16, as the server reported them to
  bench_serving; ``built_pages``, ``reused_pages``: the change of LOCKS's /server_info counters (null for
  FullKV), reused_pages counting exactly those cached pages;
* ``kv_capacity_tokens``: the KV pool (/server_info ``max_total_num_tokens``; LOCKS's summary store takes
  its share of the same memory), ``startup_s``: launch to /health;
* agent trace only: ``expected_reused_pages`` and ``expected_reused_pages_most``, agent_trace.cached_tokens'
  replay of the primer and every turn with the replies the server sent: the pages the trace implies, the
  fewest and the most where ``replies_not_reencoded`` replies' text re-encodes to other ids than the server
  generated (agent_expectation); ``turns_off_expectation``: turns whose reported cached tokens lie outside
  the replay's bounds; ``agents``, ``turns``, ``max_prompt_tokens``;
  ``system_len`` is the trace's system prompt, ``question_len`` its mean tool message (tokens, chat tag
  included);
* ``error`` where a run failed (its other results are left out).

The default cases (llama8b; shared prefix 1 x 32, system 100K, question 2K, output 256, at concurrency 32
and 8; the agent trace at concurrency 8) fit one device call. The issue's whole sweep (system 32K/64K/100K, 1 x 32 and 4 x 8, concurrency 1-64):
``--gsp-system-lens 32768,65536,100000 --gsp-groups 1x32,4x8 --gsp-concurrency 1,4,8,16,32,64``, split over
calls (by ``--gsp-system-lens``, ``--modes``, ``--shape glm4-9b-1m``, ``--agentic-concurrency ''`` to leave
the trace out) into one file with ``--append``; cases with more concurrency than prompts are left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from agent_trace import (CHAT_TEMPLATE, DEFAULTS as TRACE_DEFAULTS, History, PromptEncoder,  # noqa: E402
                         cached_tokens, conversation_requests, make_trace, primer_messages, reused_pages)
from e2e_decode import MODELS, full_vocab_model, header  # noqa: E402
from server_process import HOST, Server, random_prompts  # noqa: E402
from soak import metric  # noqa: E402

from sglang_locks.config import PAGE_SIZE  # noqa: E402

GSP, AGENTIC = "generated-shared-prefix", "agentic-trace"
MODES = ("fullkv", "locks", "locks_prefilter")
DEFAULT_MODES = ("fullkv", "locks")
MODE_MARKERS = {"fullkv": "o", "locks": "s", "locks_prefilter": "^"}
# locks_prefilter: --locks-prefilter F --locks-prefilter-rank R on top of locks (every page estimated from its
# centroid and first R ranks, F x budget pages a row scored in full).
PREFILTER, PREFILTER_RANK = 8, 2
DEFAULT_OUT = os.path.join(HERE, "results", "agent_serving.json")
AGENT_TRACE = dict(TRACE_DEFAULTS, agents=8, system_tokens=32768, turns=(10, 14), max_history=81920)
# 20,000 tokens: past the LOCKS budget and over two prefill chunks (8,192), the later ones on a cached prefix
WARMUP_TOKENS, WARMUP_OUTPUT = 20000, 32
BENCH_KEYS = ("completed", "duration", "total_output_tokens", "output_throughput", "median_ttft_ms", "p99_ttft_ms",
              "median_itl_ms", "p99_itl_ms")


@dataclasses.dataclass(frozen=True)
class Case:
    dataset: str
    concurrency: int
    groups: int = 1
    prompts_per_group: int = 0
    system_len: int = 0
    question_len: int = 0
    output_len: int = 0

    @property
    def name(self) -> str:
        if self.dataset == GSP:
            return f"gsp_{self.groups}x{self.prompts_per_group}_sys{self.system_len}_c{self.concurrency}"
        return f"agentic_c{self.concurrency}"


# ---------------------------------------------------------------------------------------------- commands
def prepare_model(shape: str, folder: str) -> str:
    """The shape's dummy model with a full-vocabulary stand-in tokenizer and CHAT_TEMPLATE. Returns the folder."""
    full_vocab_model(shape, folder)
    path = os.path.join(folder, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    with open(path, "w") as f:
        json.dump(dict(config, chat_template=CHAT_TEMPLATE), f, indent=1)
    return folder


def server_flags(model: str, mode: str, context_length: int, budget: int, kv_cache_dtype: str = "auto") -> List[str]:
    flags = ["--model-path", model, "--load-format", "dummy", "--attention-backend", "flashinfer", "--page-size",
             str(PAGE_SIZE), "--context-length", str(context_length), "--mem-fraction-static", "0.85",
             "--cuda-graph-max-bs-decode", "64", "--disable-prefill-cuda-graph", "--enable-metrics",
             "--kv-cache-dtype", kv_cache_dtype]
    if mode == "fullkv":
        return flags
    flags += ["--enable-locks", "--locks-token-budget", str(budget)]
    if mode == "locks_prefilter":
        flags += ["--locks-prefilter", str(PREFILTER), "--locks-prefilter-rank", str(PREFILTER_RANK)]
    return flags


def bench_command(case: Case, model: str, port: int, result_file: str, seed: int, trace: Optional[str] = None,
                  agents: int = 0) -> List[str]:
    cmd = [sys.executable, "-m", "sglang.bench_serving", "--host", HOST, "--port", str(port), "--model", model,
           "--tokenizer", model, "--max-concurrency", str(case.concurrency), "--warmup-requests", "0",
           "--cache-report", "--output-file", result_file, "--output-details", "--disable-tqdm", "--seed", str(seed)]
    if case.dataset == GSP:
        return cmd + ["--backend", "sglang", "--dataset-name", GSP, "--gsp-num-groups", str(case.groups),
                      "--gsp-prompts-per-group", str(case.prompts_per_group), "--gsp-system-prompt-len",
                      str(case.system_len), "--gsp-question-len", str(case.question_len), "--gsp-output-len",
                      str(case.output_len), "--num-prompts", str(case.groups * case.prompts_per_group)]
    return cmd + ["--backend", "sglang-oai-chat", "--dataset-name", AGENTIC, "--dataset-path", trace,
                  "--num-prompts", str(agents), "--sharegpt-output-len", str(case.output_len)]


def gsp_cases(system_lens, groups, concurrency, question_len: int, output_len: int) -> List[Case]:
    cases = []
    for s in system_lens:
        for g, p in groups:
            for c in concurrency:
                if c > g * p:
                    print(f"agent_serving: leaving out {g}x{p} at concurrency {c} (more than its {g * p} prompts)")
                    continue
                cases.append(Case(GSP, c, g, p, s, question_len, output_len))
    return cases


def agentic_cases(trace: dict, concurrency) -> List[Case]:
    m = trace["metadata"]
    return [Case(AGENTIC, c, 1, len(trace["conversations"]), m.get("system_tokens"), m.get("mean_tool_tokens"),
                 m["output_tokens"]) for c in concurrency]


def context_needed(cases: List[Case], trace: Optional[dict]) -> int:
    gsp = [c.system_len + c.question_len + c.output_len for c in cases if c.dataset == GSP]
    agentic = trace["metadata"]["final_history_tokens"] if trace and any(c.dataset == AGENTIC for c in cases) else []
    return max(gsp + agentic, default=0)


# ---------------------------------------------------------------------------------------------- results
def bench_metrics(result: dict) -> dict:
    """The row's fields from one bench_serving --output-file line."""
    itls = sum(map(len, result["itls"]))
    steps = sum(result["output_lens"]) - len(result["output_lens"])  # decode steps after each first token
    return dict({k: result[k] for k in BENCH_KEYS}, tokens_per_itl=steps / itls if itls else None)


def counters(server: Server) -> dict:
    text, info = server.metrics(), server.server_info()
    return dict(prompt=metric(text, "sglang:prompt_tokens_total"), cached=metric(text, "sglang:cached_tokens_total"),
                locks=info["internal_states"][0].get("locks"))


def server_deltas(before: dict, after: dict, result: dict) -> dict:
    prompt, cached = after["prompt"] - before["prompt"], after["cached"] - before["cached"]
    locks = {k: (after["locks"][k] - before["locks"][k]) if after["locks"] else None
             for k in ("built_pages", "reused_pages")}
    return dict(input_tokens=int(prompt), cache_hit_rate=cached / prompt if prompt else None,
                total_throughput=(prompt + result["total_output_tokens"]) / result["duration"],
                cached_pages=sum(c // PAGE_SIZE for c in result["cached_tokens"]), **locks)


def agent_expectation(encoder: PromptEncoder, trace: dict, result: dict, primer_reply: str) -> dict:
    """The replay of the primer and every turn, with the replies the server sent (bench_serving lists the turns
    conversation by conversation), against the cached tokens the server reported per turn.

    The server caches a reply's generated ids, which the client does not return; the next prompt holds its text
    re-encoded. Where the text re-encodes to as many ids as were generated (``output_lens``) the replay takes it
    for them; where not, it replays twice: with ids no prompt holds (the fewest pages the turn can find cached)
    and with the re-encoded text (the most). A turn is off the expectation outside those bounds."""
    primer = History(encoder)
    for m in primer_messages(trace):
        primer.add(m)
    most = [(primer.prompt(), encoder.encode_text(primer_reply))]
    fewest, at, not_reencoded = list(most), 0, 0
    unknown = -1  # stand-ins for ids the client does not see: negative, so no prompt holds them
    for conversation in trace["conversations"]:
        replies = result["generated_texts"][at:at + len(conversation)]
        for (prompt, reencoded), generated in zip(conversation_requests(encoder, conversation, replies),
                                                  result["output_lens"][at:at + len(conversation)]):
            most.append((prompt, reencoded))
            if len(reencoded) == generated:
                fewest.append((prompt, reencoded))
            else:
                fewest.append((prompt, np.arange(unknown, unknown - generated, -1)))
                unknown, not_reencoded = unknown - generated, not_reencoded + 1
        at += len(conversation)
    low, high = cached_tokens(fewest)[1:], cached_tokens(most)[1:]
    return dict(expected_reused_pages=reused_pages(low), expected_reused_pages_most=reused_pages(high),
                replies_not_reencoded=not_reencoded, agents=len(trace["conversations"]), turns=at,
                turns_off_expectation=sum(not lo <= c <= hi for lo, hi, c in zip(low, high, result["cached_tokens"])),
                max_prompt_tokens=max(len(p) for p, _ in most))


def read_result(path: str) -> dict:
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    if not lines:
        raise RuntimeError(f"bench_serving wrote no result to {path}")
    result = json.loads(lines[-1])
    failed = [e for e in result.get("errors", []) if e]
    if failed:
        raise RuntimeError(f"{len(failed)} failed requests, first: {failed[0].strip().splitlines()[-1]}")
    return result


# ---------------------------------------------------------------------------------------------- runs
def warm_up(server: Server, case: Case, model: str, trace: Optional[dict], seed: int) -> Optional[str]:
    """The run's warm-up request; returns the agent primer's reply."""
    if case.dataset == GSP:
        server.generate(random_prompts(seed, [WARMUP_TOKENS])[0], WARMUP_OUTPUT)
        return None
    body = dict(model=model, messages=primer_messages(trace), max_tokens=WARMUP_OUTPUT, temperature=0,
                ignore_eos=True)
    with server.post("/v1/chat/completions", body) as r:
        return json.loads(r.read())["choices"][0]["message"]["content"] or ""


def run_case(server: Server, case: Case, base: dict, args, model: str, trace_path: Optional[str],
             trace: Optional[dict], encoder: Optional[PromptEncoder]) -> dict:
    name = f"{base['shape']}_{base['mode']}_{case.name}"
    result_file = os.path.join(args.log_dir, f"bench_{name}.jsonl")
    cmd = bench_command(case, model, args.port, result_file, args.seed, trace_path,
                        len(trace["conversations"]) if trace else 0)
    try:
        with server.post("/flush_cache?timeout=60", {}):
            pass
        primer_reply = warm_up(server, case, model, trace, args.seed)
        before = counters(server)
        with open(os.path.join(args.log_dir, f"bench_{name}.log"), "w") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.run_timeout)
        if done.returncode:
            raise RuntimeError(f"bench_serving exited {done.returncode}; see {log.name}")
        after, result = counters(server), read_result(result_file)
        row = dict(base, **bench_metrics(result), **server_deltas(before, after, result))
        if case.dataset == AGENTIC:
            row.update(agent_expectation(encoder, trace, result, primer_reply))
    except Exception as e:  # noqa: BLE001 - one failed case is a row with its error, the others still run
        row = dict(base, error=f"{type(e).__name__}: {e}")
    print(f"agent_serving: {name}: " + (row.get("error") or f"{row['output_throughput']:.0f} tok/s out, median "
          f"ITL {row['median_itl_ms']:.2f} ms, median TTFT {row['median_ttft_ms']:.0f} ms"), flush=True)
    return row


def base_row(case: Case, shape: str, mode: str, kv_cache_dtype: str = "auto") -> dict:
    return dict(dataset=case.dataset, shape=shape, mode=mode, kv_cache_dtype=kv_cache_dtype,
                concurrency=case.concurrency, groups=case.groups,
                prompts_per_group=case.prompts_per_group, system_len=case.system_len,
                question_len=case.question_len, output_len=case.output_len)


def run_server(shape: str, mode: str, cases: List[Case], args, model: str, trace_path, trace, encoder,
               emit) -> None:
    """One server for all cases of a mode; emit(row) after each case."""
    bases = [base_row(c, shape, mode, args.kv_cache_dtype) for c in cases]
    try:
        server = Server(f"{shape}_{mode}", args.port,
                        server_flags(model, mode, args.context_length, args.budget, args.kv_cache_dtype),
                        args.log_dir, ready_timeout=args.ready_timeout)
    except RuntimeError as e:
        for b in bases:
            emit(dict(b, error=str(e)))
        return
    try:
        extra = dict(kv_capacity_tokens=server.server_info()["max_total_num_tokens"], startup_s=server.startup_s)
        for c, b in zip(cases, bases):
            emit(run_case(server, c, dict(b, **extra), args, model, trace_path, trace, encoder))
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------- plot
def plot(json_path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(json_path) as f:
        rows = [r for r in json.load(f)["rows"] if r.get("output_throughput") is not None]
    series = {}
    for r in rows:
        key = (r["dataset"], r["shape"], r["system_len"], r["groups"], r["prompts_per_group"],
               r.get("kv_cache_dtype", "auto"))
        series.setdefault(key, {}).setdefault(r["mode"], []).append((r["concurrency"], r["output_throughput"]))
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (key, modes) in enumerate(sorted(series.items(), key=str)):
        dataset, shape, system_len, groups, prompts, kv_dtype = key
        label = (f"{shape} {'agents' if dataset == AGENTIC else f'{groups}x{prompts}'} sys {system_len}"
                 + ("" if kv_dtype == "auto" else f" {kv_dtype}"))
        for mode, points in sorted(modes.items()):
            x, y = zip(*sorted(points))
            # markers as well as line styles: a case run at one concurrency is a point, not a line
            ax.plot(x, y, marker=MODE_MARKERS[mode], color=f"C{i % 10}", linestyle="-" if mode == "fullkv" else "--",
                    label=f"{label} {mode}")
    ticks = sorted({r["concurrency"] for r in rows})
    ax.set_xscale("log", base=2)
    ax.set(xticks=ticks, xticklabels=[str(t) for t in ticks], xlabel="concurrency (bench_serving --max-concurrency)",
           ylabel="output throughput (tok/s)", title="SGLang server: FullKV (solid, o) vs LOCKS (dashed)")
    ax.minorticks_off()
    ax.legend(fontsize=7)
    out = os.path.splitext(json_path)[0] + ".png"
    fig.savefig(out, dpi=120, bbox_inches="tight")
    return out


# ---------------------------------------------------------------------------------------------- main
def _ints(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def _groups(text: str) -> List[tuple]:
    try:
        pairs = [tuple(int(x) for x in g.split("x")) for g in text.split(",") if g.strip()]
    except ValueError:
        pairs = [()]
    if any(len(p) != 2 or min(p) < 1 for p in pairs):
        raise argparse.ArgumentTypeError(f"expected GROUPSxPROMPTS[,...] with both >= 1, e.g. 1x32,4x8, got {text!r}")
    return pairs


def _modes(text: str) -> List[str]:
    modes = [m for m in text.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(MODES)}, got {text!r}")
    return modes


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--plot", metavar="JSON", help="only draw JSON's output throughput vs concurrency next to it (.png)")
    p.add_argument("--shape", choices=sorted(MODELS), default="llama8b")
    p.add_argument("--modes", type=_modes, default=list(DEFAULT_MODES),
                   help=f"a comma-separated subset of {','.join(MODES)} (default {','.join(DEFAULT_MODES)})")
    p.add_argument("--gsp-system-lens", type=_ints, default=[100000], help="system prompt tokens, e.g. 32768,100000")
    p.add_argument("--gsp-groups", type=_groups, default=[(1, 32)], help="GROUPSxPROMPTS per group, e.g. 1x32,4x8")
    p.add_argument("--gsp-concurrency", type=_ints, default=[32, 8])
    p.add_argument("--gsp-question-len", type=int, default=2048)
    p.add_argument("--gsp-output-len", type=int, default=256)
    p.add_argument("--agentic-concurrency", type=_ints, default=[8], help="'' leaves the agent trace out")
    p.add_argument("--trace", help="an agent_trace.py trace (default: one of agent_serving.AGENT_TRACE, written "
                                   "with the model copy's tokenizer)")
    p.add_argument("--context-length", type=int, default=131072)
    p.add_argument("--budget", type=int, default=2048, help="--locks-token-budget")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "bf16", "fp8_e4m3"],
                   help="both modes' --kv-cache-dtype (FullKV fp8 is the baseline of LOCKS fp8)")
    p.add_argument("--port", type=int, default=30041)
    p.add_argument("--seed", type=int, default=1, help="bench_serving's --seed and the warm-up prompt's")
    p.add_argument("--run-timeout", type=int, default=420, help="seconds per bench_serving run")
    p.add_argument("--ready-timeout", type=int, default=600, help="seconds for a server to come up")
    p.add_argument("--log-dir", help="server and bench_serving logs and result lines (default: a temporary folder)")
    p.add_argument("--append", action="store_true", help="keep --out's rows and add this call's (a sweep split over "
                                                         "calls, e.g. one per shape)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, start nothing")
    args = p.parse_args(argv)
    if args.gsp_question_len < 1 or args.gsp_output_len < 1:
        p.error("--gsp-question-len and --gsp-output-len must be >= 1")
    return p, args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p, args = parse_args(argv)
    if args.plot:
        print(f"agent_serving: wrote {plot(args.plot)}")
        return 0
    scratch = tempfile.mkdtemp(prefix="agent_serving_")  # the model copy and the trace
    args.log_dir = args.log_dir or os.path.join(scratch, "logs")
    os.makedirs(args.log_dir, exist_ok=True)
    model = prepare_model(args.shape, os.path.join(scratch, f"{args.shape}-chat"))
    cases = gsp_cases(args.gsp_system_lens, args.gsp_groups, args.gsp_concurrency, args.gsp_question_len,
                      args.gsp_output_len)
    trace = trace_path = encoder = None
    if args.agentic_concurrency:
        from transformers import AutoTokenizer

        encoder = PromptEncoder(AutoTokenizer.from_pretrained(model))
        trace_path = args.trace or os.path.join(scratch, "agent_trace.json")
        if args.trace:
            with open(args.trace) as f:
                trace = json.load(f)
        else:
            trace = make_trace(encoder.tokenizer, **AGENT_TRACE)
            with open(trace_path, "w") as f:
                json.dump(trace, f)
        cases += agentic_cases(trace, args.agentic_concurrency)
    needed = context_needed(cases, trace)
    if needed > args.context_length:
        p.error(f"--context-length {args.context_length}: the cases need {needed} tokens")
    if args.dry_run:
        for mode in args.modes:
            print(" ".join(["python -m sglang.launch_server", *server_flags(model, mode, args.context_length,
                                                                           args.budget, args.kv_cache_dtype)]))
        for c in cases:
            print(" ".join(bench_command(c, model, args.port, f"bench_{c.name}.jsonl", args.seed, trace_path,
                                         len(trace["conversations"]) if trace else 0)))
        return 0
    head = dict(header(argv), command=" ".join(["python", "benchmarks/agent_serving.py", *argv]))
    rows = []
    if args.append and os.path.exists(args.out):
        with open(args.out) as f:
            old = json.load(f)
        head["command"], rows = f"{old['command']} ; {head['command']}", old["rows"]

    def emit(row: dict) -> None:  # written after every run: a call cut off by its time limit keeps what it did
        rows.append(row)
        with open(args.out, "w") as f:
            json.dump(dict(head, rows=rows), f, indent=1)

    for mode in args.modes:
        t0 = time.time()
        run_server(args.shape, mode, cases, args, model, trace_path, trace, encoder, emit)
        print(f"agent_serving: {args.shape} {mode}: {time.time() - t0:.0f} s", flush=True)
    print(f"agent_serving: wrote {args.out}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
