"""Seeded multi-turn agent traces shaped like OpenHands traces, for SGLang's ``--dataset-name agentic-trace``.

    python benchmarks/agent_trace.py --out trace.json [--tokenizer .gpu-kit/llama8b-dummy] [--agents 16]
        [--system-tokens 16384] [--task-tokens 256,1024] [--turns 10,40] [--tool-tokens 1024,4096]
        [--output-tokens 220] [--max-history 131072] [--seed 0]

Every agent starts from one shared system + tools prompt (the same text for all, so the radix cache shares
it) and its own task; each later turn adds one tool output. The server's replies (``--output-tokens``
each, SGLang's default of 220 for these traces) are fed back into the history by bench_serving's
multi-turn replay. An agent stops before a turn whose prompt plus reply would pass ``--max-history``.

Format (what ``sglang.benchmark.datasets.agentic_trace`` reads)::

    {"metadata": {...}, "conversations": [[{"messages": [system, user], "prompt_tokens": N},
                                            {"messages": [tool], "prompt_tokens": N}, ...], ...]}

Token counts. Text is built from words of the tokenizer's vocabulary that are one token each when
joined by spaces (checked once on the joined word list): with the kit's stand-in tokenizers (word-level,
``t3``..``t999``, any other word or run of punctuation one ``<unk>``) a message of n words is n tokens.
``prompt_tokens`` is not that estimate but the tokenizer's count of the prompt the server builds,
``CHAT_TEMPLATE`` applied to the history (agent_serving.py installs that template in its model copy),
each earlier reply counted as ``--output-tokens`` one-token words. Prompts are encoded message by
message and concatenated (the template renders each message on its own, and a word-level tokenizer
splits at the newline that ends it); each agent's last prompt is checked against one encoding of the
whole rendered history.

Shared pages (metadata). ``cached_tokens`` replays the radix cache with SGLang's rules at page size 16:
a request reuses the longest page-aligned prefix any earlier request left in the cache (at most its
length - 1), and leaves its prompt plus all but its last generated token. That is what
``--enable-locks`` counts as ``reused_pages`` (each request's new cached tokens // 16). The metadata
gives ``shared_prefix_tokens`` / ``shared_pages`` (what every agent's first prompt has in common with
the system prompt alone, chat tags included: the pages shared across agents) and
``expected_reused_pages``: the replay of a primer request of the system prompt alone (agent_serving.py
sends one before the agents, so that every first turn finds the shared prefix cached whatever the
order of the agents' first turns), then every agent's turns, each reply ``--output-tokens`` tokens that
re-encode to themselves (SGLang's replies under ignore_eos with a full-vocabulary word-level tokenizer
do, but for its three special ids, which decode to nothing). Assumed: nothing evicted or retracted
(the KV pool holds every history); requests of different agents share nothing beyond what the primer
leaves (so with the kit's stand-ins, whose role tags all encode to ``<unk>``, and each agent's task
starting with its own word). agent_serving.py redoes the replay with the replies the server sent.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
from typing import List, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sglang_locks.config import PAGE_SIZE  # noqa: E402

KIT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".gpu-kit")
# One block per message, then the assistant tag: each turn's prompt is a prefix of the next one's.
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
DEFAULTS = dict(agents=16, system_tokens=16384, task_tokens=(256, 1024), turns=(10, 40), tool_tokens=(1024, 4096),
                output_tokens=220, max_history=131072, seed=0)


# ---------------------------------------------------------------------------------------------- tokens
def single_token_words(tokenizer) -> List[str]:
    """Alphanumeric vocabulary entries, in id order, each one token when joined by spaces."""
    vocab = tokenizer.get_vocab()
    words = sorted((w for w in vocab if re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", w)), key=vocab.get)
    if len(tokenizer.encode(" ".join(words), add_special_tokens=False)) != len(words):
        raise ValueError(f"{tokenizer.name_or_path}: its vocabulary's words are not one token each when joined by "
                         "spaces; this generator needs a word-level tokenizer like the kit's stand-ins")
    return words


def render(tokenizer, messages: Sequence[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(list(messages), chat_template=CHAT_TEMPLATE, tokenize=False,
                                         add_generation_prompt=generation_prompt)


class PromptEncoder:
    """The token ids the server builds from a history: CHAT_TEMPLATE rendered, then encoded with the
    tokenizer's defaults (as SGLang's chat endpoint does for a tokenizer that adds no special tokens)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        some = [{"role": "user", "content": ""}]  # the tag is what add_generation_prompt appends to any history
        self.generation = self.encode_text(render(tokenizer, some, True)[len(render(tokenizer, some, False)):])

    def encode_text(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text), dtype=np.int64)

    def message(self, message: dict) -> np.ndarray:
        return self.encode_text(render(self.tokenizer, [message], False))


