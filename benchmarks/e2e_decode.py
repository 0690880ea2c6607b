"""End-to-end decode latency inside SGLang: FullKV (FlashInfer, page size 16) vs --enable-locks.

    python benchmarks/e2e_decode.py --out $OUT/e2e_decode.json [--only bench_one_batch|synthetic] [--dry-run]

Four tools, all with dummy weights:

* ``bench_one_batch``: ``python -m sglang.bench_one_batch`` itself (prefill, then
  decode; median decode step), started after ``load_plugins()`` because
  bench_one_batch does not load plugins on its own.
* ``synthetic``: for contexts whose prefill is too slow or too big to run
  (512K+), bench_one_batch's own model loading, extend and decode functions,
  but the context is handed to the request as a cached prefix
  (``req.prefix_indices``, the way a radix-cache hit arrives) whose KV pages
  and summaries are filled with random values; only the last 16 tokens are
  prefilled. Its 128K rows are there to compare with bench_one_batch's.
* ``interleaved``: the synthetic tool in one ``--enable-locks`` process whose
  decode steps alternate, in blocks of 8, between LOCKS and FlashInfer's own
  dense decode (the plugin's DENSE graph variant, forced per step through the
  backend's ``min_step_tokens``): ``fullkv_ms`` is the median of the dense
  steps; the worker's result keeps every step's time (``step_ms``). Both
  sides share one process, memory layout and machine state, so their ratio
  does not carry the 2-5 % (machines: more) by which separate processes'
  steps move. The dense steps are stock SGLang's decode but for LOCKS's
  per-step host bookkeeping. A decode seal's summary build runs at the start
  of the step after it, every 16th step, which with blocks of 8 and the
  plan's contexts (multiples of 16) is always a LOCKS step: the medians skip
  those steps, but the LOCKS mean counts them twice as often as a LOCKS-only
  process does. Measured on one H200, both medians came within 1.2 % of
  ``synthetic``'s separate processes (docs/performance.md).
* ``bench_serving``: ``python -m sglang.bench_serving`` (random token ids,
  ``--max-concurrency`` = batch, one warm-up request) against
  ``sglang.launch_server``: what a user of the server sees, the overlap
  scheduler included, which hides host work behind the GPU (the two tools
  above wait for each step). Its times are the median inter-token latency.

Each (model, mode, batch) runs in its own process (interleaved: one process for both); rows with a failure carry
``error``. Output: header ``gpu``, ``git``, ``date``, ``command``; ``rows`` with
``shape``, ``batch``, ``context``, ``budget``, ``fullkv_ms``, ``locks_ms``,
``speedup`` (median decode step), ``fullkv_mean_ms``, ``locks_mean_ms``,
``speedup_mean`` (synthetic: the mean step, which counts the steps that
summarise decode-sealed pages; bench_serving: the mean inter-token latency;
bench_one_batch reports none), ``tool``. A case given more than once (``--case A --case B --case A
--case B``: processes alternate, so machine drift spreads over both) also gets a ``summary`` row per
(tool, shape, batch, context, LOCKS flags): ``samples``, the medians ``fullkv_ms`` and ``locks_ms``
over its samples, ``speedup`` (of the medians) and the per-sample ``speedup_min`` / ``speedup_max``:
FullKV's step moves by 2-5 % from process to process on the H200.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
KIT = os.path.join(os.path.dirname(HERE), ".gpu-kit")
MODELS = {"llama8b": "llama8b-dummy", "glm4-9b-1m": "glm4-9b-1m-dummy"}
K = 1024
# (tool, shape, batch, contexts)
PLAN = [
    ("bench_one_batch", "llama8b", 1, [32 * K, 128 * K, 256 * K]),
    ("bench_one_batch", "llama8b", 4, [32 * K, 128 * K]),
    ("bench_one_batch", "glm4-9b-1m", 1, [256 * K]),
    # 8K-128K (GLM): where LOCKS stops paying off (fixed per-layer costs vs a short dense read).
    ("synthetic", "llama8b", 1, [8 * K, 16 * K, 32 * K, 128 * K, 256 * K]),
    ("synthetic", "llama8b", 4, [32 * K, 128 * K]),
    # 1M - 1K: the server's --context-length (context + HEADROOM) may not pass GLM's 1M positions.
    ("synthetic", "glm4-9b-1m", 1, [32 * K, 64 * K, 128 * K, 256 * K, 512 * K, 1023 * K]),
    ("interleaved", "llama8b", 1, [128 * K, 256 * K]),
    ("interleaved", "llama8b", 4, [128 * K]),
    ("interleaved", "glm4-9b-1m", 1, [1023 * K]),
    ("bench_serving", "llama8b", 1, [32 * K, 128 * K, 256 * K]),
    ("bench_serving", "llama8b", 4, [32 * K]),
]
OUTPUT_LEN = 32
# interleaved: steps of one variant in a row. Alternating every step measured LOCKS's steps 3-10 % slower
# than a LOCKS-only process on the same H200 (dense steps: within 3 % of FullKV's).
INTERLEAVE_BLOCK = 8
SERVING_OUTPUT_LEN = 128  # tokens per request: inter-token latencies to take the median of
SERVER_PORT = 30021
HEADROOM = 1024  # --context-length beyond the longest context: the decoded tokens
LOAD_PLUGINS_THEN = "from sglang.srt.plugins import load_plugins; load_plugins(); import runpy; runpy.run_module({!r}, run_name='__main__')"


def sglang_flags(shape: str, mode: str, batch: int, max_context: int, budget: int, locks_args: tuple = (),
                 model: str = None, kv_cache_dtype: str = "auto") -> list:
    """model: another folder for the shape's (default: the kit's dummy model); kv_cache_dtype: both modes'."""
    flags = ["--model-path", model or os.path.join(KIT, MODELS[shape]), "--load-format", "dummy",
             "--context-length", str(max_context + HEADROOM), "--mem-fraction-static", "0.8",
             "--disable-prefill-cuda-graph", "--cuda-graph-max-bs-decode", str(batch),
             "--kv-cache-dtype", kv_cache_dtype]
    if mode == "locks":
        return flags + ["--enable-locks", "--locks-token-budget", str(budget), *locks_args]
    return flags + ["--attention-backend", "flashinfer", "--page-size", "16"]


