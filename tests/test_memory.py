import json

import numpy as np
import pytest

from empo2.method.memory import MemoryEntry, TipMemory

DIM = 8


def unit(i: int) -> np.ndarray:
    """The i-th basis vector of R^DIM."""
    v = np.zeros(DIM, np.float32)
    v[i] = 1.0
    return v


def at_cosine(c: float) -> np.ndarray:
    """A unit vector with cosine similarity c to unit(0)."""
    v = np.zeros(DIM, np.float32)
    v[0], v[1] = c, np.sqrt(1.0 - c * c)
    return v


def contents(entries: list[MemoryEntry]) -> list[str]:
    return [e.content for e in entries]


def test_add_normalises_key_and_counts():
    memory = TipMemory(dim=DIM)
    assert memory.add(3.0 * unit(0), "tip a", 10.0, scope="t:0")
    (entry,) = memory.entries("t:0")
    np.testing.assert_allclose(entry.key, unit(0))
    assert entry.key.dtype == np.float32
    assert (entry.counter, entry.content, entry.score, entry.scope) == (0, "tip a", 10.0, "t:0")
    assert len(memory) == 1 and [e.scope for e in memory.entries()] == ["t:0"]


def test_eviction_of_oldest_at_capacity():
    memory = TipMemory(dim=DIM, capacity=2, similarity_threshold=0.5)
    memory.add(unit(0), "oldest", 100.0)
    memory.add(unit(1), "middle", 1.0)
    memory.add(unit(2), "newest", 2.0)
    assert contents(memory.entries("")) == ["middle", "newest"]
    assert [e.counter for e in memory.entries("")] == [1, 2]
    # The index no longer holds the evicted key: a query equal to it finds nothing.
    assert memory.retrieve(unit(0)) == []
    assert contents(memory.retrieve(unit(1))) == ["middle"]
    assert contents(memory.retrieve(unit(2))) == ["newest"]
    assert memory._scopes[""].keys.index.ntotal == 2


def test_capacity_is_per_scope():
    memory = TipMemory(dim=DIM, capacity=1)
    memory.add(unit(0), "a", 1.0, scope="x")
    memory.add(unit(0), "b", 1.0, scope="y")
    assert len(memory) == 2
    memory.add(unit(0), "c", 1.0, scope="x")
    assert contents(memory.entries("x")) == ["c"] and contents(memory.entries("y")) == ["b"]


def test_duplicate_content_skipped_within_scope_only():
    memory = TipMemory(dim=DIM)
    assert memory.add(unit(0), "same", 1.0, scope="x")
    assert not memory.add(unit(1), "same", 5.0, scope="x")
    assert memory.add(unit(1), "same", 5.0, scope="y")
    assert memory.add(unit(1), "other", 5.0, scope="x")
    # The skipped add did not advance the counter.
    assert [e.counter for e in memory.entries()] == [0, 1, 2]
    assert memory.add_many(np.stack([unit(2), unit(3)]), ["same", "new"], [1.0, 2.0], ["x", "x"]) == 1


def test_evicted_content_can_be_added_again():
    memory = TipMemory(dim=DIM, capacity=1)
    memory.add(unit(0), "a", 1.0)
    memory.add(unit(1), "b", 1.0)
    assert memory.add(unit(2), "a", 1.0)


def test_threshold_is_strict_and_filters():
    memory = TipMemory(dim=DIM, similarity_threshold=0.5)
    memory.add(at_cosine(0.499), "below", 50.0)
    memory.add(at_cosine(0.501), "above", 1.0)
    assert contents(memory.retrieve(unit(0))) == ["above"]


def test_top_k_by_score_not_similarity():
    memory = TipMemory(dim=DIM, similarity_threshold=0.5, top_k=2)
    memory.add(at_cosine(0.99), "closest, low score", 1.0)
    memory.add(at_cosine(0.6), "far, high score", 90.0)
    memory.add(at_cosine(0.7), "mid, mid score", 50.0)
    memory.add(at_cosine(0.8), "mid, mid score, newer", 50.0)
    memory.add(at_cosine(0.3), "too far, best score", 100.0)
    assert contents(memory.retrieve(unit(0))) == ["far, high score", "mid, mid score, newer"]
    memory.top_k = 10
    assert contents(memory.retrieve(unit(0))) == [
        "far, high score", "mid, mid score, newer", "mid, mid score", "closest, low score"]


