"""Byte-level tokenizer: token id = byte value, plus <|bos|> (256) and <|eos|> (257).

Training encodes with ``encode`` (no dependency on `tokenizers`); the model
directory gets an equivalent Hugging Face tokenizer (tokenizer.json: a BPE
with the 256 byte symbols and no merges behind a ByteLevel pre-tokenizer and
decoder, so every byte is one token; a template adds <|bos|>) that
``AutoTokenizer.from_pretrained`` and SGLang load.
"""

from __future__ import annotations

import json
import os
from typing import Dict, List

BOS, EOS = 256, 257
SPECIAL_TOKENS = {"<|bos|>": BOS, "<|eos|>": EOS}
VOCAB_SIZE = 258


def encode(text: str | bytes, bos: bool = True) -> List[int]:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return ([BOS] if bos else []) + list(data)


def decode(ids) -> str:
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def byte_symbols() -> Dict[int, str]:
    """The ByteLevel pre-tokenizer's byte -> printable character map.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls,
    space, 0x7f-0xa0, 0xad) take code points 256, 257, ... in byte order.
    """
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    symbols, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return symbols


def tokenizer_json() -> dict:
    vocab = {sym: b for b, sym in byte_symbols().items()}
    added = [
        {"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for tok, i in SPECIAL_TOKENS.items()
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|bos|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<|bos|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|bos|>": {"id": "<|bos|>", "ids": [BOS], "tokens": ["<|bos|>"]}},
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def write_tokenizer_files(out_dir: str, model_max_length: int) -> None:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(), f, ensure_ascii=False)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "<|bos|>", "eos_token": "<|eos|>"}, f, indent=1)
