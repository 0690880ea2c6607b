"""A Llama-architecture causal LM in plain torch, parameter names as Hugging Face's LlamaForCausalLM.

The attention step is a callable (``attend``) so that the same weights run
densely for training, record q/k/v for KV capture, or attend sparsely at
decode positions for the selector measurements. ``forward`` also takes a
per-layer KV cache so a prompt is prefilled once and decoded token by token.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TinyLlamaConfig:
    vocab_size: int = 258
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 128
    rope_theta: float = 500000.0
    max_position_embeddings: int = 65536
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    bos_token_id: int = 256
    eos_token_id: int = 257

    def hf_config(self) -> dict:
        """config.json for transformers / SGLang (LlamaForCausalLM, explicit head_dim)."""
        cfg = asdict(self)
        theta = cfg.pop("rope_theta")
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **cfg,
            "hidden_act": "silu",
            "rope_parameters": {"rope_type": "default", "rope_theta": theta},
            "attention_bias": False,
            "mlp_bias": False,
            "dtype": "bfloat16",
        }

    @classmethod
    def from_hf_config(cls, cfg: dict) -> "TinyLlamaConfig":
        rope = cfg.get("rope_parameters") or {}
        theta = rope.get("rope_theta", cfg.get("rope_theta"))
        fields = {k: cfg[k] for k in cls.__dataclass_fields__ if k in cfg and k != "rope_theta"}
        return cls(rope_theta=theta, **fields)


# (layer, q [B, Hq, Tq, d], k [B, Hkv, Tk, d], v [B, Hkv, Tk, d], q_start) -> [B, Hq, Tq, d].
# q_start is the position of the first query; keys cover positions 0..Tk-1.
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]
KVCache = List[Tuple[torch.Tensor, torch.Tensor]]

_NATIVE_GQA: Dict[torch.dtype, bool] = {}  # per dtype: does a fused CUDA kernel take GQA directly?


def _fused_sdpa(q, k, v, is_causal, mask, gqa):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    # Never the math kernel: it would materialise T x T scores.
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=gqa)


def _sdpa(q, k, v, is_causal, mask=None):
    if not q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=True)
    if q.dtype not in _NATIVE_GQA:  # probed on the first (eager) call
        try:
            out = _fused_sdpa(q, k, v, is_causal, mask, gqa=True)
            _NATIVE_GQA[q.dtype] = True
            return out
        except RuntimeError:
            _NATIVE_GQA[q.dtype] = False
    if _NATIVE_GQA[q.dtype]:
        return _fused_sdpa(q, k, v, is_causal, mask, gqa=True)
    group = q.shape[1] // k.shape[1]
    return _fused_sdpa(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), is_causal, mask, gqa=False)


def dense_attend(layer: int, q, k, v, q_start: int) -> torch.Tensor:
    """Causal attention: query at position q_start + i sees keys 0..q_start + i."""
    tq, tk = q.shape[2], k.shape[2]
    if tq == tk:
        return _sdpa(q, k, v, is_causal=True)
    if tq == 1:
        return _sdpa(q, k, v, is_causal=False)
    pos = torch.arange(q_start, q_start + tq, device=q.device)
    mask = torch.arange(tk, device=q.device)[None, :] <= pos[:, None]
    return _sdpa(q, k, v, is_causal=False, mask=mask)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """Llama (NeoX-style, rotate-half) RoPE tables [T, head_dim], float32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], -1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, d]; cos/sin [T, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        # As transformers: normalise in float32, cast back, then scale.
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig):
        super().__init__()
        self.hq, self.hkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.hq * self.d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.hkv * self.d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.hkv * self.d, bias=False)
        self.o_proj = nn.Linear(self.hq * self.d, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, layer: int, attend: Attend, cache: Optional[KVCache], q_start: int):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.hq, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.hkv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.hkv, self.d).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            if len(cache) > layer:
                k = torch.cat([cache[layer][0], k], 2)
                v = torch.cat([cache[layer][1], v], 2)
                cache[layer] = (k, v)
            else:
                cache.append((k, v))
        out = attend(layer, q, k, v, q_start)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.hq * self.d))


class MLP(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, layer, attend, cache, q_start):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, layer, attend, cache, q_start)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class TinyLlama(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig):
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_weights(self, seed: int = 0) -> None:
        """GPT-2-style: N(0, 0.02), residual-output projections scaled by 1/sqrt(2 layers)."""
        gen = torch.Generator().manual_seed(seed)
        resid_std = 0.02 / (2 * self.config.num_hidden_layers) ** 0.5
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                continue
            std = resid_std if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=gen) * std)

    def forward(
        self,
        tokens: torch.Tensor,
        attend: Attend = dense_attend,
        cache: Optional[KVCache] = None,
        q_start: int = 0,
    ) -> torch.Tensor:
        """tokens [B, T] at positions q_start..q_start+T-1 -> logits [B, T, vocab] (float32).

        With a cache (a list, filled by the first call), keys and values of
        earlier calls are kept and attended; q_start must then equal the
        cached length.
        """
        cfg = self.config
        pos = torch.arange(q_start, q_start + tokens.shape[1], device=tokens.device)
        cos, sin = rope_cos_sin(pos, cfg.head_dim, cfg.rope_theta)
        x = self.model.embed_tokens(tokens)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, i, attend, cache, q_start)
        x = self.model.norm(x)
        return self.lm_head(x).float()

    def hf_state_dict(self) -> dict:
        """Tensors under Hugging Face Llama names (lm_head omitted when tied)."""
        sd = dict(self.state_dict())
        if self.config.tie_word_embeddings:
            sd.pop("lm_head.weight")
        return sd
