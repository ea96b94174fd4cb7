"""Session-wide fixtures for the real offline models (loaded once per test session)."""

import pytest
import torch


@pytest.fixture(scope="session")
def policy_and_tokenizer():
    from empo2.llm.models import load_policy

    torch.set_num_threads(2)
    return load_policy()


@pytest.fixture(scope="session")
def policy_fp32():
    """The default policy in float32, for exact-equality tests of cached vs re-encoded paths."""
    from empo2.llm.models import load_policy

    return load_policy(dtype=torch.float32)


@pytest.fixture(scope="session")
def tokenizer(policy_and_tokenizer):
    return policy_and_tokenizer[1]


@pytest.fixture(scope="session")
def embedder():
    from empo2.llm.models import Embedder

    return Embedder()
