import math

import pytest
import torch
from torch.testing import assert_close

from empo2.episode import MEMORY_ON_POLICY, MODE_NAMES, OFF_POLICY, PLAIN
from empo2.method.loss import masked_sum, policy_loss


def run(new_probs, old_probs, advantages, modes, mask=None, sequence_ids=None, **kwargs):
    """policy_loss on token probabilities; returns (loss, metrics, new_logprobs leaf with .grad)."""
    new = torch.tensor(new_probs).log().requires_grad_()
    old = torch.tensor(old_probs).log()
    adv = torch.tensor(advantages)
    modes = torch.tensor(modes)
    mask = torch.ones(len(new_probs)) if mask is None else torch.tensor(mask, dtype=torch.float32)
    seq = None if sequence_ids is None else torch.tensor(sequence_ids)
    loss, metrics = policy_loss(new, old, adv, mask, modes, seq, **kwargs)
    loss.backward()
    return loss, metrics, new


def test_mode_names():
    assert (PLAIN, MEMORY_ON_POLICY, OFF_POLICY) == (0, 1, 2)
    assert MODE_NAMES == {0: "plain", 1: "memory_on", 2: "off_policy"}


def test_masked_sum():  # the metrics are masked sums divided by their counts (`loss_metrics`)
    values = torch.tensor([1.0, float("nan"), 3.0])
    assert_close(masked_sum(values, torch.tensor([1, 0, 1])), torch.tensor(4.0))
    assert_close(masked_sum(values, torch.zeros(3)), torch.tensor(0.0))
    assert_close(masked_sum(torch.tensor([[1.0, 2.0], [3.0, 5.0]]), torch.tensor([[1, 1], [0, 1]]), dim=1),
                 torch.tensor([3.0, 5.0]))


def test_ratio_inside_clip_range_all_modes():
    # ratio 1.1 everywhere, tip-free probability 0.5 > delta: loss = mean(-A * ratio).
    loss, m, new = run([0.5, 0.5, 0.5], [0.5 / 1.1] * 3, [1.0, -1.0, 2.0], [PLAIN, MEMORY_ON_POLICY, OFF_POLICY])
    assert_close(loss, torch.tensor((-1.1 + 1.1 - 2.2) / 3))
    # d loss / d new_logprob = -A * ratio / T.
    assert_close(new.grad, torch.tensor([-1.1, 1.1, -2.2]) / 3)
    assert m["tokens"] == 3 and m["tokens/off_policy"] == 1
    for suffix in ["", "/plain", "/memory_on", "/off_policy"]:
        assert m["clip_frac" + suffix] == 0 and m["dual_clip_frac" + suffix] == 0 and m["masked_frac" + suffix] == 0
        assert_close(m["ratio_mean" + suffix], 1.1)
        assert_close(m["ratio_max" + suffix], 1.1)
        assert_close(m["approx_kl" + suffix], 0.5 * math.log(1.1) ** 2)
    assert_close(m["pg_loss/off_policy"], -2.2)
    assert "kl_ref" not in m


@pytest.mark.parametrize("mode", [PLAIN, MEMORY_ON_POLICY, OFF_POLICY])
def test_clipping(mode):
    # Token 0: ratio 2.0 > 1.3 with A > 0 -> clipped to -1.3.
    # Token 1: ratio 0.5 < 0.8 with A < 0 -> clipped to 0.8.
    # Token 2: ratio 0.5 with A > 0 -> not clipped, -0.5 (the min of the surrogates is the unclipped one).
    # Token 3: ratio 1.2 with A < 0 -> inside, 1.2.
    loss, m, new = run([0.8, 0.4, 0.4, 0.6], [0.4, 0.8, 0.8, 0.5], [1.0, -1.0, 1.0, -1.0], [mode] * 4)
    assert_close(loss, torch.tensor((-1.3 + 0.8 - 0.5 + 1.2) / 4))
    assert_close(new.grad, torch.tensor([0.0, 0.0, -0.5, 1.2]) / 4)
    assert m["clip_frac"] == 0.5 and m["clip_frac/" + MODE_NAMES[mode]] == 0.5
    assert m["dual_clip_frac"] == 0
    assert_close(m["ratio_mean"], (2.0 + 0.5 + 0.5 + 1.2) / 4)
    assert_close(m["ratio_max"], 2.0)
    assert_close(m["pg_loss"], (-1.3 + 0.8 - 0.5 + 1.2) / 4)
    assert set(k.split("/")[1] for k in m if "/" in k) == {MODE_NAMES[mode]}


def test_clip_high_and_low_are_separate():
    loss, _, _ = run([0.8], [0.4], [1.0], [PLAIN], clip_high=0.5)
    assert_close(loss, torch.tensor(-1.5))
    loss, _, _ = run([0.4], [0.8], [-1.0], [PLAIN], clip_low=0.1)
    assert_close(loss, torch.tensor(0.9))


