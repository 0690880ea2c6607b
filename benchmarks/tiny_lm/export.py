"""Hugging Face model directory: bf16 safetensors under Llama names, config, tokenizer."""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file, save_file

from .byte_tokenizer import write_tokenizer_files
from .model import TinyLlama, TinyLlamaConfig

WEIGHTS = "model.safetensors"


def save_model(model: TinyLlama, out_dir: str) -> int:
    """Write the model directory; returns its size in bytes."""
    os.makedirs(out_dir, exist_ok=True)
    cfg = model.config
    tensors = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in model.hf_state_dict().items()}
    save_file(tensors, os.path.join(out_dir, WEIGHTS), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg.hf_config(), f, indent=1)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "do_sample": False}, f, indent=1)
    write_tokenizer_files(out_dir, cfg.max_position_embeddings)
    return sum(os.path.getsize(os.path.join(out_dir, n)) for n in os.listdir(out_dir))


def load_model(model_dir: str, device="cpu", dtype=torch.bfloat16) -> TinyLlama:
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = TinyLlamaConfig.from_hf_config(json.load(f))
    model = TinyLlama(cfg)
    missing, unexpected = model.load_state_dict(load_file(os.path.join(model_dir, WEIGHTS)), strict=False)
    tied = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    if set(missing) != tied or unexpected:
        raise ValueError(f"{model_dir}: missing {missing}, unexpected {unexpected}")
    return model.to(device=device, dtype=dtype).eval()
