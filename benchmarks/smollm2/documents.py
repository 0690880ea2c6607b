"""Real long text on every machine without a download: this Python's standard-library sources.

A document is the first ``tokens`` SmolLM2 tokens of one file of the running
interpreter's standard library (``sysconfig``'s ``stdlib`` folder), so it is
fixed by the Python version, which the results record. ``DEV_FILES`` were
used to choose the retrieval task, its lengths and the CI test's slice;
``EVAL_FILES`` were never looked at before the reported run, which uses them
alone. Every file has at least 12K tokens (Python 3.11).
"""

from __future__ import annotations

import os
import sysconfig
from typing import Dict, List, Sequence

import torch

DEV_FILES = ("argparse.py", "inspect.py", "typing.py", "pydoc.py")
EVAL_FILES = ("subprocess.py", "tarfile.py", "difflib.py", "zipfile.py", "datetime.py", "pickle.py",
              "pdb.py", "dataclasses.py", "threading.py", "shutil.py", "configparser.py", "enum.py")
SPLITS = {"dev": DEV_FILES, "eval": EVAL_FILES}


def stdlib_text(name: str) -> str:
    path = os.path.join(sysconfig.get_paths()["stdlib"], name)
    with open(path, encoding="utf-8") as f:
        return f.read()


def documents(tokenizer, names: Sequence[str], tokens: int) -> List[Dict]:
    """[{"name", "ids": [tokens]}]: the first ``tokens`` tokens of each file; ValueError naming a file
    that is shorter."""
    docs = []
    for name in names:
        text = stdlib_text(name)
        ids = tokenizer(text[: tokens * 8], return_tensors="pt").input_ids[0]  # 8 chars/token: ample for code
        if ids.numel() < tokens:
            raise ValueError(f"{name} has {ids.numel()} tokens, need {tokens}")
        docs.append({"name": name, "ids": ids[:tokens].clone()})
    return docs


def stack(docs: List[Dict]) -> torch.Tensor:
    return torch.stack([d["ids"] for d in docs])
