"""Intrinsic reward for visiting new states: r_int = coefficient / n.

Every state the agent sees is embedded. The store keeps the distinct states met so
far (per scope, e.g. per task) with a visit count. A state whose cosine similarity
with a stored state reaches the threshold counts as a visit of that state (the
most similar one); otherwise it becomes a new distinct state. The reward is
coefficient / n with n the visit count after this visit: 1 the first time, 1/2
the second, and so on. It keeps exploration (and policy entropy) up while the
extrinsic reward is still zero.

    store = NoveltyStore(dim=384, similarity_threshold=0.9, coefficient=1.0)
    rewards = store.visit(embeddings, scopes=["power-component"] * len(embeddings))   # (n,)
"""

from __future__ import annotations

import copy
from typing import Sequence

import numpy as np

from empo2.method.vectors import VectorIndex, unit_rows


class NoveltyStore:
    """Distinct states and their visit counts, per scope."""

    def __init__(self, dim: int = 384, similarity_threshold: float = 0.9, coefficient: float = 1.0):
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        if not -1.0 <= similarity_threshold <= 1.0:
            raise ValueError(f"similarity_threshold must be in [-1, 1], got {similarity_threshold!r}")
        if not coefficient >= 0.0:
            raise ValueError(f"coefficient must be >= 0, got {coefficient!r}")
        self.dim = dim
        self.similarity_threshold = float(similarity_threshold)
        self.coefficient = float(coefficient)
        self._states: dict[str, VectorIndex] = {}   # scope -> its m distinct states (unit vectors)
        self._counts: dict[str, list[int]] = {}      # scope -> their m visit counts

    def visit(self, embeddings: np.ndarray, scopes: Sequence[str] | None = None) -> np.ndarray:
        """Record a visit of each row of `embeddings` (n, dim) and return the (n,) rewards.

        Rows are processed in order, so a row can match a state added by an earlier
        row of the same call. `scopes` gives each row's scope (all "" when None).
        """
        embeddings = unit_rows(embeddings, self.dim, "embeddings")
        if scopes is None:
            scopes = [""] * len(embeddings)
        if len(scopes) != len(embeddings):
            raise ValueError(f"scopes must have one value per embedding ({len(embeddings)}), got {len(scopes)}")

        rewards = np.zeros(len(embeddings), dtype=np.float32)
        for i, (vector, scope) in enumerate(zip(embeddings, scopes)):
            if scope not in self._states:
                self._states[scope], self._counts[scope] = VectorIndex(self.dim), []
            states, counts = self._states[scope], self._counts[scope]
            best, similarity = states.nearest(vector)
            if best >= 0 and not similarity < self.similarity_threshold:
                counts[best] += 1
            else:
                states.add(vector)
                counts.append(1)
                best = len(counts) - 1
            rewards[i] = self.coefficient / counts[best]
        return rewards

    def __len__(self) -> int:
        """Number of distinct states stored, over all scopes."""
        return sum(len(counts) for counts in self._counts.values())

    def state_dict(self) -> dict:
        """Plain numpy arrays and lists (picklable with torch.save) for an exact resume."""
        names = list(self._states)
        return {
            "dim": self.dim,
            "scopes": names,
            "states": [self._states[name].matrix() for name in names],
            "counts": [np.array(self._counts[name], dtype=np.int64) for name in names],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the stored states and counts. Threshold and coefficient stay those of the constructor."""
        if state["dim"] != self.dim:
            raise ValueError(f"state must have dim {self.dim}, got {state['dim']}")
        self._states, self._counts = {}, {}
        for name, states, counts in zip(state["scopes"], state["states"], state["counts"]):
            self._states[name] = VectorIndex(self.dim)
            for vector in np.array(states, dtype=np.float32):
                self._states[name].add(vector)
            self._counts[name] = [int(n) for n in counts]


class GroupNovelty:
    """A copy of a novelty store for one group's rollout, recording its visits.

    `replay(visits, store)` then makes the same visits on the shared store, so groups played
    apart (other processes) update it exactly as if their visits had happened there, in group order.
    """

    def __init__(self, store: NoveltyStore):
        self.store = copy.deepcopy(store)
        self.visits: list[tuple[np.ndarray, list[str] | None]] = []

    def visit(self, embeddings: np.ndarray, scopes: Sequence[str] | None = None) -> np.ndarray:
        self.visits.append((np.array(embeddings, dtype=np.float32), None if scopes is None else list(scopes)))
        return self.store.visit(embeddings, scopes)

    def __len__(self) -> int:
        return len(self.store)


def replay(visits: list[tuple[np.ndarray, list[str] | None]], store: NoveltyStore) -> None:
    """Make recorded visits (`GroupNovelty.visits`) on `store`, in order."""
    for embeddings, scopes in visits:
        store.visit(embeddings, scopes)