def test_scope_isolation():
    memory = TipMemory(dim=DIM)
    memory.add(unit(0), "x tip", 1.0, scope="x")
    memory.add(unit(0), "y tip", 2.0, scope="y")
    assert contents(memory.retrieve(unit(0), scope="x")) == ["x tip"]
    assert memory.retrieve(unit(0), scope="z") == []
    batch = [memory.retrieve(q, s) for q, s in zip([unit(0), unit(0), unit(1), unit(0)], ["y", "x", "x", "z"])]
    assert [contents(r) for r in batch] == [["y tip"], ["x tip"], [], []]


def test_save_load_exact_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    memory = TipMemory(dim=DIM, capacity=3, similarity_threshold=0.2, top_k=2)
    keys = rng.normal(size=(8, DIM)).astype(np.float32)
    scopes = ["a", "b", "a", "a", "b", "a", "b", "b"]
    memory.add_many(keys, [f"tip {i}" for i in range(8)], [float(i % 3) + 0.1 for i in range(8)], scopes)
    memory.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entries.jsonl", "keys.npy", "meta.json"]
    first = json.loads((tmp_path / "entries.jsonl").read_text().splitlines()[0])
    assert set(first) == {"counter", "content", "score", "scope"}

    loaded = TipMemory.load(tmp_path)
    assert (loaded.dim, loaded.capacity, loaded.similarity_threshold, loaded.top_k) == (DIM, 3, 0.2, 2)
    assert len(loaded) == len(memory) == 6
    for old, new in zip(memory.entries(), loaded.entries()):
        assert (old.counter, old.content, old.score, old.scope) == (new.counter, new.content, new.score, new.scope)
        assert np.array_equal(old.key, new.key) and new.key.dtype == np.float32
    queries = rng.normal(size=(5, DIM)).astype(np.float32)
    for scope in ["a", "b"]:
        assert [contents(memory.retrieve(q, scope)) for q in queries] == \
               [contents(loaded.retrieve(q, scope)) for q in queries]
    # The next counter carries over, and eviction continues from the same state.
    memory.add(unit(0), "after", 1.0, scope="a")
    loaded.add(unit(0), "after", 1.0, scope="a")
    assert [(e.counter, e.content) for e in memory.entries()] == [(e.counter, e.content) for e in loaded.entries()]


def test_save_overwrites_and_empty_round_trip(tmp_path):
    memory = TipMemory(dim=DIM)
    memory.add(unit(0), "a", 1.0)
    memory.save(tmp_path)
    empty = TipMemory(dim=DIM)
    assert len(empty) == 0 and empty.retrieve(unit(0)) == []
    empty.save(tmp_path)  # overwrites the saved entry
    loaded = TipMemory.load(tmp_path)
    assert len(loaded) == 0
    assert loaded.add(unit(0), "a", 1.0) and loaded.entries()[0].counter == 0  # an empty memory starts at 0
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_load_rejects_inconsistent_files(tmp_path):
    memory = TipMemory(dim=DIM)
    memory.add(unit(0), "a", 1.0)
    memory.save(tmp_path)
    (tmp_path / "entries.jsonl").write_text("")
    with pytest.raises(ValueError, match="inconsistent"):
        TipMemory.load(tmp_path)


@pytest.mark.parametrize("kwargs, name", [
    ({"dim": 0}, "dim"), ({"capacity": 0}, "capacity"),
    ({"similarity_threshold": 1.5}, "similarity_threshold"), ({"top_k": 0}, "top_k"),
])
def test_bad_config_rejected(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TipMemory(**kwargs)


def test_bad_inputs_rejected():
    memory = TipMemory(dim=DIM)
    with pytest.raises(ValueError, match="key"):
        memory.add(np.zeros(DIM), "tip", 1.0)
    with pytest.raises(ValueError, match="key"):
        memory.add(np.ones(DIM + 1), "tip", 1.0)
    with pytest.raises(ValueError, match="content"):
        memory.add(unit(0), None, 1.0)
    with pytest.raises(ValueError, match="query"):
        memory.retrieve(np.zeros(DIM))
    with pytest.raises(ValueError, match="scores"):
        memory.add_many(np.stack([unit(0), unit(1)]), ["a", "b"], [1.0], ["", ""])
    assert len(memory) == 0
