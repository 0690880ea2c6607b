"""Train the tiny long-context Llama on this machine's Python sources within a wall-clock budget.

    python -m benchmarks.tiny_lm.train --out OUT_DIR [--minutes 8] [--curriculum 512:0.05,1024:0.1,4096:0.2,16384:0.35,32768:0.3]
        [--name tiny-llama-pycode]

Schedules run on the fraction of the time budget spent, not on a step count
(steps/s is unknown until it runs): the curriculum gives each context length
its share of the time, the learning rate warms up and decays on a cosine.
Every step has about --tokens-per-step tokens (batch = tokens // context).
A --retrieval-frac share of the windows carry planted key-value retrieval
(planted.py: random values, so only copying predicts them after their cue);
their answer bytes weigh --answer-weight in the loss.
Writes the Hugging Face directory OUT_DIR/NAME/: weights, config, tokenizer,
README.md (the model card) and train_log.json (corpus, loss curve, held-out
losses, timings).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from typing import List, Tuple

import torch
import torch.nn.functional as F

from .byte_tokenizer import BOS, VOCAB_SIZE
from .corpus import DEFAULT_EXTRA_ROOTS, default_roots, load_corpus
from .export import save_model
from .model import TinyLlama, TinyLlamaConfig
from .model_card import write_model_card
from .planted import planted_batch
from .retrieval import dense_accuracy

POSITION_BUCKETS = (0, 1024, 4096, 16384, 32768, 65536)


def parse_curriculum(text: str) -> List[Tuple[int, float]]:
    stages = [(int(a), float(b)) for a, b in (part.split(":") for part in text.split(","))]
    total = sum(share for _, share in stages)
    return [(length, share / total) for length, share in stages]


def stage_at(curriculum: List[Tuple[int, float]], frac: float) -> int:
    acc = 0.0
    for length, share in curriculum:
        acc += share
        if frac < acc:
            return length
    return curriculum[-1][0]


def lr_at(frac: float, peak: float, warmup: float, final_ratio: float) -> float:
    if frac < warmup:
        return peak * frac / warmup
    progress = min(1.0, (frac - warmup) / (1 - warmup))
    return peak * (final_ratio + (1 - final_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def sample_batch(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator):
    """Random windows: inputs <|bos|> + bytes[:-1], targets the bytes."""
    starts = torch.randint(0, stream.numel() - length, (batch,), generator=gen, device=stream.device)
    window = stream[starts[:, None] + torch.arange(length, device=stream.device)].long()
    bos = torch.full((batch, 1), BOS, dtype=torch.long, device=stream.device)
    return torch.cat([bos, window[:, :-1]], 1), window


def mix_planted(x: torch.Tensor, y: torch.Tensor, cpu_stream: torch.Tensor, frac: float, rng: random.Random):
    """Replace a random ``frac`` of the rows of (x, y) in place by planted-retrieval windows of the
    same (training) stream; returns the answer mask [B, T] over y."""
    answers = torch.zeros_like(y, dtype=torch.bool)
    rows = [i for i in range(y.shape[0]) if rng.random() < frac]
    if rows:
        targets, mask = planted_batch(cpu_stream, len(rows), y.shape[1], rng)
        idx = torch.tensor(rows, device=y.device)
        targets = targets.to(y.device)
        y[idx] = targets
        x[idx, 1:] = targets[:, :-1]
        answers[idx] = mask.to(y.device)
    return answers


@torch.no_grad()
def next_token_losses(model, ids: torch.Tensor, batch: int = 4) -> torch.Tensor:
    """Per-position loss [n_docs, T-1] of documents ids [n_docs, T] (dense attention)."""
    out = []
    for i in range(0, ids.shape[0], batch):
        x = ids[i : i + batch]
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=x.is_cuda):
            logits = model(x[:, :-1])
        out.append(F.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none"))
    return torch.cat(out)


def bucketed(losses: torch.Tensor) -> dict:
    """Mean loss by target position range, the long-context signature."""
    res = {}
    for lo, hi in zip(POSITION_BUCKETS, POSITION_BUCKETS[1:]):
        if lo < losses.shape[1]:
            res[f"{lo}-{min(hi, losses.shape[1] + 1)}"] = losses[:, lo:hi].mean().item()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tiny_lm.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", default="tiny-llama-pycode", help="model directory name under --out")
    ap.add_argument("--minutes", type=float, default=8.0, help="wall-clock budget of the training loop")
    ap.add_argument("--curriculum", default="512:0.05,1024:0.1,4096:0.2,16384:0.35,32768:0.3",
                    help="context:share-of-time stages, in order")
    ap.add_argument("--tokens-per-step", type=int, default=1 << 16)
    # A CPU model learned to copy only once the answers' share of the loss was large (weight 20, not 5).
    ap.add_argument("--retrieval-frac", type=float, default=0.5, help="share of windows with planted retrieval")
    ap.add_argument("--answer-weight", type=float, default=20.0, help="loss weight of a planted answer byte")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=float, default=0.03, help="share of the budget")
    ap.add_argument("--final-lr-ratio", type=float, default=0.05)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--rope-theta", type=float, default=500000.0)
    ap.add_argument("--max-corpus-mb", type=float, default=1024)
    ap.add_argument("--extra-roots", default=",".join(DEFAULT_EXTRA_ROOTS), help="more package folders (comma-separated)")
    ap.add_argument("--eval-every-s", type=float, default=30.0)
    ap.add_argument("--eval-docs", type=int, default=8, help="held-out documents for the loss curve (4K tokens) and the final loss (longest context)")
    ap.add_argument("--retrieval-prompts", type=int, default=32, help="dense retrieval check per context and template")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (recompiles per context length)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)

    t_start = time.time()
    dev = torch.device(args.device)
    curriculum = parse_curriculum(args.curriculum)
    longest = max(length for length, _ in curriculum)

    corpus = load_corpus(default_roots([r for r in args.extra_roots.split(",") if r]))
    cpu_stream = corpus.train_stream(int(args.max_corpus_mb * 2**20), args.seed)
    stream = cpu_stream.to(dev)
    if stream.numel() <= longest:
        raise SystemExit(f"training text {stream.numel()} bytes is shorter than the longest context {longest}")
    curve_docs = corpus.held_out_documents(min(4096, longest), args.eval_docs)
    final_docs = corpus.held_out_documents(longest, args.eval_docs)
    if not curve_docs:
        raise SystemExit(f"no held-out package text found in {corpus.roots}")
    curve_ids = torch.stack([d["ids"] for d in curve_docs]).to(dev)
    t_corpus = time.time() - t_start
    print(f"[train] corpus {stream.numel() / 2**20:.1f} MiB from {len(corpus.train)} packages, "
          f"held out {sorted(corpus.held_out)}; {t_corpus:.1f} s", flush=True)

    cfg = TinyLlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=args.hidden, intermediate_size=args.intermediate,
                          num_hidden_layers=args.layers, num_attention_heads=args.heads,
                          num_key_value_heads=args.kv_heads, head_dim=args.head_dim, rope_theta=args.rope_theta,
                          max_position_embeddings=max(65536, 2 * longest))
    torch.manual_seed(args.seed)
    model = TinyLlama(cfg)
    model.init_weights(args.seed)
    model.to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=dev.type == "cuda")
    step_fn = torch.compile(model) if args.compile else model
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    rng = random.Random(args.seed)

    budget = args.minutes * 60
    steps, curve, stages = [], [], {}
    tokens_seen, step, last_eval, last_print, recent_answer = 0, 0, -1e9, 0.0, []
    t_train = time.time()
    while True:
        elapsed = time.time() - t_train
        if elapsed >= budget:
            break
        frac = elapsed / budget
        if elapsed - last_eval >= args.eval_every_s:
            model.eval()
            held = next_token_losses(model, curve_ids).mean().item()
            model.train()
            curve.append({"step": step, "t": round(elapsed, 2), "tokens": tokens_seen, "held_out_loss": held})
            last_eval = elapsed
        length = stage_at(curriculum, frac)
        batch = max(1, args.tokens_per_step // length)
        lr = lr_at(frac, args.lr, args.warmup, args.final_lr_ratio)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = sample_batch(stream, batch, length, gen)
        answers = mix_planted(x, y, cpu_stream, args.retrieval_frac, rng)
        t_step = time.time()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = step_fn(x)
        token_loss = F.cross_entropy(logits.view(-1, cfg.vocab_size), y.view(-1), reduction="none").view_as(y)
        weights = 1 + (args.answer_weight - 1) * answers
        loss = (token_loss * weights).sum() / weights.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        # syncs: step times below are real; the logged loss is unweighted, comparable with held-out losses
        loss_value, answer_loss = torch.stack([token_loss.mean(), token_loss[answers].mean()]).tolist()
        answer_loss = None if math.isnan(answer_loss) else answer_loss
        if answer_loss is not None:
            recent_answer.append(answer_loss)
        dt = time.time() - t_step
        st = stages.setdefault(length, {"steps": 0, "tokens": 0, "seconds": 0.0, "first_step_s": dt, "batch": batch})
        st["steps"] += 1
        st["tokens"] += batch * length
        st["seconds"] += dt
        tokens_seen += batch * length
        step += 1
        steps.append({"step": step, "t": round(time.time() - t_train, 2), "context": length, "lr": lr,
                      "loss": loss_value, "answer_loss": answer_loss, "grad_norm": grad_norm.item()})
        if time.time() - last_print > 10:
            last_print = time.time()
            answer = f"{sum(recent_answer) / len(recent_answer):.3f}" if recent_answer else "-"
            recent_answer = []
            print(f"[train] {elapsed:6.0f}s step {step} ctx {length} bs {batch} lr {lr:.2e} loss {loss_value:.3f} "
                  f"planted-answer loss {answer} ({batch * length / dt / 1e3:.0f}K tok/s)", flush=True)
    t_loop = time.time() - t_train

    model.eval()
    t_eval = time.time()
    final_ids = torch.stack([d["ids"] for d in final_docs]).to(dev) if final_docs else curve_ids
    final = next_token_losses(model, final_ids, batch=1)
    curve.append({"step": step, "t": round(t_loop, 2), "tokens": tokens_seen,
                  "held_out_loss": next_token_losses(model, curve_ids).mean().item()})
    # short contexts too: they tell "never learned to copy" from "did not extend to long range"
    retrieval_contexts = sorted({min(c, longest) for c in (1024, 4096, 8192, 16384, 32768)})
    retrieval_rows = [dense_accuracy(model, corpus.held_out, c, args.retrieval_prompts, template=t, seed=args.seed)
                      for c in retrieval_contexts for t in ("assign", "print")]
    t_eval = time.time() - t_eval

    model_dir = os.path.join(args.out, args.name)
    size = save_model(model, model_dir)
    log = {
        "command": "python -m benchmarks.tiny_lm.train " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "precision": "fp32 weights, bf16 autocast" if dev.type == "cuda" else "fp32",
        "config": cfg.hf_config(),
        "parameters": n_params,
        "corpus": corpus.summary(),
        "args": vars(args),
        "steps": step,
        "tokens": tokens_seen,
        "stages": {str(k): v for k, v in stages.items()},
        "timings_s": {"corpus": t_corpus, "train_loop": t_loop, "final_eval": t_eval,
                      "total": time.time() - t_start},
        "train_loss_last_20_steps": sum(s["loss"] for s in steps[-20:]) / max(1, len(steps[-20:])),
        "held_out_curve": {"context": curve_ids.shape[1], "docs": len(curve_docs), "points": curve},
        "held_out_final": {"context": final_ids.shape[1], "docs": [(d["package"], d["offset"]) for d in final_docs],
                           "loss_nats_per_byte": final.mean().item(), "by_position": bucketed(final)},
        "retrieval_dense": retrieval_rows,
        "model_dir_bytes_without_card_and_log": size,
        "loss_curve": steps,
    }
    with open(os.path.join(model_dir, "train_log.json"), "w") as f:
        json.dump(log, f)
    write_model_card(log, model_dir)
    print(f"[train] {step} steps, {tokens_seen / 1e6:.1f}M tokens in {t_loop:.0f} s; held-out loss "
          f"{log['held_out_final']['loss_nats_per_byte']:.3f} nats/byte at {final_ids.shape[1]} "
          f"({log['held_out_final']['by_position']}); {model_dir}: {size / 2**20:.2f} MiB; total {log['timings_s']['total']:.0f} s",
          flush=True)
    for r in retrieval_rows:
        print(f"[train] dense retrieval {r['template']} @ {r['context']}: {r['accuracy']:.2f} of {r['n']} "
              f"(copied another planted value {r['copied_other']:.2f}; e.g. {r['examples'][0]})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
