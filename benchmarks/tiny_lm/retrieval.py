"""A long-context retrieval task made of held-out Python: recall a string assigned near the start.

A prompt of exactly ``context`` tokens is

    <|bos|># file: secrets.py
    SECRET_0 = "q3ZkTa"          (n_secrets random 6-character values)
    ...
    <held-out package text, ending at a line end>
    <cue for SECRET_k>

with the cue ``SECRET_k = "`` (template ``assign``: the assignment line
repeated, a pure copy) or ``print(SECRET_k)  # -> "`` (template ``print``).
The answer is the value of SECRET_k; a greedy continuation scores when its
first 6 bytes are exactly the value. Chance: guessing 6 characters is
62**-6; copying one of the planted values at random is right 1/n_secrets of
the time (reported as ``copied_other`` when it copies a wrong one).
"""

from __future__ import annotations

import random
import re
import string
from typing import Dict, List

import torch

from .byte_tokenizer import BOS
from .byte_tokenizer import decode as decode_bytes
from .model import dense_attend

ALPHABET = string.ascii_letters + string.digits
VALUE_LEN = 6
CUES = {"assign": 'SECRET_{k} = "', "print": 'print(SECRET_{k})  # -> "'}


def make_prompts(held_out: Dict[str, bytes], context: int, count: int, n_secrets: int = 4,
                 template: str = "assign", seed: int = 0) -> List[dict]:
    """``count`` prompts of exactly ``context`` tokens, filler from the held-out packages in turn."""
    rng = random.Random(seed * 1_000_003 + context)
    packages = sorted(held_out)
    prompts = []
    for i in range(count):
        values = ["".join(rng.choice(ALPHABET) for _ in range(VALUE_LEN)) for _ in range(n_secrets)]
        k = rng.randrange(n_secrets)
        head = "# file: secrets.py\n" + "".join(f'SECRET_{j} = "{v}"\n' for j, v in enumerate(values)) + "\n"
        cue = "\n" + CUES[template].format(k=k)
        filler_len = context - 1 - len(head) - len(cue)  # 1: <|bos|>
        text = held_out[packages[i % len(packages)]]
        if filler_len <= 0 or len(text) < filler_len:
            raise ValueError(f"context {context} too short for the prompt or package text too short")
        # filler ends at a newline (found by re: a Python loop over a package's bytes per prompt is slow)
        ends = [filler_len - 1 + m.start() for m in re.finditer(rb"\n", text[filler_len - 1 :])]
        end = rng.choice(ends) if ends else filler_len - 1
        filler = text[end - filler_len + 1 : end + 1]
        ids = [BOS] + list(head.encode()) + list(filler) + list(cue.encode())
        assert len(ids) == context
        prompts.append({"ids": torch.tensor(ids), "answer": values[k], "values": values, "key": k,
                        "package": packages[i % len(packages)]})
    return prompts


def score(prompts: List[dict], continuations: List[str]) -> dict:
    correct = [c[:VALUE_LEN] == p["answer"] for p, c in zip(prompts, continuations)]
    other = [c[:VALUE_LEN] in p["values"] and not ok for p, c, ok in zip(prompts, continuations, correct)]
    n_secrets = len(prompts[0]["values"]) if prompts else 0
    return {"n": len(prompts), "secrets": n_secrets, "accuracy": sum(correct) / max(1, len(prompts)),
            "copied_other": sum(other) / max(1, len(prompts)),
            "chance_random_chars": len(ALPHABET) ** -VALUE_LEN,
            "chance_random_planted_value": 1 / max(1, n_secrets)}


@torch.no_grad()
def prefill(model, ids: torch.Tensor):
    """Dense prefill of prompts ids [B, T], as a server's: (first greedy token [B], KV cache)."""
    cache: list = []
    return model(ids, cache=cache)[:, -1].argmax(-1), cache


@torch.no_grad()
def decode(model, first: torch.Tensor, cache: list, prompt_len: int, n_new: int, attend) -> List[List[int]]:
    """Greedy: ``first`` then n_new - 1 tokens, each from a decode step attending with ``attend``.
    The prefill cache is not modified (decode steps concatenate into new tensors)."""
    step_cache = list(cache)
    tok, out = first, [first]
    for i in range(n_new - 1):
        tok = model(tok[:, None], attend=attend, cache=step_cache, q_start=prompt_len + i)[:, -1].argmax(-1)
        out.append(tok)
    return torch.stack(out, 1).tolist()


@torch.no_grad()
def dense_accuracy(model, held_out: Dict[str, bytes], context: int, count: int, n_secrets: int = 4,
                   template: str = "assign", seed: int = 0) -> dict:
    """The task with plain dense attention (the model's own causal attention, prefill and decode)."""
    prompts = make_prompts(held_out, context, count, n_secrets, template, seed)
    device = next(model.parameters()).device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        first, cache = prefill(model, torch.stack([p["ids"] for p in prompts]).to(device))
        tokens = decode(model, first, cache, context, VALUE_LEN, dense_attend)
    texts = [decode_bytes(t) for t in tokens]
    return {"context": context, "template": template, **score(prompts, texts),
            "examples": [{"answer": p["answer"], "got": t} for p, t in zip(prompts[:3], texts[:3])]}