def command(tool: str, shape: str, mode: str, batch: int, contexts: list, budget: int, result: str,
            profile_dir: str = None, locks_args: tuple = (), kv_cache_dtype: str = "auto") -> list:
    flags = sglang_flags(shape, mode, batch, max(contexts), budget, locks_args, kv_cache_dtype=kv_cache_dtype)
    if tool == "bench_one_batch":
        return [sys.executable, "-c", LOAD_PLUGINS_THEN.format("sglang.bench_one_batch"), *flags,
                "--batch-size", str(batch), "--input-len", *map(str, contexts), "--output-len", str(OUTPUT_LEN),
                "--run-name", mode, "--result-filename", result]
    profile = ["--profile-dir", profile_dir, "--profile-tag", f"{shape}_bs{batch}_{max(contexts)}_{mode}"] if profile_dir else []
    interleave = ["--interleave"] if tool == "interleaved" else []
    return [sys.executable, os.path.abspath(__file__), "--synthetic-worker", "--result", result,
            "--batch", str(batch), "--contexts", ",".join(map(str, contexts)), *profile, *interleave, "--", *flags]


def full_vocab_model(shape: str, folder: str) -> str:
    """The kit's dummy model with a stand-in tokenizer of one word per token id of the model's vocabulary
    (the kit's has 1000 and decodes the others to nothing: bench_serving counts a streamed token only
    when the text grows). Returns the model folder."""
    src = os.path.join(KIT, MODELS[shape])
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(src):
        if name != "tokenizer.json":
            shutil.copyfile(os.path.join(src, name), os.path.join(folder, name))
    with open(os.path.join(src, "tokenizer.json")) as f:
        tokenizer = json.load(f)
    with open(os.path.join(src, "config.json")) as f:
        vocab_size = json.load(f)["vocab_size"]
    vocab = tokenizer["model"]["vocab"]
    vocab.update({f"t{i}": i for i in range(len(vocab), vocab_size)})
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)
    return folder


def serving_commands(shape: str, mode: str, batch: int, contexts: list, budget: int, locks_args: tuple, model: str,
                     port: int = SERVER_PORT, rounds: int = 2, warmup: int = 1, kv_cache_dtype: str = "auto") -> tuple:
    """(launch_server command, {context: bench_serving command minus its --output-file}); model: the
    shape's full_vocab_model folder. rounds: requests per concurrent slot; warmup: bench_serving's warm-up
    requests (each a prefill of the whole context: at 256K about a minute on the H200)."""
    flags = sglang_flags(shape, mode, batch, max(contexts), budget, locks_args, model, kv_cache_dtype)
    server = [sys.executable, "-m", "sglang.launch_server", *flags, "--host", "127.0.0.1", "--port", str(port)]
    clients = {c: [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--host", "127.0.0.1",
                   "--port", str(port), "--model", model, "--tokenizer", model, "--dataset-name", "random-ids",
                   "--tokenize-prompt", "--random-input-len", str(c), "--random-output-len", str(SERVING_OUTPUT_LEN),
                   "--random-range-ratio", "1", "--num-prompts", str(rounds * batch), "--max-concurrency", str(batch),
                   "--warmup-requests", str(warmup), "--disable-tqdm"] for c in contexts}
    return server, clients


