"""RULER-style long-context tasks against a server: the same seeded prompts scored per server configuration.

    python benchmarks/long_context_suite.py --model benchmarks/models/tiny-llama-pycode \\
        --config "dense=--attention-backend flashinfer --page-size 16" \\
        --config "locks budget 1024=--enable-locks --locks-token-budget 1024 --locks-min-step-tokens 0" \\
        [--lengths 4096,8192,16384,32768] [--samples 8] [--styles ruler,python] [--out FILE.json]
    python benchmarks/long_context_suite.py --url http://127.0.0.1:30000 --label "locks budget 2048" \\
        --server-flags "--enable-locks" [--model DIR | --tokenizer DIR]     # a server already running

Tasks, generated locally from a seed (no downloads), each prompt filled with haystack to the context length
measured by the model's tokenizer (prompt + max tokens <= length, as RULER sizes them):

* ``niah_multikey``: four key -> value needles (7-digit values) at random depths, the question asks one key;
* ``variable_tracking``: one chain of five assignments (``VAR A = 12345``, ``VAR B = VAR A``, ...); ``ruler``
  wording asks for all variables holding the value (RULER's question), ``python`` asks the value of the chain's
  last variable (the same chain traced forwards, a question a code model can answer);
* ``common_words``: a list where 10 words occur 30 times each and the rest 3 times; asks for the 10 most common.

Two wordings of the same content: ``ruler`` (RULER's own sentences over its repeated-noise haystack) and
``python`` (the content as Python source over generated code; the tiny LM of this repository is trained on
Python with planted ``NAME = "value"`` lines, so it can only score on this one). Greedy decoding
(temperature 0). A sample scores RULER's string match: the share of its expected strings found in the output
(case-insensitive, after RULER's clean-up); a row is the mean over its samples.

Servers: each ``--config LABEL=FLAGS`` is one ``sglang.launch_server`` (server_process.Server) with
``--model-path MODEL --context-length <longest length>`` and ``--common-flags``, scored, then stopped; or
``--url`` scores one running server. Lengths above the model's ``max_position_embeddings`` are clamped to it
(printed and recorded). The JSON is written after every configuration.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import random
import re
import shlex
import statistics
import sys
import urllib.request
from typing import Callable, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from e2e_decode import header  # noqa: E402
from server_process import Server  # noqa: E402

TASKS = ("niah_multikey", "variable_tracking", "common_words")
STYLES = ("ruler", "python")
APIS = ("completions", "generate")
DEFAULT_LENGTHS = (4096, 8192, 16384, 32768)
DEFAULT_OUT = os.path.join(HERE, "results", "long_context_suite.json")
# RULER generates 128 / 30 / 120 tokens; enough for one value, five names or ten words even byte by byte
MAX_TOKENS = {"niah_multikey": 32, "variable_tracking": 48, "common_words": 120}
NUM_KEYS, VALUE_DIGITS = 4, 7  # RULER's niah_multikey_1: 4 keys, number values
CHAIN_HOPS, CHAIN_VALUE = 4, (10000, 99999)  # RULER's variable tracking: 1 chain, 4 hops, 5-digit value
# RULER's cwe: 10 common words, 30 and 3 repeats from 4K tokens on, 6 and 1 below
COMMON_WORDS, REPEATS, SHORT_REPEATS, SHORT = 10, (30, 3), (6, 1), 4096
RULER_NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"


# ---------------------------------------------------------------------------------------------- samples
@dataclasses.dataclass(frozen=True)
class Draft:
    """A sample's random content, rendered with any amount of haystack (units: filler lines or rare words)."""

    expected: Tuple[str, ...]
    render: Callable[[int], str]
    max_units: int = 1 << 20


@dataclasses.dataclass(frozen=True)
class Sample:
    task: str
    style: str
    context_len: int
    index: int
    prompt: str
    expected: Tuple[str, ...]
    prompt_tokens: int
    max_tokens: int


