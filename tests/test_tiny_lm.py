"""The tiny LM's own torch module against transformers' LlamaForCausalLM on the saved directory,
its tokenizer against AutoTokenizer, and the sparse decode path against dense attention."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root: benchmarks.tiny_lm

from benchmarks.tiny_lm import byte_tokenizer  # noqa: E402
from benchmarks.tiny_lm.model import TinyLlama, TinyLlamaConfig  # noqa: E402

TINY = TinyLlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=32, max_position_embeddings=4096)


def _random_model(cfg=TINY, seed=0):
    torch.manual_seed(seed)
    model = TinyLlama(cfg)
    model.init_weights(seed)
    with torch.no_grad():  # non-trivial norms so a swapped or ignored weight shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model.eval()


def _bf16_exact(model):
    """Round weights to bf16 (what the directory stores) so both sides see the same numbers."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return model


def test_saved_model_matches_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")  # brings safetensors, which export needs
    from benchmarks.tiny_lm.export import load_model, save_model

    model = _bf16_exact(_random_model())
    save_model(model, str(tmp_path))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert hf.config.head_dim == TINY.head_dim != TINY.hidden_size // TINY.num_attention_heads
    ids = torch.tensor([byte_tokenizer.encode("def f(x):\n    return x + 1\n" * 6)])
    with torch.no_grad():
        ours = model(ids)
        theirs = hf(ids).logits.float()
    assert ours.shape == theirs.shape == (1, ids.shape[1], TINY.vocab_size)
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)
    reloaded = load_model(str(tmp_path), dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids), ours, atol=1e-5, rtol=1e-5)


def test_tokenizer_is_bytes_plus_bos(tmp_path):
    transformers = pytest.importorskip("transformers")
    byte_tokenizer.write_tokenizer_files(str(tmp_path), 4096)
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    text = "x = 'héllo ✓'\n\tprint(x)  # \x00 end "
    ids = tok(text)["input_ids"]
    assert ids == byte_tokenizer.encode(text) and ids[0] == tok.bos_token_id == byte_tokenizer.BOS
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert len(tok) == TINY.vocab_size and tok.eos_token_id == byte_tokenizer.EOS


def test_cached_decode_equals_full_forward():
    model = _random_model()
    ids = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        full = model(ids)
        cache = []
        pre = model(ids[:, :30], cache=cache)
        step = [model(ids[:, t : t + 1], cache=cache, q_start=t) for t in range(30, 35)]
        chunk = model(ids[:, 35:], cache=cache, q_start=35)
    got = torch.cat([pre, *step, chunk], 1)
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)


def test_per_head_recall_matches_sglang_evaluate():
    from benchmarks.tiny_lm.selector_metrics import recall_and_error
    from sglang_locks.evaluate import evaluate
    from sglang_locks.synthetic import structured_kv

    data = structured_kv(tokens=1000, kv_heads=2, group=4, head_dim=32, queries=6, seed=3)  # 1000: a 8-token tail
    budgets = [48, 128, 256]
    for spec in ("locks", "quest", "shared", "oracle"):
        ours = recall_and_error(spec, data["keys"], data["queries"], data["values"], budgets)
        for row in evaluate(data, budgets, [spec]):
            b = row["budget"]
            assert ours[b]["recall"].shape == (2,)
            assert ours[b]["recall"].mean().item() == pytest.approx(row["recall"], abs=1e-5)
            assert ours[b]["rel_error"].mean().item() == pytest.approx(row["rel_error"], abs=1e-4)