def run_serving(server: list, clients: dict, result: str, timeout: int) -> tuple:
    """Start the server, run bench_serving per context, append its median / mean inter-token latency
    (seconds) to result as read_step_times reads them. Returns (log, exit status)."""
    log, status = [], 0
    t0 = time.time()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(server, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            while not _healthy(server[server.index("--port") + 1]):
                if proc.poll() is not None or time.time() - t0 > timeout:
                    log.append("server did not come up")
                    return "\n".join(log), proc.returncode or 1
                time.sleep(2)
            for context, cmd in clients.items():
                with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as f:
                    metrics = f.name
                try:
                    client = subprocess.run([*cmd, "--output-file", metrics], capture_output=True, text=True,
                                            timeout=max(1, timeout - (time.time() - t0)))
                except subprocess.TimeoutExpired:
                    log.append(" ".join(cmd) + f"\ntimed out after {timeout} s")
                    return "\n".join(log), 124
                log.append(" ".join(cmd) + "\n" + client.stdout + client.stderr)
                with open(metrics) as f:
                    lines = [json.loads(line) for line in f if line.strip()]
                os.unlink(metrics)
                if client.returncode or not lines or not lines[-1].get("completed"):
                    status = client.returncode or 1
                    continue
                m = lines[-1]
                with open(result, "a") as f:
                    f.write(json.dumps(dict(input_len=context, median_decode_latency=m["median_itl_ms"] / 1000,
                                            mean_decode_latency=m["mean_itl_ms"] / 1000)) + "\n")
        finally:
            _stop(proc)
            log.insert(0, " ".join(server) + "\n" + _server_log(out))
    return "\n".join(log), status


def _stop(proc) -> None:
    """SIGTERM to the server's process group (its scheduler and detokenizer too), SIGKILL after a minute."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone
        pass


def _healthy(port: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001 - not up yet
        return False


def _server_log(out) -> str:
    out.seek(0)
    return out.read()


def read_step_times(result: str, prefix: str = "") -> dict:
    """context -> (median, mean) decode ms/step from bench_one_batch's jsonl (no mean there: None)
    or the synthetic worker's; prefix "dense_": an interleaved worker's dense steps."""
    out = {}
    if not os.path.exists(result):
        return out
    with open(result) as f:
        for line in f:
            r = json.loads(line)
            mean = r.get(prefix + "mean_decode_latency")
            out[int(r["input_len"])] = (1000 * float(r[prefix + "median_decode_latency"]),
                                        None if mean is None else 1000 * float(mean))
    return out


def merge_rows(tool: str, shape: str, batch: int, contexts: list, budget: int, fullkv: dict, locks: dict,
               errors: dict) -> list:
    def ratio(a, b):
        return round(a / b, 3) if a and b else None

    rows = []
    for c in contexts:
        (f, f_mean), (l, l_mean) = fullkv.get(c, (None, None)), locks.get(c, (None, None))
        row = dict(shape=shape, batch=batch, context=c, budget=budget, fullkv_ms=f, locks_ms=l, speedup=ratio(f, l),
                   fullkv_mean_ms=f_mean, locks_mean_ms=l_mean, speedup_mean=ratio(f_mean, l_mean), tool=tool)
        if f is None or l is None:
            row["error"] = "; ".join(f"{m}: {e}" for m, e in errors.items()) or "no result"
        rows.append(row)
    return rows


def summarize(rows: list) -> list:
    """One row per (tool, shape, batch, context, locks_args, kv_cache_dtype) measured more than once without error:
    medians over its samples, the speed-up of the medians and the range of the samples' speed-ups."""
    groups = {}
    for r in rows:
        if "error" not in r:
            key = (r["tool"], r["shape"], r["batch"], r["context"], r.get("locks_args", ""),
                   r.get("kv_cache_dtype", "auto"))
            groups.setdefault(key, []).append(r)
    out = []
    for (tool, shape, batch, context, locks_args, kv_cache_dtype), rs in groups.items():
        if len(rs) < 2:
            continue
        f = statistics.median(r["fullkv_ms"] for r in rs)
        l = statistics.median(r["locks_ms"] for r in rs)
        out.append(dict(tool=tool, shape=shape, batch=batch, context=context, budget=rs[0]["budget"],
                        locks_args=locks_args, kv_cache_dtype=kv_cache_dtype, samples=len(rs), fullkv_ms=f,
                        locks_ms=l, speedup=round(f / l, 3),
                        speedup_min=min(r["speedup"] for r in rs), speedup_max=max(r["speedup"] for r in rs)))
    return out


def selected_cases(only, cases) -> list:
    """PLAN rows picked by --only / --case TOOL:SHAPE:BATCH[:CTX,CTX...] (contexts: a subset of the row's).

    Each --case is its own run, in its own processes sized for its longest
    context: `--case synthetic:llama8b:1:131072 --case synthetic:llama8b:1:262144`
    measures 128K on a 129K-context server and 256K on a 257K one.
    """
    if not cases:
        return [row for row in PLAN if not only or row[0] == only]
    picked = []
    for case in cases:
        tool, shape, batch, *ctx = case.split(":")
        rows = [row for row in PLAN if row[:3] == (tool, shape, int(batch)) and (not only or tool == only)]
        if not rows:
            raise ValueError(f"--case {case}: no such TOOL:SHAPE:BATCH in the plan")
        contexts = rows[0][3]
        if ctx:
            want = set(map(int, ctx[0].split(",")))
            unplanned = want - set(contexts)
            if unplanned:
                raise ValueError(f"--case {case}: contexts {sorted(unplanned)} are not in the plan; "
                                 f"they must be among {contexts}")
            contexts = [c for c in contexts if c in want]
        picked.append((tool, shape, int(batch), contexts))
    return picked


def run_plan(args, save=lambda rows: None) -> list:
    """Rows of every selected case; save(rows) after each case, so that a run cut short (a time
    limit) keeps the cases it finished."""
    with tempfile.TemporaryDirectory(prefix="locks_e2e_") as scratch:
        return _run_cases(args, save, scratch)


def _run_cases(args, save, scratch: str) -> list:
    rows = []
    for n, (tool, shape, batch, contexts) in enumerate(selected_cases(args.only, args.case)):
        times, errors = {}, {}
        if tool == "bench_serving":
            model = full_vocab_model(shape, os.path.join(scratch, shape))
        # interleaved: one LOCKS process measures both sides
        for mode in ("locks",) if tool == "interleaved" else ("fullkv", "locks"):
            with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as f:
                result = f.name
            os.unlink(result)
            locks_args = tuple(args.locks_args.split())
            if tool == "bench_serving":
                cmd = serving_commands(shape, mode, batch, contexts, args.budget, locks_args, model,
                                       rounds=args.serving_rounds, warmup=args.serving_warmup,
                                       kv_cache_dtype=args.kv_cache_dtype)
                print("e2e_decode:", " ".join(cmd[0]), "; then per context:", " ".join(next(iter(cmd[1].values()))),
                      flush=True)
            else:
                cmd = command(tool, shape, mode, batch, contexts, args.budget, result,
                              args.log_dir if args.profile else None, locks_args, args.kv_cache_dtype)
                print("e2e_decode:", " ".join(cmd), flush=True)
            if args.dry_run:
                times[mode] = times["fullkv"] = {}
                continue
            t0 = time.time()
            if tool == "bench_serving":
                log, returncode = run_serving(*cmd, result, args.timeout)
            else:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                log, returncode = proc.stdout + proc.stderr, proc.returncode
            if args.log_dir:
                # The case's position keeps a case repeated in one run from overwriting its logs.
                name = f"{n}_{tool}_{shape}_bs{batch}_{max(contexts)}_{mode}.log"
                with open(os.path.join(args.log_dir, name), "w") as f:
                    f.write(log)
            times[mode] = read_step_times(result)
            if tool == "interleaved":
                times["fullkv"] = read_step_times(result, "dense_")
            if returncode:
                errors[mode] = f"exit {returncode}: {log.strip().splitlines()[-1] if log.strip() else ''}"
            print(f"e2e_decode: {tool} {shape} bs={batch} {mode}: {times[mode]} ({time.time() - t0:.0f} s)",
                  flush=True)
        case_rows = merge_rows(tool, shape, batch, contexts, args.budget, times["fullkv"], times["locks"], errors)
        rows += [dict(r, locks_args=args.locks_args, kv_cache_dtype=args.kv_cache_dtype) for r in case_rows]
        save(rows)
    return rows


def header(argv) -> dict:
    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except Exception:  # noqa: BLE001 - no GPU / no git on a CPU dry run
            return ""

    return dict(gpu=sh(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]) or "none",
                git=os.environ.get("GIT_REV") or sh(["git", "rev-parse", "--short", "HEAD"]),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                command=" ".join(["python", "benchmarks/e2e_decode.py", *argv]))


