"""Real text without any download: the Python sources of this machine's installed packages.

Roots are the standard library, the site-/dist-packages folders and any extra
folders given (the GPU kit unpacks to /tmp/site); missing ones are skipped.
A *package* is a top-level entry of a root (a folder, or a single module
file); packages of the same name in several roots are one package. The split
is by package name: ``HELD_OUT_PACKAGES`` (a fixed list) are never trained on,
and a held-out file whose exact bytes occur in a training package (a vendored
copy) or earlier in the held-out text (the same package in two roots) is
dropped. Training files are de-duplicated the same way.

A package's text is its .py files in path order, each after a one-line
``# file: <package>/<path>`` header.
"""

from __future__ import annotations

import hashlib
import os
import random
import site
import sysconfig
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional

import torch

from .byte_tokenizer import BOS

HELD_OUT_PACKAGES = ("asyncio", "email", "jinja2", "fsspec")
# Not packages (tooling, caches) or the stdlib's own tests of the held-out packages.
SKIPPED_ENTRIES = {"site-packages", "dist-packages", "__pycache__", "test", "tests"}
MAX_FILE_BYTES = 1 << 20  # larger .py files are generated tables, not code
DEFAULT_EXTRA_ROOTS = ("/tmp/site",)


def default_roots(extra: Iterable[str] = DEFAULT_EXTRA_ROOTS) -> List[str]:
    candidates = [sysconfig.get_paths()["stdlib"], *site.getsitepackages(), *extra]
    roots, seen = [], set()
    for path in candidates:
        real = os.path.realpath(path)
        if os.path.isdir(real) and real not in seen:
            seen.add(real)
            roots.append(real)
    return roots


def _package_files(roots: List[str]) -> Dict[str, List[tuple]]:
    """package name -> [(relative path, absolute path)] of its .py files, path order."""
    packages: Dict[str, List[tuple]] = {}
    for root in roots:
        for entry in sorted(os.listdir(root)):
            path = os.path.join(root, entry)
            if entry in SKIPPED_ENTRIES or entry.startswith(".") or entry.endswith((".dist-info", ".egg-info")):
                continue
            if os.path.isfile(path) and entry.endswith(".py"):
                packages.setdefault(entry[:-3], []).append((entry, path))
            elif os.path.isdir(path) and not os.path.islink(path):
                files = packages.setdefault(entry, [])
                for dirpath, dirnames, filenames in os.walk(path):
                    dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_ENTRIES)
                    for name in sorted(filenames):
                        if name.endswith(".py"):
                            full = os.path.join(dirpath, name)
                            files.append((os.path.relpath(full, root), full))
    return {name: files for name, files in packages.items() if files}


def _read_source(path: str) -> Optional[bytes]:
    try:
        if os.path.getsize(path) > MAX_FILE_BYTES:
            return None
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return None if not data.strip() or b"\x00" in data else data


@dataclass
class Corpus:
    roots: List[str]
    train: Dict[str, bytes] = field(default_factory=dict)  # package -> text
    held_out: Dict[str, bytes] = field(default_factory=dict)
    dropped_duplicates: int = 0

    def summary(self) -> dict:
        return {
            "roots": self.roots,
            "held_out_packages": {k: len(v) for k, v in self.held_out.items()},
            "train_packages": len(self.train),
            "train_bytes": sum(len(v) for v in self.train.values()),
            "largest_train_packages": dict(sorted(((k, len(v)) for k, v in self.train.items()),
                                                  key=lambda kv: -kv[1])[:12]),
            "held_out_files_dropped_as_duplicates": self.dropped_duplicates,
        }

    def train_stream(self, max_bytes: int, seed: int = 0) -> torch.Tensor:
        """All training packages (in a fixed shuffled order, up to max_bytes) as one uint8 tensor."""
        names = sorted(self.train)
        random.Random(seed).shuffle(names)
        parts, total = [], 0
        for name in names:
            if total >= max_bytes:
                break
            parts.append(self.train[name][: max_bytes - total])
            total += len(parts[-1])
        return torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8)

    def held_out_documents(self, tokens: int, count: int) -> List[dict]:
        """Up to ``count`` documents of exactly ``tokens`` ids (<|bos|> + bytes), cut from
        consecutive text of one held-out package, taking packages in turn."""
        cursors = {name: 0 for name in HELD_OUT_PACKAGES if name in self.held_out}
        docs = []
        while len(docs) < count and cursors:
            for name in list(cursors):
                text, start = self.held_out[name], cursors[name]
                if start + tokens - 1 > len(text):
                    del cursors[name]
                    continue
                chunk = text[start : start + tokens - 1]
                ids = torch.cat([torch.tensor([BOS]), torch.frombuffer(bytearray(chunk), dtype=torch.uint8).long()])
                docs.append({"package": name, "offset": start, "ids": ids})
                cursors[name] = start + tokens - 1
                if len(docs) == count:
                    break
        return docs


def _package_text(files: List[tuple], seen: set) -> tuple:
    """(text, files dropped) of a package, skipping files whose bytes are in ``seen`` (and adding the rest)."""
    parts, dropped = [], 0
    for rel, path in files:
        data = _read_source(path)
        if data is None:
            continue
        digest = hashlib.sha1(data).digest()
        if digest in seen:
            dropped += 1
            continue
        seen.add(digest)
        parts.append(f"# file: {rel}\n".encode() + data + (b"" if data.endswith(b"\n") else b"\n") + b"\n")
    return b"".join(parts), dropped


def load_corpus(roots: Optional[List[str]] = None, held_out: Iterable[str] = HELD_OUT_PACKAGES) -> Corpus:
    roots = default_roots() if roots is None else roots
    packages = _package_files(roots)
    held_out = set(held_out)
    corpus = Corpus(roots=roots)
    seen: set = set()  # file digests: training first, so held-out copies of training files drop
    for name in sorted(packages):
        if name not in held_out:
            text, _ = _package_text(packages[name], seen)
            if text:
                corpus.train[name] = text
    for name in sorted(held_out & packages.keys()):
        text, dropped = _package_text(packages[name], seen)
        corpus.dropped_duplicates += dropped
        if text:
            corpus.held_out[name] = text
    return corpus
