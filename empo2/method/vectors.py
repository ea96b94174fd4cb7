"""Unit vectors found again by cosine similarity: the one nearest-neighbour store behind the tip memory (keys of
tips) and the novelty bonus (distinct states).

Rows are L2-normalised before they are stored (`unit_rows`), so the inner product of a faiss flat index, an
exact search, is the cosine similarity.

    index = VectorIndex(dim=384)
    index.add(unit_rows(embeddings, 384, "embeddings")[0])
    position, similarity = index.nearest(query)        # (-1, -inf) while empty
    similarities, positions = index.search(query)      # every row, most similar first
"""

from __future__ import annotations

import faiss
import numpy as np


def unit_rows(vectors: np.ndarray, dim: int, name: str) -> np.ndarray:
    """Rows of `vectors` (n, dim) as float32 unit vectors; ValueError naming `name` on a wrong shape or a zero row."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[1] != dim:
        raise ValueError(f"{name} must have {dim} values per row, got shape {vectors.shape}")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if not np.all(np.isfinite(norms)) or np.any(norms == 0):
        raise ValueError(f"{name} must be finite and non-zero")
    return vectors / norms


class VectorIndex:
    """Unit vectors in insertion order, searched exactly by inner product (on the GPUs when faiss sees any)."""

    def __init__(self, dim: int):
        self.dim = dim
        self.index = faiss.IndexFlatIP(dim)
        if faiss.get_num_gpus() > 0:
            self.index = faiss.index_cpu_to_all_gpus(self.index)
        self.rows: list[np.ndarray] = []   # the stored (dim,) float32 vectors, row i at position i

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, vector: np.ndarray) -> None:
        """Store `vector` (dim,), a float32 unit vector, kept as it is (bit for bit) at position len(self)."""
        self.rows.append(vector)
        self.index.add(vector[None, :])

    def drop_oldest(self) -> None:
        """Remove the row at position 0; every other row moves one position down."""
        self.rows.pop(0)
        # Rebuild rather than remove_ids: GPU flat indices do not support removal, and re-adding at most a
        # memory's capacity of rows is cheap.
        self.index.reset()
        if self.rows:
            self.index.add(np.stack(self.rows))

    def search(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Cosine similarities (n,) of the unit vector `query` (dim,) with every row, most similar first, and the
        rows' positions (n,)."""
        similarities, positions = self.index.search(query[None, :], len(self.rows))  # (1, n) each
        return similarities[0], positions[0]

    def nearest(self, query: np.ndarray) -> tuple[int, np.float32]:
        """The position of the row most similar to the unit vector `query` (dim,) and its cosine similarity
        (the first such row on a tie); (-1, -inf) when empty."""
        if not self.rows:
            return -1, np.float32("-inf")
        similarities, positions = self.index.search(query[None, :], 1)  # (1, 1) each
        # A float32 similarity, compared with a threshold in float32 as numpy does with a Python float.
        return int(positions[0, 0]), similarities[0, 0]

    def __deepcopy__(self, memo) -> "VectorIndex":
        """A copy built anew from the rows (faiss's GPU indices cannot be copied as objects)."""
        twin = VectorIndex(self.dim)
        twin.rows = [row.copy() for row in self.rows]
        if twin.rows:
            twin.index.add(np.stack(twin.rows))
        return twin

    def matrix(self) -> np.ndarray:
        """The stored rows (n, dim), a copy."""
        return np.stack(self.rows) if self.rows else np.zeros((0, self.dim), np.float32)
