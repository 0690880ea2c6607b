"""README.md for the model directory, written from train.py's log (numbers only from the log)."""

from __future__ import annotations

import math
import os


def _bpb(nats: float) -> str:
    return f"{nats:.3f} nats/byte ({nats / math.log(2):.2f} bits/byte)"


def _sampled(points: list, n: int) -> list:
    if len(points) <= n:
        return points
    return [points[round(i * (len(points) - 1) / (n - 1))] for i in range(n)]


def render(log: dict) -> str:
    cfg, corpus, final = log["config"], log["corpus"], log["held_out_final"]
    longest = max(int(k) for k in log["stages"])
    lines = [
        "# tiny-llama-pycode: a byte-level long-context Llama trained on Python sources",
        "",
        "A test model for sparse decode attention (LOCKS, issue 4): small enough to train in "
        "minutes on one GPU and to commit, with the attention shape of large models "
        f"(head_dim {cfg['head_dim']}, GQA {cfg['num_attention_heads']} query / {cfg['num_key_value_heads']} KV "
        f"heads, RoPE), trained on contexts up to {longest} tokens. "
        "Stock `transformers` (`LlamaForCausalLM`) and SGLang load it unchanged.",
        "",
        "## Architecture",
        "",
        "| | |",
        "| --- | --- |",
        f"| layers | {cfg['num_hidden_layers']} |",
        f"| hidden / MLP | {cfg['hidden_size']} / {cfg['intermediate_size']} (SiLU-gated) |",
        f"| heads | {cfg['num_attention_heads']} query, {cfg['num_key_value_heads']} KV, head_dim {cfg['head_dim']} |",
        f"| RoPE | theta {cfg['rope_parameters']['rope_theta']:g}, max positions {cfg['max_position_embeddings']} |",
        f"| vocabulary | {cfg['vocab_size']}: the 256 bytes (id = byte value), <\\|bos\\|> = 256, <\\|eos\\|> = 257 |",
        f"| parameters | {log['parameters']:,} (embeddings tied), bf16 safetensors |",
        "",
        "The tokenizer adds <|bos|> in front of every text; the model was trained with it there.",
        "",
        "## Data",
        "",
        f"The `.py` files of the Python packages installed on the training machine ({', '.join(corpus['roots'])}): "
        f"{corpus['train_packages']} training packages, {corpus['train_bytes'] / 2**20:.1f} MiB "
        f"(largest: {', '.join(f'{k} {v / 2**20:.1f} MiB' for k, v in list(corpus['largest_train_packages'].items())[:6])}). "
        "Each package's files are concatenated in path order, each after a `# file: <path>` line; training "
        "windows are random slices of that stream.",
        "",
        *([f"{log['args']['retrieval_frac']:.0%} of the windows carry planted retrieval (benchmarks/tiny_lm/planted.py): "
        "lines `NAME = \"<4-10 random letters/digits>\"` inserted into the training code and, later in the window, "
        "cues such as `assert NAME == \"` followed by the value, whose bytes weigh "
        f"{log['args']['answer_weight']:g} in the loss. The values are random, so only copying predicts them; "
        "the names are the window's own identifiers (never `SECRET`), the evaluation's `print` cue is not among "
        "the training cues.", ""] if log["args"]["retrieval_frac"] else []),
        f"Held out, never trained on (split by package name; a held-out file with the exact bytes of a training "
        f"file or of another held-out file is dropped: {corpus['held_out_files_dropped_as_duplicates']} were): "
        + ", ".join(f"`{k}` ({v / 1024:.0f} KiB)" for k, v in corpus["held_out_packages"].items()) + ".",
        "",
        "## Training",
        "",
        f"{log['device']}, torch {log['torch']}; {log['steps']} AdamW steps, {log['tokens'] / 1e6:.1f}M tokens in "
        f"{log['timings_s']['train_loop']:.0f} s (peak lr {log['args']['lr']:g}, warm-up then cosine on the share "
        f"of the time budget spent; {log['precision']}; {log['args']['tokens_per_step']} tokens per step).",
        "",
        "| context | steps | batch | tokens | seconds | tokens/s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for length, st in log["stages"].items():
        lines.append(f"| {length} | {st['steps']} | {st['batch']} | {st['tokens'] / 1e6:.1f}M | "
                     f"{st['seconds']:.0f} | {st['tokens'] / max(st['seconds'], 1e-9) / 1e3:.0f}K |")
    curve = log["held_out_curve"]
    lines += [
        "",
        f"### Loss curve (held-out: {curve['docs']} documents of {curve['context']} tokens)",
        "",
        "| step | seconds | tokens | held-out loss (nats/byte) |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for p in curve["points"]:
        lines.append(f"| {p['step']} | {p['t']:.0f} | {p['tokens'] / 1e6:.1f}M | {p['held_out_loss']:.3f} |")
    lines += ["", "Training loss (one batch each; planted-answer loss: mean over that batch's answer bytes):", "",
              "| step | context | loss | planted-answer loss |", "| ---: | ---: | ---: | ---: |"]
    for s in _sampled(log["loss_curve"], 12):
        answer = "-" if s["answer_loss"] is None else f"{s['answer_loss']:.3f}"
        lines.append(f"| {s['step']} | {s['context']} | {s['loss']:.3f} | {answer} |")
    lines += [
        "",
        f"Final held-out loss at {final['context']} tokens ({len(final['docs'])} documents): {_bpb(final['loss_nats_per_byte'])}; "
        "by target position (a falling loss further into the document means it uses long context):",
        "",
        "| positions | loss (nats/byte) |",
        "| --- | ---: |",
    ]
    lines += [f"| {k} | {v:.3f} |" for k, v in final["by_position"].items()]
    lines += [
        "",
        "Retrieval (benchmarks/tiny_lm/retrieval.py): a held-out Python context of the given length that starts "
        f"with {log['retrieval_dense'][0]['secrets']} "
        "assignments `SECRET_<j> = \"<6 random letters/digits>\"` and ends with a cue for one of them; greedy "
        "continuation, dense attention, exact match of the 6 characters (a random planted value would be right "
        f"{log['retrieval_dense'][0]['chance_random_planted_value']:.0%} of the time):",
        "",
        "| context | cue | accuracy | copied another planted value | prompts |",
        "| ---: | --- | ---: | ---: | ---: |",
    ]
    cues = {"assign": '`SECRET_k = "`', "print": '`print(SECRET_k)  # -> "`'}
    lines += [f"| {r['context']} | {cues[r['template']]} | {r['accuracy']:.2f} | {r['copied_other']:.2f} | {r['n']} |"
              for r in log["retrieval_dense"]]
    lines += [
        "",
        "## What it can and cannot do",
        "",
        "- It predicts Python source byte by byte, at the held-out loss above; how much it gains from long "
        "context shows in the loss by position, how well it recalls a value planted far back in the retrieval "
        "table (sparse-attention results: `benchmarks/results/`, issue 4).",
        "- It is far too small to write correct programs, follow instructions or know facts; it has seen only "
        f"Python sources. Contexts beyond {longest} tokens are out of its training distribution.",
        "- Use it to test long-context machinery (KV caches, sparse attention) on attention that was learned, "
        "not as a language model.",
        "",
        f"Made by `{log['command']}` (benchmarks/tiny_lm/train.py); its full log is train_log.json here.",
        "",
    ]
    return "\n".join(lines)


def write_model_card(log: dict, model_dir: str) -> None:
    with open(os.path.join(model_dir, "README.md"), "w") as f:
        f.write(render(log))