def pseudo_word(rng: random.Random) -> str:
    """A pronounceable lowercase word of 3 syllables (343K of them): a vocabulary without a word-list download."""
    return "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(3))


def variable_name(rng: random.Random) -> str:
    return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))  # RULER's: 5 capitals


def distinct(draw: Callable[[random.Random], str], rng: random.Random, n: int) -> List[str]:
    drawn: Dict[str, None] = {}
    while len(drawn) < n:
        drawn[draw(rng)] = None
    return list(drawn)


def python_filler(seed: int, n: int) -> List[str]:
    """n lines of plausible Python; numbers stay below 100 so no filler can contain a needle's value."""
    rng = random.Random(seed)
    forms = ("def helper_{a}(x):\n    return x + {b}", "for i in range({b}):\n    total_{a} += i",
             "result_{a} = [v * {b} for v in values]", "if count_{a} > {b}:\n    count_{a} = 0",
             "items_{a}.append({b})")
    return [rng.choice(forms).format(a=rng.randrange(100), b=rng.randrange(100)) for _ in range(n)]


def haystack(style: str, seed: int, n: int) -> List[str]:
    return [RULER_NOISE] * n if style == "ruler" else python_filler(seed, n)


def insert_at_depths(lines: List[str], needles: Sequence[str], depths: Sequence[float]) -> List[str]:
    """needles inserted at fractions `depths` of the haystack, in order, so that any n keeps their depths."""
    out = list(lines)
    for needle, depth in sorted(zip(needles, depths), key=lambda p: p[1], reverse=True):
        out.insert(int(depth * len(lines)), needle)
    return out


def niah_draft(style: str, rng: random.Random) -> Draft:
    words = distinct(pseudo_word, rng, 2 * NUM_KEYS)
    keys = [f"{a}-{b}" if style == "ruler" else f"{a}_{b}" for a, b in zip(words[::2], words[1::2])]
    values = [str(v) for v in rng.sample(range(10 ** (VALUE_DIGITS - 1), 10 ** VALUE_DIGITS), NUM_KEYS)]
    depths, asked, seed = [rng.random() for _ in keys], rng.randrange(NUM_KEYS), rng.randrange(1 << 30)
    if style == "ruler":
        needles = [f"One of the special magic numbers for {k} is: {v}." for k, v in zip(keys, values)]
        head = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
                "I will quiz you about the numbers afterwards.\n")
        tail = (f"\nWhat is the special magic number for {keys[asked]} mentioned in the provided text? "
                f"Answer: The special magic number for {keys[asked]} mentioned in the provided text is")
    else:
        needles = [f'{k} = "{v}"' for k, v in zip(keys, values)]
        head, tail = "", f'\nassert {keys[asked]} == "'
    return Draft((values[asked],), lambda n: head + "\n".join(
        insert_at_depths(haystack(style, seed, n), needles, depths)) + tail)


def variable_tracking_draft(style: str, rng: random.Random) -> Draft:
    names = distinct(variable_name, rng, CHAIN_HOPS + 1)
    value = str(rng.randint(*CHAIN_VALUE))
    depths, seed = sorted(rng.random() for _ in names), rng.randrange(1 << 30)
    if style == "ruler":
        chain = [f"VAR {names[0]} = {value}"] + [f"VAR {b} = VAR {a}" for a, b in zip(names, names[1:])]
        head = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
        tail = (f"\nQuestion: Find all variables that are assigned the value {value} in the text above. "
                f"Answer: According to the chain(s) of variable assignment in the text above, {len(names)} "
                f"variables are assigned the value {value}, they are: ")
        expected = tuple(names)
    else:
        chain = [f"{names[0]} = {value}"] + [f"{b} = {a}" for a, b in zip(names, names[1:])]
        head, tail, expected = "", f"\nassert {names[-1]} == ", (value,)
    return Draft(expected, lambda n: head + "\n".join(
        insert_at_depths(haystack(style, seed, n), chain, depths)) + tail)


