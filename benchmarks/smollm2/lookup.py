"""The tiny LM's retrieval task (``benchmarks.tiny_lm.retrieval``) in SmolLM2's tokens.

A prompt of exactly ``context`` tokens is

    # file: secrets.py
    SECRET_0 = "q3ZkTa"          (n_secrets random 6-character values)
    ...
    <standard-library source from a line start>
    <cue for SECRET_k>

with the cue of ``benchmarks.tiny_lm.retrieval.CUES`` (``assign``: the line
``SECRET_k = "`` again; ``print``: ``print(SECRET_k)  # -> "``). Head, filler
and cue are tokenized apart and concatenated (a prompt is cut to exact length
in tokens). Scoring is the tiny LM's ``retrieval.score``: the first 6
characters of the greedy continuation must be the value.
"""

from __future__ import annotations

import random
import re
from typing import List, Sequence

import torch

from benchmarks.tiny_lm.retrieval import ALPHABET, CUES, VALUE_LEN

from .documents import stdlib_text


def make_prompts(tokenizer, files: Sequence[str], context: int, count: int, n_secrets: int = 4,
                 template: str = "assign", seed: int = 0) -> List[dict]:
    """``count`` prompts of exactly ``context`` tokens, filler from ``files`` in turn."""
    if template not in CUES:
        raise ValueError(f"template must be one of {sorted(CUES)}, got {template!r}")
    rng = random.Random(seed * 1_000_003 + context)
    encode = lambda s: tokenizer(s).input_ids  # noqa: E731
    prompts = []
    for i in range(count):
        values = ["".join(rng.choice(ALPHABET) for _ in range(VALUE_LEN)) for _ in range(n_secrets)]
        k = rng.randrange(n_secrets)
        head = encode("# file: secrets.py\n" + "".join(f'SECRET_{j} = "{v}"\n' for j, v in enumerate(values)) + "\n")
        cue = encode("\n" + CUES[template].format(k=k))
        n_filler = context - len(head) - len(cue)
        name = files[i % len(files)]
        text = stdlib_text(name)
        starts = [0] + [m.end() for m in re.finditer(r"\n", text[: len(text) // 2])]  # line starts, first half
        filler = encode(text[rng.choice(starts):][: n_filler * 8])[:n_filler]  # 8 chars/token: ample for code
        if n_filler <= 0 or len(filler) < n_filler:
            raise ValueError(f"context {context}: {name} too short for the filler of {n_filler} tokens")
        ids = head + filler + cue
        prompts.append({"ids": torch.tensor(ids), "answer": values[k], "values": values, "key": k, "file": name})
    return prompts
