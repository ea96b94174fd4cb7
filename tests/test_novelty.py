import pickle

import numpy as np
import pytest

from empo2.method.novelty import NoveltyStore

DIM = 4


def rows(*vectors) -> np.ndarray:
    return np.array(vectors, dtype=np.float32)


def test_repeat_visits_give_coefficient_over_n():
    store = NoveltyStore(dim=DIM, similarity_threshold=0.9, coefficient=2.0)
    np.testing.assert_allclose(store.visit(rows([1, 0, 0, 0])), [2.0])
    # Scaled copies and near copies are the same state; rows of one call see earlier rows.
    np.testing.assert_allclose(store.visit(rows([5, 0, 0, 0], [1, 0.1, 0, 0])), [1.0, 2.0 / 3.0])
    assert len(store) == 1


def test_dissimilar_state_is_new():
    store = NoveltyStore(dim=DIM, similarity_threshold=0.9)
    a, b = [1, 0, 0, 0], [0.8, 0.6, 0, 0]   # cosine 0.8 < 0.9
    np.testing.assert_allclose(store.visit(rows(a, b, a, b, [0, 0, 1, 0])), [1.0, 1.0, 0.5, 0.5, 1.0])
    assert len(store) == 3


def test_threshold_is_inclusive_and_best_match_counts():
    store = NoveltyStore(dim=DIM, similarity_threshold=0.8)
    store.visit(rows([1, 0, 0, 0], [0, 1, 0, 0]))
    # Cosine 0.8 with the first state (a match), 0.6 with the second.
    np.testing.assert_allclose(store.visit(rows([0.8, 0.6, 0, 0])), [0.5])
    np.testing.assert_allclose(store.visit(rows([1, 0, 0, 0], [0, 1, 0, 0])), [1 / 3, 1 / 2])


def test_scopes_are_isolated():
    store = NoveltyStore(dim=DIM)
    e = [1, 0, 0, 0]
    np.testing.assert_allclose(store.visit(rows(e, e, e), scopes=["x", "y", "x"]), [1.0, 1.0, 0.5])
    assert len(store) == 2


def test_zero_coefficient_still_records_visits():
    store = NoveltyStore(dim=DIM, coefficient=0.0)
    np.testing.assert_array_equal(store.visit(rows([1, 0, 0, 0], [1, 0, 0, 0])), [0.0, 0.0])
    store.coefficient = 1.0
    np.testing.assert_allclose(store.visit(rows([1, 0, 0, 0])), [1 / 3])


def test_state_dict_round_trip():
    rng = np.random.default_rng(0)
    store = NoveltyStore(dim=DIM, similarity_threshold=0.5)
    store.visit(rng.normal(size=(20, DIM)), scopes=["a", "b"] * 10)
    state = pickle.loads(pickle.dumps(store.state_dict()))
    restored = NoveltyStore(dim=DIM, similarity_threshold=0.5)
    restored.load_state_dict(state)
    assert len(restored) == len(store)
    later = rng.normal(size=(10, DIM))
    np.testing.assert_array_equal(store.visit(later, ["a", "b"] * 5), restored.visit(later, ["a", "b"] * 5))
    with pytest.raises(ValueError, match="dim"):
        NoveltyStore(dim=DIM + 1).load_state_dict(state)


def test_bad_inputs_rejected():
    store = NoveltyStore(dim=DIM)
    with pytest.raises(ValueError, match="embeddings"):
        store.visit(np.zeros((1, DIM)))
    with pytest.raises(ValueError, match="embeddings"):
        store.visit(np.ones(DIM))
    with pytest.raises(ValueError, match="scopes"):
        store.visit(np.ones((2, DIM)), scopes=["a"])
    with pytest.raises(ValueError, match="coefficient"):
        NoveltyStore(coefficient=-1.0)
    with pytest.raises(ValueError, match="similarity_threshold"):
        NoveltyStore(similarity_threshold=2.0)
    assert len(store) == 0


def test_a_group_copy_records_visits_that_replay_to_the_same_store():
    from empo2.method.novelty import GroupNovelty, replay

    rng = np.random.default_rng(0)
    shared, direct = NoveltyStore(dim=8), NoveltyStore(dim=8)
    first = rng.normal(size=(3, 8)).astype(np.float32)
    shared.visit(first)
    direct.visit(first)
    group = GroupNovelty(shared)
    later = np.concatenate([first[:1], rng.normal(size=(2, 8)).astype(np.float32)])
    rewards = group.visit(later, ["", "", ""])
    assert len(shared) == 3  # the group played on a copy
    replay(group.visits, shared)
    np.testing.assert_array_equal(rewards, direct.visit(later, ["", "", ""]))
    assert shared.state_dict()["counts"][0].tolist() == direct.state_dict()["counts"][0].tolist()


def test_the_faiss_search_pays_what_a_plain_scan_pays_on_many_near_threshold_states():
    """The store finds each state's match with the faiss index it shares with the tip memory; a plain numpy scan
    (cosine of every stored state, the first best one counts if it reaches the threshold) pays the same rewards."""
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(40, 64)).astype(np.float32)
    points = centres[rng.integers(0, 40, size=600)] + rng.normal(scale=0.3, size=(600, 64)).astype(np.float32)
    store = NoveltyStore(dim=64, similarity_threshold=0.95)
    paid = np.concatenate([store.visit(points[i : i + 8]) for i in range(0, 600, 8)])

    states, counts, plain = [], [], []
    for point in points / np.linalg.norm(points, axis=1, keepdims=True):
        similarities = np.array([state @ point for state in states])
        best = int(np.argmax(similarities)) if states else -1
        if best >= 0 and similarities[best] >= np.float32(0.95):
            counts[best] += 1
        else:
            states.append(point)
            counts.append(1)
            best = len(counts) - 1
        plain.append(1.0 / counts[best])
    assert 40 < len(store) < 600  # both new states and repeat visits happened
    np.testing.assert_array_equal(paid, np.array(plain, dtype=np.float32))