def common_words_draft(style: str, rng: random.Random, length: int, budget: int) -> Draft:
    common_repeats, rare_repeats = SHORT_REPEATS if length < SHORT else REPEATS
    max_rare = budget // rare_repeats  # every listed word takes a token at least
    words = distinct(pseudo_word, rng, COMMON_WORDS + max_rare)
    common, rare, seed = words[:COMMON_WORDS], words[COMMON_WORDS:], rng.randrange(1 << 30)

    def render(n: int) -> str:
        listed = common * common_repeats + rare[:n] * rare_repeats
        random.Random(seed).shuffle(listed)
        if style == "ruler":
            return ("Below is a numbered list of words. In these words, some appear more often than others. "
                    "Memorize the ones that appear most often.\n"
                    + " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed))
                    + f"\nQuestion: What are the {COMMON_WORDS} most common words in the above list? Answer: The "
                      f"top {COMMON_WORDS} words that appear most often in the list are:")
        return ("words = [" + ", ".join(f'"{w}"' for w in listed) + "]\n"
                f"top = [w for w, _ in Counter(words).most_common({COMMON_WORDS})]\nassert top == [\"")
    return Draft(tuple(common), render, max_rare)


def make_draft(task: str, style: str, rng: random.Random, length: int, budget: int) -> Draft:
    if task == "niah_multikey":
        return niah_draft(style, rng)
    if task == "variable_tracking":
        return variable_tracking_draft(style, rng)
    return common_words_draft(style, rng, length, budget)


def fit(draft: Draft, budget: int, count: Callable[[str], int], start: int) -> Tuple[int, str, int]:
    """The most haystack units whose prompt takes at most `budget` tokens, with that prompt and its tokens.
    Galloping from `start` (the previous sample's fit: a length's samples cost a few tokenizer calls each),
    then bisection between the last size that fits (lo) and the first that does not (hi)."""
    def fits(n: int) -> bool:
        return count(draft.render(n)) <= budget

    if not fits(0):
        raise ValueError(f"{budget} tokens cannot hold the prompt without haystack ({count(draft.render(0))} tokens)")
    n, step = min(max(start, 1), draft.max_units), 1
    lo, hi = (n, None) if fits(n) else (0, n)
    while hi is None and lo < draft.max_units:  # up from a size that fits
        n, step = min(lo + step, draft.max_units), step * 2
        lo, hi = (n, None) if fits(n) else (lo, n)
    while hi is not None and lo == 0 and hi > 1:  # down from a size that does not
        n, step = max(hi - step, 0), step * 2
        if fits(n):
            lo = n
            break
        hi = n
    while hi is not None and hi - lo > 1:
        n = (lo + hi) // 2
        lo, hi = (n, hi) if fits(n) else (lo, n)
    prompt = draft.render(lo)
    return lo, prompt, count(prompt)


def sample_seed(seed: int, task: str, style: str, length: int, index: int) -> str:
    return f"{seed}:{task}:{style}:{length}:{index}"  # str seeds are stable across processes and hash seeds


def make_samples(task: str, style: str, length: int, samples: int, seed: int, count: Callable[[str], int],
                 max_tokens: Optional[int] = None) -> List[Sample]:
    max_tokens = max_tokens or MAX_TOKENS[task]
    budget, units, out = length - max_tokens, 16, []
    for i in range(samples):
        draft = make_draft(task, style, random.Random(sample_seed(seed, task, style, length, i)), length, budget)
        try:
            units, prompt, n_tokens = fit(draft, budget, count, units)
        except ValueError as e:
            raise ValueError(f"{task} ({style}) at {length} tokens with {max_tokens} to generate: {e}") from None
        out.append(Sample(task, style, length, i, prompt, draft.expected, n_tokens, max_tokens))
    return out


def token_counter(tokenizer) -> Callable[[str], int]:
    """Prompt tokens as the server counts them: with the special tokens its tokenizer adds (e.g. BOS)."""
    return lambda text: len(tokenizer(text).input_ids)


