import pytest
import torch
from torch.testing import assert_close

from empo2.method.advantages import grpo_advantages


def test_grpo_advantages_hand_computed():
    # Mean 10; deviations -10, -10, 0, 20; squares sum to 600; unbiased variance 600 / 3 = 200.
    adv = grpo_advantages(torch.tensor([0.0, 0.0, 10.0, 30.0]))
    std = 200.0 ** 0.5 + 1e-6
    assert_close(adv, torch.tensor([-10.0 / std, -10.0 / std, 0.0, 20.0 / std]))


def test_two_returns_and_integer_input():
    assert_close(grpo_advantages(torch.tensor([1, 3])), torch.tensor([-1.0, 1.0]) / (2.0 ** 0.5 + 1e-6))


def test_equal_returns_give_zeros():
    assert_close(grpo_advantages(torch.full((8,), -100.0)), torch.zeros(8))


def test_bad_returns_rejected():
    with pytest.raises(ValueError, match="returns"):
        grpo_advantages(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="returns"):
        grpo_advantages(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="eps"):
        grpo_advantages(torch.zeros(2), eps=0.0)