# ---------------------------------------------------------------------- synthetic worker
def synthetic_worker(args, sglang_argv) -> None:
    """Decode steps on a context given as a cached prefix of random KV (and random summaries)."""
    import torch
    from sglang.benchmark import one_batch as ob
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import PortArgs, ServerArgs

    load_plugins()
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    server_args = ServerArgs.from_cli_args(parser.parse_args(sglang_argv))
    ob._set_envs_and_config(server_args)
    runner, _ = ob.load_model(server_args, PortArgs.init_new(server_args), 0, 0)
    mr = runner.torch_runner
    for context in map(int, args.contexts.split(",")):
        runner.clear()
        reqs = ob.prepare_synthetic_inputs_for_latency_test(args.batch, context)
        prefix = context // 16 * 16 - 16
        for req in reqs:
            slots = mr.token_to_kv_pool_allocator.alloc(prefix)
            if slots is None:
                raise RuntimeError(f"KV pool too small for {args.batch} x {context} tokens")
            fill_random_kv(mr, slots)
            req.prefix_indices = slots.to(torch.int64)
            req.set_extend_range(prefix, context)
        next_ids, _, batch = runner.extend(reqs)
        state = {"ids": next_ids}

        def step():
            runner.synchronize()
            t0 = time.perf_counter()
            state["ids"], _ = runner.decode(state["ids"], batch)
            runner.synchronize()
            return time.perf_counter() - t0

        if args.interleave:
            steps = alternate_variants(mr.attn_backend, step, OUTPUT_LEN)
        else:
            steps = {"": [step() for _ in range(OUTPUT_LEN)]}
        next_ids = state["ids"]
        record = dict(batch_size=args.batch, input_len=context)
        for prefix, times in steps.items():
            # The first steps include one-off work. The mean counts the steps that summarise pages
            # sealed by decode (one in 16 per request), which the median skips.
            median, mean = statistics.median(times[3:]), statistics.mean(times[3:])
            print(f"synthetic: batch {args.batch} context {context}: {prefix}median decode {1000 * median:.3f} ms, "
                  f"mean {1000 * mean:.3f} ms, max {1000 * max(times[3:]):.3f} ms", flush=True)
            record.update({prefix + "median_decode_latency": median, prefix + "mean_decode_latency": mean,
                           prefix + "step_ms": [round(1000 * t, 4) for t in times]})
        with open(args.result, "a") as f:
            f.write(json.dumps(record) + "\n")
        print("synthetic: steps", json.dumps(record), flush=True)
        if args.profile_dir:
            profile_steps(runner, next_ids, batch, os.path.join(
                args.profile_dir, f"profile_{args.profile_tag}_{context}.txt"))