def test_decode_mask_is_causal_budgeted_and_oracle_is_best():
    from benchmarks.tiny_lm.sparse_attention import Policy, decode_token_mask
    from sglang_locks.selectors import make_selector

    torch.manual_seed(0)
    n, hkv, group, d = 400, 2, 4, 32
    keys, q = torch.randn(n, hkv, d) * 2, torch.randn(9, hkv * group, d) * 2
    positions = torch.tensor([15, 47, 100, 160, 200, 255, 300, 350, 399])
    cfg = Policy("oracle", budget=80).config  # 5 pages: sink + local + 3 chosen
    probs = torch.softmax((torch.einsum("mhd,nhd->mhn", q, keys.repeat_interleave(group, 1)) * d**-0.5)
                          .masked_fill(torch.arange(n)[None, None] > positions[:, None, None], float("-inf")), -1)
    recalls = {}
    for spec in ("oracle", "locks", "quest", "shared"):
        sel = make_selector(spec)
        sel.prepare(keys, d**-0.5)
        mask = decode_token_mask(sel.head_scores(q), positions, n, hkv, cfg)
        for i, pos in enumerate(positions.tolist()):
            sealed = (pos + 1) // 16
            assert not mask[i, :, pos + 1 :].any()  # causal
            assert mask[i, :, sealed * 16 : pos + 1].all()  # unsealed tail
            pages = mask[i, :, : sealed * 16].view(hkv, sealed, 16)
            assert (pages.all(-1) == pages.any(-1)).all()  # whole pages
            assert (pages.all(-1).sum(-1) == min(sealed, cfg.budget_pages)).all()
            if sealed > cfg.budget_pages:
                assert pages[:, 0].all() and pages[:, sealed - 1].all()  # sink and local page forced
        recalls[spec] = (probs * mask.repeat_interleave(group, 1)).sum(-1).view(9, hkv, group).mean(-1)
    for spec in ("locks", "quest", "shared"):
        assert (recalls["oracle"] >= recalls[spec] - 1e-6).all()
    assert (recalls["quest"] < recalls["oracle"] - 1e-3).any()  # the budget binds: selectors differ