class History:
    """A growing chat history, encoded message by message; check() compares with one encoding of the whole."""

    def __init__(self, encoder: PromptEncoder):
        self.encoder, self.messages, self.pieces = encoder, [], []

    def add(self, message: dict, ids: np.ndarray = None) -> None:
        self.messages.append(message)
        self.pieces.append(self.encoder.message(message) if ids is None else ids)

    def prompt_len(self) -> int:
        return sum(map(len, self.pieces)) + len(self.encoder.generation)

    def prompt(self) -> np.ndarray:
        return np.concatenate([*self.pieces, self.encoder.generation])

    def check(self) -> None:
        whole = self.encoder.encode_text(render(self.encoder.tokenizer, self.messages, True))
        if not np.array_equal(whole, self.prompt()):
            raise ValueError("CHAT_TEMPLATE's messages do not encode one by one under this tokenizer: the prompt "
                             f"of {len(self.messages)} messages is {len(whole)} tokens, its messages' sum "
                             f"{self.prompt_len()}")


def conversation_requests(encoder: PromptEncoder, conversation: Sequence[dict],
                          replies: Sequence[str]) -> List[Tuple[np.ndarray, np.ndarray]]:
    """One agent's turns as the server sees them: (prompt ids, generated ids) per turn, the history growing by
    each turn's messages and the assistant reply before it. Generated ids: the reply text encoded (SGLang's
    output, if it re-encodes to itself)."""
    if len(replies) != len(conversation):
        raise ValueError(f"{len(conversation)} turns but {len(replies)} replies")
    history, out = History(encoder), []
    for t, (turn, reply) in enumerate(zip(conversation, replies)):
        if t:
            history.add({"role": "assistant", "content": replies[t - 1]})
        for m in turn["messages"]:
            history.add(m)
        out.append((history.prompt(), encoder.encode_text(reply)))
    history.check()
    return out