def alternate_variants(backend, step, steps_each: int, block: int = INTERLEAVE_BLOCK) -> dict:
    """Decode steps alternating LOCKS and the dense variant in blocks of `block` steps (the backend's
    min_step_tokens forcing each), steps_each of each: {"": LOCKS step times, "dense_": dense step times}.
    Both variants' graphs must have been captured (min_step_tokens > 0 at start-up)."""
    if getattr(backend, "graph_variants", None) is None or len(backend.graph_variants()) != 2:
        raise ValueError("interleaved needs --enable-locks with both decode graph variants "
                         "(--locks-min-step-tokens > 0)")
    if steps_each % block:
        raise ValueError(f"steps_each ({steps_each}) must be a multiple of the block ({block})")
    keep = backend.min_step_tokens
    times = {"": [], "dense_": []}
    try:
        for i in range(2 * steps_each):
            prefix = "dense_" if i // block % 2 else ""
            backend.min_step_tokens = 1 << 62 if prefix else 0
            times[prefix].append(step())
    finally:
        backend.min_step_tokens = keep
    return times


def profile_steps(runner, next_ids, batch, path: str, steps: int = 8) -> None:
    """Kernel and host time of a few more decode steps (torch.profiler; kernels inside CUDA graphs included)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            next_ids, _ = runner.decode(next_ids, batch)
            runner.synchronize()
    with open(path, "w") as f:
        f.write(f"{steps} decode steps\n")
        f.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=50))


def fill_random_kv(mr, slots) -> None:
    """Random keys/values in the prefix's slots; with LOCKS, random summaries marked valid for its pages."""
    import torch

    from sglang_locks.plugin.summary_store import store_for_pool

    pool = mr.token_to_kv_pool
    for layer in range(pool.start_layer, pool.start_layer + pool.layer_num):
        for buf in (pool.get_key_buffer(layer), pool.get_value_buffer(layer)):
            # an fp8 cache written as its bytes, as SGLang's pool stores it (not every index kernel takes fp8)
            store = buf.view(torch.uint8) if buf.dtype == torch.float8_e4m3fn else buf
            for chunk in slots.split(1 << 20):
                values = torch.randn(chunk.numel(), *buf.shape[1:], device=buf.device).to(buf.dtype)
                store[chunk] = values.view(store.dtype)
    store = store_for_pool(pool)
    if store is None:
        return
    pages = slots[::16] // 16
    s = store.summaries
    for i in store.slot_of_layer.values():
        rows = pages + i * store.num_pages
        for t in (s.mu, s.basis, s.coef):
            t[rows] = torch.randint(-100, 100, t[rows].shape, device=t.device).to(t.dtype)
        s.mu_scale[rows] = 0.01
        s.coef_scale[rows] = 0.01
    store.summary_generation[pages] = store.page_generation[pages]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sglang_argv = []
    if "--" in argv:
        at = argv.index("--")
        argv, sglang_argv = argv[:at], argv[at + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="e2e_decode.json")
    p.add_argument("--only", choices=["bench_one_batch", "synthetic", "interleaved", "bench_serving"])
    p.add_argument("--case", action="append", help="TOOL:SHAPE:BATCH[:CONTEXTS], e.g. bench_one_batch:llama8b:1:131072 "
                   "(repeatable, each case its own server processes; contexts: a comma-separated subset of the "
                   "plan's; default: the whole plan, ~20 min)")
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--serving-rounds", type=int, default=2,
                   help="bench_serving: requests per concurrent slot (the batch), each one prefill of the context")
    p.add_argument("--serving-warmup", type=int, default=1, help="bench_serving: warm-up requests")
    p.add_argument("--kv-cache-dtype", default="auto", help="both modes' --kv-cache-dtype, e.g. fp8_e4m3 (FullKV "
                   "then reads the same fp8 cache: the honest baseline)")
    p.add_argument("--locks-args", default="", help="more --locks-* flags for the LOCKS runs, e.g. '--locks-prefilter 8'")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per SGLang process")
    p.add_argument("--log-dir", help="keep each SGLang process's log here")
    p.add_argument("--dry-run", action="store_true", help="print the commands, write the JSON without results")
    p.add_argument("--profile", action="store_true", help="synthetic tool: also write a torch.profiler kernel table "
                   "of 8 more decode steps per context into --log-dir")
    p.add_argument("--synthetic-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--contexts", help=argparse.SUPPRESS)
    p.add_argument("--profile-dir", help=argparse.SUPPRESS)
    p.add_argument("--profile-tag", default="", help=argparse.SUPPRESS)
    p.add_argument("--interleave", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.profile and not args.log_dir:
        p.error("--profile writes into --log-dir")
    if args.synthetic_worker:
        synthetic_worker(args, sglang_argv)
        return 0
    try:
        selected_cases(args.only, args.case)
    except ValueError as e:
        p.error(str(e))
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    head = header(argv)

    def save(rows) -> list:
        summary = summarize(rows)
        with open(args.out, "w") as f:
            json.dump(dict(head, rows=rows, **({"summary": summary} if summary else {})), f, indent=1)
        return summary

    result = dict(head, rows=run_plan(args, save))
    for r in save(result["rows"]):
        print(f"e2e_decode: {r['tool']} {r['shape']} bs={r['batch']} {r['context']}: {r['samples']} samples, median "
              f"{r['fullkv_ms']:.3f} / {r['locks_ms']:.3f} ms = {r['speedup']:.3f}x "
              f"({r['speedup_min']:.3f}-{r['speedup_max']:.3f}x)")
    print(f"e2e_decode: wrote {args.out}")
    return 0 if args.dry_run or all("error" not in r for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