def test_sparse_decode_path():
    from benchmarks.tiny_lm.sparse_attention import DENSE, Policy, SparseDecodeAttend

    model = _random_model()
    ids = torch.randint(0, 256, (2, 300))
    with torch.no_grad():
        full = model(ids)[:, 200:]
        cache = []
        model(ids[:, :200], cache=cache)

        def chunk(policy, **kw):
            return model(ids[:, 200:], attend=SparseDecodeAttend(policy, **kw), cache=list(cache), q_start=200)

        torch.testing.assert_close(chunk(Policy(DENSE), query_chunk=7), full, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(chunk(Policy("locks", budget=512)), full, atol=1e-4, rtol=1e-4)  # all pages fit
        sparse = chunk(Policy("quest", budget=48))
        assert (sparse - full).abs().max() > 1e-3
        # sequences folded into heads are selected independently: the second alone gives the same
        alone = []
        model(ids[1:, :200], cache=alone)
        second = model(ids[1:, 200:], attend=SparseDecodeAttend(Policy("quest", budget=48)), cache=alone, q_start=200)
        torch.testing.assert_close(second, sparse[1:], atol=1e-4, rtol=1e-4)


def test_retrieval_prompts():
    from benchmarks.tiny_lm import retrieval

    held = {"pkg_a": b"def f():\n    return 1\n" * 200, "pkg_b": b"x = [1, 2]\n" * 400}
    prompts = retrieval.make_prompts(held, 1024, 4, n_secrets=3, template="print", seed=1)
    again = retrieval.make_prompts(held, 1024, 4, n_secrets=3, template="print", seed=1)
    assert all(torch.equal(a["ids"], b["ids"]) for a, b in zip(prompts, again))
    for p in prompts:
        text = byte_tokenizer.decode(p["ids"].tolist())
        assert p["ids"].shape == (1024,) and p["ids"][0] == byte_tokenizer.BOS
        assert f'SECRET_{p["key"]} = "{p["answer"]}"\n' in text[:200]
        assert text.endswith(f'print(SECRET_{p["key"]})  # -> "') and p["answer"] in p["values"]
    score = retrieval.score(prompts, [prompts[0]["answer"] + '"\n', prompts[1]["values"][(prompts[1]["key"] + 1) % 3],
                                      "zzzzzz", ""])
    assert score["accuracy"] == 0.25 and score["copied_other"] == 0.25 and score["n"] == 4


def test_page_local_energy():
    from benchmarks.tiny_lm.lowrank import energy_fractions
    from sglang_locks.synthetic import structured_kv

    keys = structured_kv(tokens=2048, kv_heads=2, head_dim=64, queries=1, page_rank=2, key_noise=0.0)["keys"]
    res = energy_fractions(keys)
    assert min(res["per_page"]["2"]) > 0.999  # each page spans its own 2 directions
    assert max(res["shared"]["8"]) < 0.5  # 128 pages x 2 random directions: no small shared basis
    in_shared_subspace = torch.einsum("nhr,hrd->nhd", torch.randn(2048, 2, 8), torch.randn(2, 8, 64))
    res = energy_fractions(in_shared_subspace)
    assert min(res["shared"]["8"]) > 0.999 and res["shared_layer"]["8"] < 0.9 < res["shared_layer"]["32"]


def test_corpus_split_by_package(tmp_path):
    from benchmarks.tiny_lm.corpus import default_roots, load_corpus

    r1, r2 = tmp_path / "lib", tmp_path / "site"
    for path, text in {r1 / "pkg_a" / "a.py": "A = 1\n", r1 / "asyncio" / "x.py": "shared = 2\n",
                       r1 / "asyncio" / "sub" / "y.py": "Y = 3\n", r2 / "mod_b.py": "B = 4\n",
                       r2 / "pkg_c" / "copy.py": "shared = 2\n", r2 / "pkg_c" / "data.bin": "no",
                       r2 / "asyncio" / "sub" / "y.py": "Y = 3\n"}.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    roots = default_roots([str(r1), str(tmp_path / "missing"), str(r2)])
    assert str(r1) in roots and str(r2) in roots and str(tmp_path / "missing") not in roots
    corpus = load_corpus([str(r1), str(r2)], held_out=("asyncio",))
    assert set(corpus.train) == {"pkg_a", "mod_b", "pkg_c"} and set(corpus.held_out) == {"asyncio"}
    # x.py is a copy of a training file, the second y.py a copy of the first
    assert corpus.held_out["asyncio"] == b"# file: asyncio/sub/y.py\nY = 3\n\n"
    assert corpus.dropped_duplicates == 2


def test_server_client_scores_generate_replies():
    import http.server
    import json
    import threading

    from benchmarks.tiny_lm import retrieval
    from benchmarks.tiny_lm.retrieval_server import run_prompts

    held = {"pkg": b"import os\n" * 300}
    prompts = retrieval.make_prompts(held, 512, 3, n_secrets=2, seed=2)
    answers = {tuple(p["ids"].tolist()): p["answer"] for p in prompts}

    class Generate(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # answers the first two prompts right, the third wrong
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert body["sampling_params"]["temperature"] == 0.0
            replies = [answers[tuple(ids)] if i < 2 else "wrong!" for i, ids in enumerate(body["input_ids"])]
            data = json.dumps([{"text": r, "output_ids": list(r.encode())} for r in replies]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Generate)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rows = run_prompts(f"http://127.0.0.1:{server.server_port}", {(512, "assign"): prompts})
    finally:
        server.shutdown()
    assert rows[0]["accuracy"] == pytest.approx(2 / 3) and rows[0]["context"] == 512


def test_folded_recall_rows_match_per_layer_and_doc():
    from benchmarks.tiny_lm.measure import measure_recall
    from benchmarks.tiny_lm.selector_metrics import recall_and_error

    torch.manual_seed(1)
    layers = [{"keys": torch.randn(2, 320, 2, 32) * (1 + l), "values": torch.randn(2, 320, 2, 32),
               "queries": torch.randn(2, 4, 8, 32) * 2} for l in range(3)]  # 3 layers, 2 docs
    rows = measure_recall(layers, ["quest"], [64], 320, ["d0", "d1"])
    assert len(rows) == 3 * 2 * 2
    for r in rows:
        i = int(r["doc"][1])
        kv = layers[r["layer"]]
        alone = recall_and_error("quest", kv["keys"][i], kv["queries"][i], kv["values"][i], [64])[64]
        assert r["recall"] == pytest.approx(alone["recall"][r["kv_head"]].item(), abs=1e-6)
        assert r["rel_error"] == pytest.approx(alone["rel_error"][r["kv_head"]].item(), abs=1e-5)


def _planted_corpus(tmp_path):
    """Training packages of real stdlib code and a held-out package whose every line carries a marker."""
    import json.decoder
    import random as random_module

    from benchmarks.tiny_lm.corpus import load_corpus

    for name, module in {"pkg_a": random_module, "pkg_b": json.decoder}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "m.py").write_bytes(open(module.__file__, "rb").read())
    (tmp_path / "asyncio").mkdir()
    (tmp_path / "asyncio" / "h.py").write_text("".join(f"HELDOUT_{i} = held_out_call({i})\n" for i in range(3000)))
    return load_corpus([str(tmp_path)], held_out=("asyncio",))


def test_planted_answers_are_earlier_assignments_of_training_text(tmp_path):
    import random
    import re

    from benchmarks.tiny_lm.planted import TRAIN_CUES, planted_batch

    corpus = _planted_corpus(tmp_path)
    stream = corpus.train_stream(1 << 30)
    assert set(corpus.held_out) == {"asyncio"} and b"HELDOUT" not in stream.numpy().tobytes()
    cue_patterns = [re.escape(c).replace(re.escape("{name}"), r"(\w+)").encode() for c in TRAIN_CUES]
    rng, n_answers = random.Random(0), 0
    for length in (256, 512, 1024, 4096):
        targets, mask = planted_batch(stream, 24, length, rng)
        assert targets.shape == mask.shape == (24, length) and targets.max() < 256
        for row, row_mask in zip(targets, mask):
            out = bytes(row.tolist())
            assert b"HELDOUT" not in out and b"held_out_call" not in out and b"SECRET" not in out
            spans = []  # runs of the answer mask
            for i in row_mask.nonzero().flatten().tolist():
                if spans and spans[-1][1] == i:
                    spans[-1][1] = i + 1
                else:
                    spans.append([i, i + 1])
            for start, end in spans:
                answer = out[start:end]
                value = answer[:-1]
                assert answer.endswith(b'"') and re.fullmatch(rb"[A-Za-z0-9]{4,10}", value)
                line_start = out.rfind(b"\n", 0, start) + 1
                cue = out[line_start:start]
                names = [m.group(1) for p in cue_patterns if (m := re.fullmatch(p, cue))]
                assert len(names) == 1, cue
                name = names[0]
                assignment = name + b' = "' + value + b'"\n'
                first = (b"\n" + out).find(b"\n" + assignment)  # start of the first such line
                assert 0 <= first and line_start - first >= min(256, length // 8)  # at least min_gap back
                # every earlier quoted assignment of this name has this value: the answer is unique
                assert set(re.findall(rb"(?:^|\n)" + re.escape(name) + rb' = "(\w*)"', out[:line_start])) == {value}
                n_answers += 1
    assert n_answers >= 4 * 24  # every window has at least one cue


def test_planted_values_are_random(tmp_path):
    import random
    import string

    from benchmarks.tiny_lm.planted import plant

    text = _planted_corpus(tmp_path).train_stream(1 << 30).numpy().tobytes()
    assert plant(text[:512], 512, random.Random(5)) == plant(text[:512], 512, random.Random(5))
    values = []
    rng = random.Random(1)
    for i in range(3000):
        start = i * 97 % (len(text) - 256)
        out, answers = plant(text[start : start + 256], 256, rng)
        values += [out[a : b - 1].decode() for a, b in answers]
    assert len(values) > 2900 and len(set(values)) > 0.99 * len(values)  # 62**4 and up: repeats are rare
    assert {len(v) for v in values} == set(range(4, 11))
    firsts = [v[0] for v in values]
    counts = [firsts.count(c) for c in string.ascii_letters + string.digits]
    assert min(counts) > 0 and max(counts) < 2.5 * len(firsts) / 62  # close to uniform over the alphabet


def test_mix_planted_replaces_rows_consistently():
    import random

    from benchmarks.tiny_lm.train import mix_planted, sample_batch

    stream = torch.frombuffer(bytearray(b"def f(alpha, beta):\n    return alpha + beta\n" * 400), dtype=torch.uint8)
    gen = torch.Generator().manual_seed(0)
    x, y = sample_batch(stream, 16, 512, gen)
    x0, y0 = x.clone(), y.clone()
    assert not mix_planted(x, y, stream, 0.0, random.Random(0)).any() and torch.equal(y, y0)
    answers = mix_planted(x, y, stream, 0.5, random.Random(0))
    changed = (y != y0).any(1)
    assert 0 < changed.sum() < 16 and torch.equal(answers.any(1), changed)
    assert torch.equal(x[:, 1:], y[:, :-1]) and (x[:, 0] == byte_tokenizer.BOS).all()
    assert torch.equal(x[~changed], x0[~changed])