# ---------------------------------------------------------------------------------------------- scoring
def clean(output: str) -> str:
    """RULER's post-processing: control characters become newlines, surrounding blanks go."""
    return re.sub(r"[\x00-\x1f]", "\n", output.strip()).strip()


def string_match_all(output: str, expected: Sequence[str]) -> float:
    """RULER's string_match_all for one sample: the share of expected strings in the output, case-insensitive."""
    text = clean(output).lower()
    return sum(e.lower() in text for e in expected) / len(expected)


# ---------------------------------------------------------------------------------------------- client
@dataclasses.dataclass(frozen=True)
class Endpoint:
    """One server: SGLang's native /generate or an OpenAI-compatible /v1/completions."""

    url: str
    api: str = "completions"
    model: str = "default"

    def request(self, prompt: str, max_tokens: int) -> Tuple[str, dict]:
        if self.api == "generate":
            return "/generate", {"text": prompt, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0}}
        return "/v1/completions", {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                                   "temperature": 0}

    def complete(self, prompt: str, max_tokens: int, timeout: float = 600) -> str:
        path, body = self.request(prompt, max_tokens)
        req = urllib.request.Request(self.url.rstrip("/") + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            reply = json.loads(r.read())
        return reply["text"] if self.api == "generate" else reply["choices"][0]["text"]


def get_json(url: str, timeout: float = 60) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def server_tokenizer_path(url: str) -> str:
    """The tokenizer a running SGLang server loaded (/model_info; /get_model_info before it was renamed)."""
    for path in ("/model_info", "/get_model_info"):
        try:
            return get_json(url.rstrip("/") + path)["tokenizer_path"]
        except (OSError, KeyError, ValueError):
            continue
    raise RuntimeError(f"{url} names no tokenizer (/model_info): give --tokenizer or --model")


def served_model(url: str) -> str:
    """The model name a running OpenAI-compatible server answers to (some reject any other)."""
    try:
        return get_json(url.rstrip("/") + "/v1/models")["data"][0]["id"]
    except (OSError, KeyError, IndexError, ValueError):
        return "default"


def locks_counters(url: str) -> Optional[dict]:
    """LOCKS's /server_info counters (None without --enable-locks or on a server that is not SGLang)."""
    try:
        return get_json(url.rstrip("/") + "/server_info")["internal_states"][0].get("locks")
    except (OSError, KeyError, IndexError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------- runs
@dataclasses.dataclass(frozen=True)
class Config:
    label: str
    flags: str = ""


@dataclasses.dataclass
class Row:
    task: str
    style: str
    context_len: int
    label: str
    samples: int
    score: Optional[float]
    mean_prompt_tokens: float
    max_tokens: int
    examples: List[dict]
    error: Optional[str] = None


def cell_fields(cell: List[Sample], label: str) -> dict:
    """A row's fields that name its cell: one (task, style, length), all its samples, one configuration."""
    s = cell[0]
    return dict(task=s.task, style=s.style, context_len=s.context_len, label=label, samples=len(cell),
                mean_prompt_tokens=statistics.mean(x.prompt_tokens for x in cell), max_tokens=s.max_tokens)


def error_row(cell: List[Sample], label: str, error: str) -> Row:
    return Row(**cell_fields(cell, label), score=None, examples=[], error=error)


def score_cell(endpoint: Endpoint, cell: List[Sample], label: str, concurrency: int) -> Row:
    """One cell against one server; a failed request makes the row an error row."""
    try:
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            outputs = list(pool.map(lambda s: endpoint.complete(s.prompt, s.max_tokens), cell))
    except (OSError, KeyError, IndexError, ValueError) as e:
        return error_row(cell, label, f"{type(e).__name__}: {e}")
    scores = [string_match_all(o, s.expected) for o, s in zip(outputs, cell)]
    examples = [dict(expected=list(s.expected), output=o) for s, o in zip(cell[:2], outputs)]  # to read, not score
    return Row(**cell_fields(cell, label), score=statistics.mean(scores), examples=examples)


def score_server(endpoint: Endpoint, cells: List[List[Sample]], label: str, concurrency: int) -> List[Row]:
    rows = []
    for cell in cells:
        r = score_cell(endpoint, cell, label, concurrency)
        rows.append(r)
        print(f"long_context_suite: {label}: {r.task} {r.style} {r.context_len}: "
              + (r.error or f"{r.score:.3f}"), flush=True)
    return rows


def launch_args(model: str, context_len: int, common: str, config: Config) -> List[str]:
    return ["--model-path", model, "--context-length", str(context_len), *shlex.split(common),
            *shlex.split(config.flags)]


def run_config(args, config: Config, cells: List[List[Sample]], context_len: int) -> Tuple[dict, List[Row]]:
    """Start the configuration's server, score every cell, stop it. A server that does not start gives error rows."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", config.label)
    flags = launch_args(args.model, context_len, args.common_flags, config)
    try:
        server = Server(name, args.port, flags, args.log_dir, ready_timeout=args.ready_timeout)
    except RuntimeError as e:
        info = dict(label=config.label, flags=config.flags, error=str(e))
        return info, [error_row(cell, config.label, str(e)) for cell in cells]
    try:
        endpoint = Endpoint(server.url, args.api, args.model)
        rows = score_server(endpoint, cells, config.label, args.concurrency)
        info = dict(label=config.label, flags=config.flags, launch=" ".join(flags),
                    startup_s=round(server.startup_s, 1), locks=locks_counters(server.url), log=server.log)
        return info, rows
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------- output
def table(rows: List[Row]) -> str:
    """Scores with one column per configuration label, in the order they ran."""
    labels = list(dict.fromkeys(r.label for r in rows))
    cells: Dict[tuple, Dict[str, str]] = {}
    for r in rows:
        cells.setdefault((r.task, r.style, r.context_len), {})[r.label] = "error" if r.error else f"{r.score:.3f}"
    widths = [max(len(lb), 5) for lb in labels]
    lines = [f"{'task':<18} {'style':<7} {'context':>7}  " + "  ".join(f"{lb:>{w}}" for lb, w in zip(labels, widths))]
    for (task, style, length), scores in cells.items():
        lines.append(f"{task:<18} {style:<7} {length:>7}  "
                     + "  ".join(f"{scores.get(lb, '-'):>{w}}" for lb, w in zip(labels, widths)))
    return "\n".join(lines)


def write(path: str, head: dict, servers: List[dict], rows: List[Row]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(dict(head, servers=servers, rows=[dataclasses.asdict(r) for r in rows]), f, indent=1)


# ---------------------------------------------------------------------------------------------- arguments
def _lengths(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts, got {text!r}") from None
    if not values or any(v < 256 for v in values):
        raise argparse.ArgumentTypeError(f"expected token counts >= 256, got {text!r}")
    return sorted(set(values))


def _subset(choices: Sequence[str]) -> Callable[[str], List[str]]:
    def parse(text: str) -> List[str]:
        names = [n for n in text.split(",") if n]
        if not names or any(n not in choices for n in names):
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(choices)}, got {text!r}")
        return list(dict.fromkeys(names))
    return parse


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _config(text: str) -> Config:
    label, sep, flags = text.partition("=")
    if not sep or not label.strip():
        raise argparse.ArgumentTypeError(f"expected LABEL=SERVER FLAGS, e.g. 'dense=--page-size 16', got {text!r}")
    return Config(label.strip(), flags.strip())


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", type=_config, action="append", metavar="LABEL=FLAGS",
                       help="launch one server per entry with these launch_server flags (repeat the flag)")
    where.add_argument("--url", help="score this running server instead, e.g. http://127.0.0.1:30000")
    p.add_argument("--label", default="server", help="with --url: the configuration's label, e.g. 'dense'")
    p.add_argument("--server-flags", default="", help="with --url: the server's flags, recorded as given")
    p.add_argument("--model", help="model directory: --model-path of launched servers, the tokenizer, the "
                                   "length limit (config.json) and the completions' model name (default with "
                                   "--url: the server's /v1/models)")
    p.add_argument("--tokenizer", help="tokenizer directory (default: --model, else the server's /model_info)")
    p.add_argument("--api", choices=APIS, default="completions", help="/v1/completions or SGLang's /generate")
    p.add_argument("--tasks", type=_subset(TASKS), default=list(TASKS), help=f"subset of {','.join(TASKS)}")
    p.add_argument("--styles", type=_subset(STYLES), default=["ruler"], help="wordings: ruler, python or both")
    p.add_argument("--lengths", type=_lengths, default=list(DEFAULT_LENGTHS), help="context lengths in tokens, prompt + generated (default: 4096,8192,16384,32768)")
    p.add_argument("--samples", type=_positive, default=8, help="prompts per task, wording and length")
    p.add_argument("--max-tokens", type=_positive, help=f"tokens generated per prompt (default per task: {MAX_TOKENS})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", type=_positive, default=8, help="requests in flight")
    p.add_argument("--common-flags", default="", help="launch_server flags of every --config")
    p.add_argument("--port", type=_positive, default=30043)
    p.add_argument("--ready-timeout", type=_positive, default=600, help="seconds for a launched server to come up")
    p.add_argument("--log-dir", default="long_context_suite_logs", help="launched servers' logs")
    p.add_argument("--out", default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.config and not args.model:
        p.error("--config needs --model (the launched servers' --model-path)")
    labels = [c.label for c in args.config or []]
    if len(set(labels)) < len(labels):
        p.error(f"--config: labels must differ, got {labels}")
    return args


# ---------------------------------------------------------------------------------------------- main
def model_max_length(model: Optional[str]) -> Optional[int]:
    path = os.path.join(model or "", "config.json")
    if not model or not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f).get("max_position_embeddings")


def clamp_lengths(lengths: List[int], limit: Optional[int]) -> Tuple[List[int], Optional[str]]:
    if not limit or max(lengths) <= limit:
        return lengths, None
    kept = sorted({min(n, limit) for n in lengths})
    return kept, f"lengths {lengths} clamped to the model's max_position_embeddings {limit}: {kept}"


def load_tokenizer(args):
    from transformers import AutoTokenizer  # imported here: --help and argument errors stay fast

    path = args.tokenizer or args.model or server_tokenizer_path(args.url)
    return path, AutoTokenizer.from_pretrained(path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    lengths, note = clamp_lengths(args.lengths, model_max_length(args.model))
    if note:
        print(f"long_context_suite: {note}")
    tokenizer_path, tokenizer = load_tokenizer(args)
    count = token_counter(tokenizer)
    try:
        cells = [make_samples(t, s, n, args.samples, args.seed, count, args.max_tokens)
                 for t in args.tasks for s in args.styles for n in lengths]
    except ValueError as e:  # a length too short for a task: an argument error, as argparse reports them
        print(f"long_context_suite: error: argument --lengths: {e}", file=sys.stderr)
        return 2
    head = dict(header(argv), command=shlex.join(["python", "benchmarks/long_context_suite.py", *argv]),
                model=args.model, tokenizer=tokenizer_path, api=args.api, seed=args.seed, lengths=lengths,
                clamped=note, scoring="RULER string_match_all (share of expected strings in the output)")
    servers: List[dict] = []
    rows: List[Row] = []
    if args.url:
        endpoint = Endpoint(args.url, args.api, args.model or served_model(args.url))
        rows += score_server(endpoint, cells, args.label, args.concurrency)
        servers.append(dict(label=args.label, flags=args.server_flags, url=args.url, locks=locks_counters(args.url)))
        write(args.out, head, servers, rows)
    for config in args.config or []:
        info, config_rows = run_config(args, config, cells, max(lengths))
        servers.append(info)
        rows += config_rows
        write(args.out, head, servers, rows)  # after every configuration: a run cut short keeps what it did
    print(table(rows))
    print(f"long_context_suite: wrote {args.out}")
    return 0 if all(r.error is None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