# ---------------------------------------------------------------------------------------------- radix replay
def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def cached_tokens(requests: Sequence[Tuple[np.ndarray, np.ndarray]], page_size: int = PAGE_SIZE) -> List[int]:
    """SGLang's cached tokens of each request, served in this order, each finishing before the next is matched:
    the longest prefix match against what earlier requests left in the radix cache (their prompt and all but
    their last generated token: the last has no KV yet; SGLang keeps whole pages of it, which the page-aligned
    match makes no different), at most the prompt's length - 1, page-aligned. Assumes nothing is evicted."""
    left, cached = [], []
    for prompt, generated in requests:
        prompt = np.asarray(prompt, dtype=np.int64)
        best = max((_lcp(prompt, seq) for seq in left), default=0)
        cached.append(min(best, len(prompt) - 1) // page_size * page_size)
        left.append(np.concatenate([prompt, np.asarray(generated, dtype=np.int64)[:-1]]))
    return cached


def reused_pages(cached: Sequence[int], page_size: int = PAGE_SIZE) -> int:
    return sum(c // page_size for c in cached)


def primer_messages(trace: dict) -> List[dict]:
    """The shared system prompt alone: sent once before the agents, it puts the shared prefix in the cache."""
    return [trace["conversations"][0][0]["messages"][0]]


# ---------------------------------------------------------------------------------------------- trace
def _words(rng: random.Random, words: Sequence[str], n: int, first: str = None) -> str:
    chosen = rng.choices(words, k=n)
    if first is not None:
        chosen[0] = first
    return " ".join(chosen)


def make_trace(tokenizer, agents: int, system_tokens: int, task_tokens: Tuple[int, int], turns: Tuple[int, int],
               tool_tokens: Tuple[int, int], output_tokens: int, max_history: int, seed: int) -> dict:
    words = single_token_words(tokenizer)
    if agents > len(words) - 1:
        raise ValueError(f"--agents must be 1..{len(words) - 1} (one first word each), got {agents}")
    rng = random.Random(seed)
    encoder = PromptEncoder(tokenizer)
    filler, others = words[0], words[1:]  # filler: the stand-in replies, a word no task starts with
    reply = {"role": "assistant", "content": " ".join([filler] * output_tokens)}
    reply_ids, reply_piece = encoder.encode_text(reply["content"]), encoder.message(reply)
    system = {"role": "system", "content": _words(rng, words, system_tokens)}
    system_piece = encoder.message(system)
    firsts = rng.sample(others, agents)  # distinct: agents share nothing beyond the system prompt
    conversations, requests, first_prompts, tool_lens = [], [], [], []
    for agent in range(agents):
        history, conversation = History(encoder), []
        history.add(system, system_piece)
        history.add({"role": "user", "content": _words(rng, words, rng.randint(*task_tokens), firsts[agent])})
        if history.prompt_len() + output_tokens > max_history:
            raise ValueError(f"--max-history {max_history}: an agent's first prompt and reply need "
                             f"{history.prompt_len() + output_tokens} tokens")
        for t in range(rng.randint(*turns)):
            if t:
                tool = {"role": "tool", "content": _words(rng, words, rng.randint(*tool_tokens))}
                tool_piece = encoder.message(tool)
                if history.prompt_len() + len(reply_piece) + len(tool_piece) + output_tokens > max_history:
                    break
                history.add(reply, reply_piece)
                history.add(tool, tool_piece)
                tool_lens.append(len(tool_piece))
            own = history.messages[-1:] if t else history.messages[-2:]  # the turn's messages; replies are the server's
            conversation.append({"messages": own, "prompt_tokens": history.prompt_len()})
            requests.append((history.prompt(), reply_ids))
        history.check()
        first_prompts.append(requests[-len(conversation)][0])
        conversations.append(conversation)
    primer = (np.concatenate([system_piece, encoder.generation]), reply_ids)
    cached = cached_tokens([primer] + requests)[1:]
    shared = min(_lcp(primer[0], p) for p in first_prompts)
    last = [c[-1]["prompt_tokens"] + output_tokens for c in conversations]
    return {"metadata": dict(generator="benchmarks/agent_trace.py", tokenizer=tokenizer.name_or_path,
                             chat_template=CHAT_TEMPLATE, seed=seed, agents=agents, system_tokens=system_tokens,
                             task_tokens=list(task_tokens), turns=list(turns), tool_tokens=list(tool_tokens),
                             output_tokens=output_tokens, max_history=max_history, page_size=PAGE_SIZE,
                             turns_per_agent=[len(c) for c in conversations], final_history_tokens=last,
                             mean_tool_tokens=round(float(np.mean(tool_lens))) if tool_lens else 0,
                             shared_prefix_tokens=shared, shared_pages=shared // PAGE_SIZE,
                             expected_reused_pages=reused_pages(cached)),
            "conversations": conversations}


def _range(text: str) -> Tuple[int, int]:
    lo, _, hi = text.partition(",")
    lo, hi = int(lo), int(hi or lo)
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"expected LO,HI with 1 <= LO <= HI, got {text!r}")
    return lo, hi


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="trace JSON to write")
    p.add_argument("--tokenizer", default=os.path.join(KIT, "llama8b-dummy"), help="tokenizer folder")
    p.add_argument("--agents", type=_positive, default=DEFAULTS["agents"])
    p.add_argument("--system-tokens", type=_positive, default=DEFAULTS["system_tokens"],
                   help="shared system + tools prompt (the issue's agents: 8K-32K)")
    p.add_argument("--task-tokens", type=_range, default=DEFAULTS["task_tokens"], help="LO,HI: each agent's task")
    p.add_argument("--turns", type=_range, default=DEFAULTS["turns"], help="LO,HI turns per agent")
    p.add_argument("--tool-tokens", type=_range, default=DEFAULTS["tool_tokens"], help="LO,HI: a turn's tool output")
    p.add_argument("--output-tokens", type=_positive, default=DEFAULTS["output_tokens"], help="per reply")
    p.add_argument("--max-history", type=_positive, default=DEFAULTS["max_history"],
                   help="an agent stops before its prompt plus reply would pass this")
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    try:
        trace = make_trace(AutoTokenizer.from_pretrained(args.tokenizer), args.agents, args.system_tokens,
                           args.task_tokens, args.turns, args.tool_tokens, args.output_tokens, args.max_history,
                           args.seed)
    except ValueError as e:
        p.error(str(e))
    with open(args.out, "w") as f:
        json.dump(trace, f)
    m = trace["metadata"]
    print(f"agent_trace: {args.out}: {m['agents']} agents, {sum(m['turns_per_agent'])} turns, histories "
          f"{min(m['final_history_tokens'])}-{max(m['final_history_tokens'])} tokens, {m['shared_pages']} shared "
          f"pages, {m['expected_reused_pages']} reused pages expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
