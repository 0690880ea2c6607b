"""Training windows that only retrieval can predict: real training code with planted assignments of
random values and, later, cues that the value completes.

A planted window is a slice of the training stream (so never held-out text) with
lines inserted at line starts:

    NAME = "value"            one per key, in the first half (all in one block or scattered)
    <cue for NAME>value"      later, at least ``min_gap`` bytes after NAME's assignment

The cues are ``TRAIN_CUES``. Values are random, so after a cue the only way to
predict them is to copy from the assignment: that is what builds the retrieval
heads the evaluation (retrieval.py) measures. The distributions differ from
the evaluation's on purpose: names are identifiers taken from the window itself
(never containing ``SECRET``), half the time sharing a prefix and differing only
in a trailing index, so the whole name must be matched, as with ``SECRET_<j>``;
values have 4-10 characters, not always 6; the evaluation's ``print`` cue
(``print(SECRET_k)  # -> "``) is not among the training cues.
"""

from __future__ import annotations

import keyword
import random
import re
from typing import List, Tuple

import torch

from .retrieval import ALPHABET

TRAIN_CUES = ('{name} = "', 'assert {name} == "', 'print({name})  # "', 'log({name})  # value: "')
VALUE_LENGTHS = range(4, 11)
MAX_KEYS = 6
BYTES_PER_CUE = 512  # longer windows get more cues (1 + length // BYTES_PER_CUE, capped): 3-10 % of the bytes
MAX_CUES = 32
IDENTIFIER = re.compile(rb"[A-Za-z_][A-Za-z0-9_]{2,14}")


def _names(window: bytes, count: int, rng: random.Random) -> List[str]:
    case = str.upper if rng.random() < 0.5 else str
    words = sorted({case(w.decode()) for w in IDENTIFIER.findall(window)
                    if not keyword.iskeyword(w.decode()) and b"SECRET" not in w.upper()})
    if len(words) < count or rng.random() < 0.5:  # one prefix, distinct indices: only the index tells keys apart
        prefix = (rng.choice(words) if words else "key").upper().strip("_") or "KEY"
        return [f"{prefix}_{i}" for i in rng.sample(range(10 * count), count)]
    return rng.sample(words, count)


def plant(window: bytes, length: int, rng: random.Random, min_gap: int = 256) -> Tuple[bytes, List[Tuple[int, int]]]:
    """``length`` bytes: ``window`` (at least ``length`` bytes of training text) with planted keys and cues,
    and the [start, end) byte ranges of the answers (each value after a cue and its closing quote)."""
    n_keys = rng.randint(1, max(1, min(MAX_KEYS, length // 128)))  # inserts stay under half the window
    n_cues = min(MAX_CUES, 1 + length // BYTES_PER_CUE)
    names = _names(window[:length], n_keys, rng)
    values = ["".join(rng.choice(ALPHABET) for _ in range(rng.choice(VALUE_LENGTHS))) for _ in range(n_keys)]
    assigns = [f'{n} = "{v}"\n'.encode() for n, v in zip(names, values)]
    cue_keys = [rng.randrange(n_keys) for _ in range(n_cues)]
    cues = [(rng.choice(TRAIN_CUES).format(name=names[k]).encode(), f'{values[k]}"\n'.encode()) for k in cue_keys]
    inserted = sum(map(len, assigns)) + sum(len(c) + len(a) for c, a in cues)
    n_real = length - inserted
    if n_real < length // 2:
        raise ValueError(f"window of {length} bytes too short for {n_keys} keys and {n_cues} cues")
    real = window[:n_real]
    starts = [0] + [m.end() for m in re.finditer(rb"\n", real[:-1])]  # line starts, in order
    half = [s for s in starts if s < n_real // 2] or [0]
    gap = min(min_gap, n_real // 4)
    if rng.random() < 0.5:
        at = [rng.choice(half)] * n_keys
    else:
        at = [rng.choice(half) for _ in range(n_keys)]
    # (offset in real text, order among inserts at that offset, bytes, answer bytes)
    inserts = [(at[k], k, assigns[k], b"") for k in range(n_keys)]
    for i, (k, (cue, answer)) in enumerate(zip(cue_keys, cues)):
        later = [s for s in starts if s >= at[k] + gap]
        if later:
            inserts.append((rng.choice(later), n_keys + i, cue, answer))
    parts, answers, pos, out_len = [], [], 0, 0
    for offset, _, text, answer in sorted(inserts):
        parts.append(real[pos:offset])
        out_len += offset - pos
        pos = offset
        parts.append(text + answer)
        out_len += len(text)
        if answer:
            answers.append((out_len, out_len + len(answer) - 1))  # the value and its quote, not the newline
        out_len += len(answer)
    parts.append(window[pos : pos + length - out_len])  # dropped cues leave room: more real text
    out = b"".join(parts)
    assert len(out) == length
    return out, answers


def planted_batch(stream: torch.Tensor, count: int, length: int, rng: random.Random):
    """``count`` planted windows of the uint8 CPU ``stream``: targets [count, length] (long) and the
    answer mask [count, length] (bool)."""
    targets = torch.empty(count, length, dtype=torch.long)
    mask = torch.zeros(count, length, dtype=torch.bool)
    for i in range(count):
        start = rng.randrange(stream.numel() - length)
        data, answers = plant(stream[start : start + length].numpy().tobytes(), length, rng)
        targets[i] = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        for a, b in answers:
            mask[i, a:b] = True
    return targets, mask
