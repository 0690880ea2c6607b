"""Load a model directory with transformers (AutoTokenizer, AutoModelForCausalLM) and compare its
logits and greedy tokens with the project's own torch module on held-out text.

    python -m benchmarks.tiny_lm.check_hf --model DIR [--tokens 4096]

Prints one JSON line; exits 1 if the two disagree beyond bf16 rounding.
"""

from __future__ import annotations

import argparse
import json

import torch

from .corpus import DEFAULT_EXTRA_ROOTS, default_roots, load_corpus
from .export import load_model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tiny_lm.check_hf", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--extra-roots", default=",".join(DEFAULT_EXTRA_ROOTS))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    corpus = load_corpus(default_roots([r for r in args.extra_roots.split(",") if r]))
    doc = corpus.held_out_documents(args.tokens, 1)[0]
    tok = AutoTokenizer.from_pretrained(args.model)
    ids = doc["ids"][None]
    # The document may be cut inside a UTF-8 character: compare on its decodable part.
    text = bytes(doc["ids"][1:].tolist()).decode("utf-8", errors="ignore")
    tokenizer_ok = tok(text)["input_ids"] == [tok.bos_token_id] + list(text.encode())
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(args.device).eval()
    ours = load_model(args.model, args.device, torch.float32)
    with torch.no_grad():
        a = ours(ids.to(args.device))
        b = hf(ids.to(args.device)).logits.float()
    diff = (a - b).abs().max().item()
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    ok = diff < 1e-2 and agree > 0.999 and tokenizer_ok
    print(json.dumps({"model": args.model, "tokens": ids.shape[1], "max_abs_logit_diff": diff,
                      "greedy_agreement": agree, "tokenizer_matches_bytes": tokenizer_ok,
                      "hf_class": type(hf).__name__, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