def test_dual_clip_for_negative_advantage():
    # ratio 100 with A = -1: the surrogate says 100, the dual clip caps it at -A * 10 = 10.
    # With A = +1 the same ratio is clipped to -1.3 and the dual clip plays no part.
    loss, m, new = run([0.5, 0.5], [0.005, 0.005], [-1.0, 1.0], [OFF_POLICY, OFF_POLICY], delta=0.0)
    assert_close(loss, torch.tensor((10.0 - 1.3) / 2))
    assert_close(new.grad, torch.zeros(2))
    assert m["dual_clip_frac"] == 0.5 and m["clip_frac"] == 0.5
    assert_close(m["ratio_max"], 100.0)
    loss, m, _ = run([0.5], [0.005], [-2.0], [PLAIN], dual_clip=3.0)
    assert_close(loss, torch.tensor(6.0))
    # Just under the cap the dual clip is inactive: ratio 9 gives 9.
    loss, m, new = run([0.9], [0.1], [-1.0], [PLAIN])
    assert_close(loss, torch.tensor(9.0))
    assert m["dual_clip_frac"] == 0
    assert_close(new.grad, torch.tensor([9.0]))


def test_delta_token_mask_only_hits_low_probability_off_policy_tokens():
    # Ratio 1 everywhere, A = 1: each kept token contributes -1.
    probs = [0.5, 0.001, 0.001, 0.001]
    loss, m, new = run(probs, probs, [1.0] * 4, [OFF_POLICY, OFF_POLICY, PLAIN, MEMORY_ON_POLICY], delta=0.0067)
    # The dropped token contributes 0 but still counts in the normalizer.
    assert_close(loss, torch.tensor(-3.0 / 4))
    assert_close(new.grad, torch.tensor([-1.0, 0.0, -1.0, -1.0]) / 4)
    assert m["masked_frac"] == 0.25 and m["masked_frac/off_policy"] == 0.5
    assert m["masked_frac/plain"] == 0 and m["masked_frac/memory_on"] == 0
    assert_close(m["pg_loss/off_policy"], -0.5)


def test_delta_uses_new_not_old_probability():
    # Old probability is tiny, tip-free new probability is fine: kept (and clipped, ratio 50).
    loss, m, _ = run([0.5], [0.01], [1.0], [OFF_POLICY])
    assert_close(loss, torch.tensor(-1.3))
    assert m["masked_frac"] == 0
    # The reverse is dropped.
    loss, m, _ = run([0.001], [0.5], [1.0], [OFF_POLICY])
    assert_close(loss, torch.tensor(0.0))
    assert m["masked_frac"] == 1 and m["ratio_max"] == 0 and m["clip_frac"] == 0


def test_delta_sequence_mode_drops_whole_turn():
    probs = [0.5, 0.001, 0.5, 0.5, 0.001, 0.5]
    modes = [OFF_POLICY] * 4 + [PLAIN] * 2
    turns = [7, 7, 9, 9, 3, 3]
    loss, m, new = run(probs, probs, [1.0] * 6, modes, sequence_ids=turns, delta_mode="sequence")
    assert_close(loss, torch.tensor(-4.0 / 6))
    assert_close(new.grad, torch.tensor([0.0, 0.0, -1.0, -1.0, -1.0, -1.0]) / 6)
    assert_close(m["masked_frac/off_policy"], 0.5)
    loss, _, _ = run(probs, probs, [1.0] * 6, modes, sequence_ids=turns, delta_mode="token")
    assert_close(loss, torch.tensor(-5.0 / 6))
    loss, m, _ = run(probs, probs, [1.0] * 6, modes, sequence_ids=turns, delta_mode="none")
    assert_close(loss, torch.tensor(-1.0))
    assert m["masked_frac"] == 0


def test_padding_is_ignored_and_normalizer():
    # Token 2 is padding with a garbage log-prob ratio (e^{large}); it must not matter.
    new_probs, old_probs = [0.5, 0.5, 1.0], [0.5 / 1.1, 0.5, 1e-30]
    loss, m, new = run(new_probs, old_probs, [1.0, -2.0, 5.0], [PLAIN] * 3, mask=[1, 1, 0])
    assert_close(loss, torch.tensor((-1.1 + 2.0) / 2))
    assert_close(new.grad, torch.tensor([-1.1 / 2, 2.0 / 2, 0.0]))
    assert m["tokens"] == 2
    assert_close(m["ratio_max"], 1.1)
    loss, _, new = run(new_probs, old_probs, [1.0, -2.0, 5.0], [PLAIN] * 3, mask=[1, 1, 0], normalizer=10)
    assert_close(loss, torch.tensor((-1.1 + 2.0) / 10))
    assert_close(new.grad, torch.tensor([-1.1 / 10, 2.0 / 10, 0.0]))


