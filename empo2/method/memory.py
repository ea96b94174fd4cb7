"""The tip memory: short self-written lessons, found again by state similarity.

After an episode the policy writes a one-line tip about it. The tip is stored
with the embedding of a state of that episode (the key) and the episode score.
During a memory-augmented rollout the current state is embedded and used as a
query: tips whose key has cosine similarity above a threshold are candidates,
and the `top_k` candidates with the best score are shown to the policy.

    memory = TipMemory(dim=384, capacity=1000, similarity_threshold=0.5, top_k=10)
    memory.add(key, "Tip: the bulb is in the workshop. Action: go to workshop. Score: 80", 80.0,
               scope="power-component:3")
    tips = memory.retrieve(query, scope="power-component:3")   # best score first

Entries live in separate buffers called scopes (one per task variation in the
reference release). Capacity, eviction, duplicate detection and retrieval all
act inside one scope; the insertion counter is global. Keys are L2-normalised,
so the inner product of a faiss flat index is the cosine similarity (`vectors.VectorIndex`, the
nearest-neighbour store the novelty bonus uses too).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from empo2.method.vectors import VectorIndex, unit_rows
from empo2.runs import write_atomic, write_json_atomic, write_text_atomic

_ENTRIES_FILE = "entries.jsonl"
_KEYS_FILE = "keys.npy"
_META_FILE = "meta.json"


@dataclass
class MemoryEntry:
    """One stored tip."""

    counter: int
    """Insertion order, global over scopes and increasing (never reused)."""
    key: np.ndarray
    """(dim,) float32, L2-normalised state embedding."""
    content: str
    """The tip text, with the action and score already formatted in by the caller."""
    score: float
    """Score of the episode the tip came from."""
    scope: str
    """Buffer the tip belongs to, e.g. "power-component:3" (per variation) or "power-component"."""


class _Scope:
    """The entries of one scope and an index whose row i is the key of entries[i]."""

    def __init__(self, dim: int):
        self.entries: list[MemoryEntry] = []
        self.contents: set[str] = set()
        self.keys = VectorIndex(dim)

    def append(self, entry: MemoryEntry) -> None:
        self.entries.append(entry)
        self.contents.add(entry.content)
        self.keys.add(entry.key)

    def evict_oldest(self) -> None:
        oldest = self.entries.pop(0)
        self.contents.discard(oldest.content)
        self.keys.drop_oldest()


class TipMemory:
    """Tips stored per scope, retrieved by cosine similarity then ranked by score."""

    def __init__(self, dim: int = 384, capacity: int = 1000, similarity_threshold: float = 0.5,
                 top_k: int = 10):
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        if not -1.0 <= similarity_threshold <= 1.0:
            raise ValueError(f"similarity_threshold must be in [-1, 1], got {similarity_threshold!r}")
        if not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
        self.dim = dim
        self.capacity = capacity
        self.similarity_threshold = float(similarity_threshold)
        self.top_k = top_k
        self._scopes: dict[str, _Scope] = {}
        self._next_counter = 0

    @classmethod
    def from_config(cls, cfg, dim: int) -> "TipMemory":
        """The memory `cfg` (an `EMPO2Config`) describes, for keys of `dim` (the embedder's)."""
        return cls(dim=dim, capacity=cfg.memory_capacity, similarity_threshold=cfg.similarity_threshold,
                   top_k=cfg.top_k)

    def add(self, key: np.ndarray, content: str, score: float, scope: str = "") -> bool:
        """Store one tip under `scope`, evicting that scope's oldest entry when it is full.

        Returns False (and stores nothing, counter unchanged) when the scope already
        holds a tip with exactly this content.
        """
        key = unit_rows(np.asarray(key).reshape(1, -1), self.dim, "key")[0]
        if not isinstance(content, str):
            raise ValueError(f"content must be a str, got {type(content).__name__}")
        if not isinstance(scope, str):
            raise ValueError(f"scope must be a str, got {type(scope).__name__}")
        bucket = self._scopes.get(scope)
        if bucket is not None and content in bucket.contents:
            return False
        entry = MemoryEntry(self._next_counter, key, content, float(score), scope)
        self._next_counter += 1
        self._insert(entry)
        return True

    def add_many(self, keys: np.ndarray, contents: Sequence[str], scores: Sequence[float],
                 scopes: Sequence[str]) -> int:
        """Add row i of `keys` (n, dim) with contents[i], scores[i], scopes[i], in order.

        Returns the number of tips actually added (duplicates are skipped).
        """
        keys = np.asarray(keys)
        if keys.ndim != 2:
            raise ValueError(f"keys must be 2-D (n, {self.dim}), got shape {keys.shape}")
        n = keys.shape[0]
        for name, values in (("contents", contents), ("scores", scores), ("scopes", scopes)):
            if len(values) != n:
                raise ValueError(f"{name} must have one value per key ({n}), got {len(values)}")
        return sum(self.add(keys[i], contents[i], scores[i], scopes[i]) for i in range(n))

    def retrieve(self, query: np.ndarray, scope: str = "") -> list[MemoryEntry]:
        """Tips of `scope` whose key has cosine similarity > threshold with `query` (dim,),
        then the top_k of those by score (ties: newer first), best score first."""
        query = unit_rows(np.asarray(query).reshape(1, -1), self.dim, "query")[0]  # (dim,)
        bucket = self._scopes.get(scope)
        if bucket is None or not bucket.entries:
            return []
        # The memory is small, so search every key and filter afterwards.
        similarities, positions = bucket.keys.search(query)  # (n,) each
        candidates = [bucket.entries[p] for s, p in zip(similarities, positions)
                      if p >= 0 and s > self.similarity_threshold]
        candidates.sort(key=lambda e: (e.score, e.counter), reverse=True)
        return candidates[: self.top_k]

    def __len__(self) -> int:
        """Number of entries over all scopes."""
        return sum(len(bucket.entries) for bucket in self._scopes.values())

    def entries(self, scope: str | None = None) -> list[MemoryEntry]:
        """Entries of `scope` (all scopes when None), in insertion order."""
        if scope is not None:
            bucket = self._scopes.get(scope)
            return list(bucket.entries) if bucket is not None else []
        every = [e for bucket in self._scopes.values() for e in bucket.entries]
        return sorted(every, key=lambda e: e.counter)

    def save(self, directory: str | os.PathLike) -> None:
        """Write entries.jsonl, keys.npy and meta.json into `directory`.

        Each file is written to a temporary file in the same directory and then
        moved into place with os.replace, so a crash never leaves a half-written file.
        meta.json is replaced last and records the entry count, so `load` notices
        a save that was interrupted between files.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        every = self.entries()
        keys = np.stack([e.key for e in every]) if every else np.zeros((0, self.dim), np.float32)
        lines = "".join(
            json.dumps({"counter": e.counter, "content": e.content, "score": e.score, "scope": e.scope}) + "\n"
            for e in every
        )
        meta = {"dim": self.dim, "capacity": self.capacity, "similarity_threshold": self.similarity_threshold,
                "top_k": self.top_k, "next_counter": self._next_counter, "num_entries": len(every)}
        write_text_atomic(directory / _ENTRIES_FILE, lines)
        write_atomic(directory / _KEYS_FILE, lambda f: np.save(f, keys.astype(np.float32)))
        write_json_atomic(directory / _META_FILE, meta)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "TipMemory":
        """Rebuild a memory written by `save`: same entries, keys bit-for-bit, same next counter."""
        directory = Path(directory)
        meta = json.loads((directory / _META_FILE).read_text(encoding="utf-8"))
        memory = cls(dim=meta["dim"], capacity=meta["capacity"],
                     similarity_threshold=meta["similarity_threshold"], top_k=meta["top_k"])
        keys = np.load(directory / _KEYS_FILE)
        with open(directory / _ENTRIES_FILE, encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
        if not len(records) == len(keys) == meta["num_entries"]:
            raise ValueError(f"directory holds an inconsistent memory ({len(records)} entries, "
                             f"{len(keys)} keys, meta says {meta['num_entries']})")
        for record, key in zip(records, keys):
            # Keys are stored already normalised; inserting them as-is keeps them bit-for-bit.
            memory._insert(MemoryEntry(record["counter"], key, record["content"], record["score"], record["scope"]))
        memory._next_counter = meta["next_counter"]
        return memory

    def _insert(self, entry: MemoryEntry) -> None:
        bucket = self._scopes.get(entry.scope)
        if bucket is None:
            bucket = self._scopes[entry.scope] = _Scope(self.dim)
        if len(bucket.entries) >= self.capacity:
            bucket.evict_oldest()
        bucket.append(entry)