def test_chunks_with_shared_normalizer_add_up_to_the_full_batch():
    probs_new, probs_old = [0.5, 0.2, 0.9, 0.3, 0.6], [0.4, 0.25, 0.3, 0.3, 0.7]
    adv, modes = [1.0, -1.0, 2.0, -0.5, 0.3], [PLAIN, OFF_POLICY, OFF_POLICY, MEMORY_ON_POLICY, PLAIN]
    full, _, full_new = run(probs_new, probs_old, adv, modes)
    first, _, new_a = run(probs_new[:2], probs_old[:2], adv[:2], modes[:2], normalizer=5)
    second, _, new_b = run(probs_new[2:], probs_old[2:], adv[2:], modes[2:], normalizer=5)
    assert_close(first + second, full)
    assert_close(torch.cat([new_a.grad, new_b.grad]), full_new.grad)


def test_kl_term():
    # ratio 1 and A = 0, so only the KL term is left. ref - new = log(0.25 / 0.5) = -log 2:
    # k3 = 0.5 + log 2 - 1; d k3 / d new = 1 - exp(ref - new) = 0.5.
    k3 = 0.5 + math.log(2.0) - 1.0
    new = torch.tensor([0.5, 0.5]).log().requires_grad_()
    ref = torch.tensor([0.25, 0.5]).log()
    args = (new, new.detach(), torch.zeros(2), torch.ones(2), torch.tensor([PLAIN, OFF_POLICY]), None)
    loss, m = policy_loss(*args, ref_logprobs=ref, kl_beta=0.1)
    loss.backward()
    assert_close(loss, torch.tensor(0.1 * k3 / 2))
    assert_close(new.grad, torch.tensor([0.1 * 0.5 / 2, 0.0]))
    assert_close(m["kl_ref"], k3 / 2)
    assert_close(m["kl_ref/plain"], k3)
    assert m["kl_ref/off_policy"] == 0
    # With kl_beta = 0 the estimate is still reported but not added.
    loss, m = policy_loss(*args, ref_logprobs=ref, kl_beta=0.0)
    assert_close(loss, torch.tensor(0.0))
    assert_close(m["kl_ref"], k3 / 2)


def test_kl_term_still_applies_to_delta_dropped_tokens():
    new = torch.tensor([0.001]).log().requires_grad_()
    ref = torch.tensor([0.002]).log()
    loss, m = policy_loss(new, new.detach(), torch.ones(1), torch.ones(1), torch.tensor([OFF_POLICY]), None,
                          ref_logprobs=ref, kl_beta=1.0)
    assert_close(loss, torch.tensor(2.0 - math.log(2.0) - 1.0))
    assert m["masked_frac"] == 1


def test_bf16_inputs_give_float32_loss():
    new = torch.tensor([0.5, 0.25]).log().to(torch.bfloat16).requires_grad_()
    loss, _ = policy_loss(new, new.detach(), torch.ones(2), torch.ones(2), torch.tensor([PLAIN, PLAIN]), None)
    loss.backward()
    assert loss.dtype == torch.float32 and new.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("kwargs, name", [
    ({"delta_mode": "turn"}, "delta_mode"),
    ({"delta_mode": "sequence"}, "sequence_ids"),
    ({"delta": 1.5}, "delta"),
    ({"clip_low": 1.0}, "clip_low"),
    ({"clip_high": -0.1}, "clip_high"),
    ({"dual_clip": 1.0}, "dual_clip"),
    ({"kl_beta": 0.1}, "ref_logprobs"),
    ({"normalizer": 0}, "normalizer"),
])
def test_bad_options_rejected(kwargs, name):
    t = torch.zeros(2)
    with pytest.raises(ValueError, match=name):
        policy_loss(t, t, t, torch.ones(2), torch.tensor([PLAIN, PLAIN]), None, **kwargs)


def test_bad_tensors_rejected():
    t = torch.zeros(2)
    with pytest.raises(ValueError, match="modes"):
        policy_loss(t, t, t, torch.ones(2), torch.tensor([PLAIN, 3]), None)
    with pytest.raises(ValueError, match="modes"):
        policy_loss(t, t, t, torch.ones(2), torch.tensor([0.0, 1.0]), None)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(t, t, torch.zeros(3), torch.ones(2), torch.tensor([PLAIN, PLAIN]), None)
    with pytest.raises(ValueError, match="new_logprobs"):
        policy_loss(torch.zeros(0), torch.zeros(0), torch.zeros(0), torch.zeros(0), torch.zeros(0).long(), None)
