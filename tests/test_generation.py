"""Cached lock-step generation equals re-encoding; its log-probs equal a plain forward pass.

Runs in float32 so that "equal" can mean 1e-4: in bfloat16 the two paths round
differently (differences up to ~0.2 nats were seen), which is precision, not logic.
"""

import pytest
import torch

from empo2.chat import ChatFormat, Message
from empo2.llm.generation import GroupGenerator

OBSERVATIONS = [
    ["You are in the kitchen. A door leads to the hallway.", "The door is open.", "You are in the hallway."],
    ["You are in a workshop with a red light bulb, a battery and three wires on a long table.", "Nothing.", "Done."],
    ["Outside.", "You see a bird in the tree, and a fence.", "The bird flies away."],
]


def _play(model, tokenizer, reuse_cache, row_split_ratio=2.0, layout="ragged"):
    chat = ChatFormat(tokenizer)
    generator = GroupGenerator(model, tokenizer, 3, reuse_cache=reuse_cache, temperature=0, layout=layout)
    generator.row_split_ratio = row_split_ratio
    messages = [[Message("system", "You are an agent."), Message("user", "Observation: " + obs[0])]
                for obs in OBSERVATIONS]
    outputs = []
    for turn in range(3):
        slots = [s for s in range(3) if not (s == 2 and turn == 2)]  # slot 2 ends early
        responses = generator.generate({s: chat.render(messages[s], True).ids() for s in slots}, 10)
        for s in slots:
            ids, logprobs = responses[s].ids, responses[s].logprobs
            outputs.append((s, turn, ids, logprobs))
            messages[s].append(Message("assistant", ids=ids))
            if turn < 2:
                messages[s].append(Message("user", "Observation: " + OBSERVATIONS[s][turn + 1]))
    return outputs, generator, messages


def test_cache_reuse_matches_reencoding_and_full_forward(policy_fp32):
    model, tokenizer = policy_fp32
    cached, cached_gen, messages = _play(model, tokenizer, reuse_cache=True)
    naive, naive_gen, _ = _play(model, tokenizer, reuse_cache=False)
    assert cached_gen.prefilled_tokens < 0.6 * naive_gen.prefilled_tokens
    for (s, t, ids, lps), (_, _, ids2, lps2) in zip(cached, naive):
        assert ids == ids2, f"slot {s} turn {t}: greedy tokens differ"
        torch.testing.assert_close(torch.tensor(lps), torch.tensor(lps2), atol=1e-4, rtol=0)
    chat = ChatFormat(tokenizer)
    for slot in range(3):
        rendered = chat.render(messages[slot], add_generation_prompt=False)
        ids = rendered.ids()
        with torch.no_grad():
            full = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)  # (L, vocab)
        sampled = [o for o in cached if o[0] == slot]
        for (start, end), (_, _, response, logprobs) in zip(rendered.response_spans(), sampled):
            assert ids[start:end] == response
            expected = torch.stack([full[p - 1, ids[p]] for p in range(start, end)])
            torch.testing.assert_close(torch.tensor(logprobs), expected, atol=1e-4, rtol=0)


def test_row_by_row_prefill_matches_the_padded_batch(policy_fp32):
    """Chunks run row by row on their real tokens (no padding computed) give the same tokens and log-probs."""
    model, tokenizer = policy_fp32
    batched, batched_gen, _ = _play(model, tokenizer, reuse_cache=True, row_split_ratio=1e9)
    by_row, by_row_gen, _ = _play(model, tokenizer, reuse_cache=True, row_split_ratio=0.0)
    assert by_row_gen.forward_calls > batched_gen.forward_calls  # the row-by-row path was taken
    for (s, t, ids, lps), (_, _, ids2, lps2) in zip(batched, by_row):
        assert ids == ids2, f"slot {s} turn {t}: greedy tokens differ"
        torch.testing.assert_close(torch.tensor(lps), torch.tensor(lps2), atol=1e-4, rtol=0)


@pytest.mark.parametrize("layout", ["ragged", "padded"])
def test_cache_layouts_match_the_plain_cache(policy_fp32, layout):
    """Ragged rows, or padded rows written in place, with only the asked-for slots computed, give the plain
    cache's tokens and log-probs; the ragged cache holds no holes."""
    model, tokenizer = policy_fp32
    for ratio in (1e9, 0.0):  # padded batches, and row by row
        fast, fast_gen, _ = _play(model, tokenizer, reuse_cache=True, row_split_ratio=ratio, layout=layout)
        plain, plain_gen, _ = _play(model, tokenizer, reuse_cache=True, row_split_ratio=ratio, layout="plain")
        assert fast_gen.computed_tokens < plain_gen.computed_tokens  # slot 2's idle turn is not computed
        read, real = fast_gen.cache_positions()
        plain_read, plain_real = plain_gen.cache_positions()
        assert real == plain_real < plain_read  # the plain cache has holes
        layer = fast_gen.cache.layers[0]
        if layout == "ragged":
            assert read == real and layer.length == max(len(ids) for ids in fast_gen.fed.values())
        else:
            assert layer.key_buffer.shape[2] >= layer.length == fast_gen.mask.shape[1]
        for (s, t, ids, lps), (_, _, ids2, lps2) in zip(fast, plain):
            assert ids == ids2, f"slot {s} turn {t}: greedy tokens differ"
            torch.testing.assert_close(torch.tensor(lps), torch.tensor(lps2), atol=1e-4, rtol=0)


def test_unknown_cache_layout_is_refused(policy_and_tokenizer):
    model, tokenizer = policy_and_tokenizer
    with pytest.raises(ValueError, match="layout must be one of ragged, padded, plain; got 'paged'"):
        GroupGenerator(model, tokenizer, 1, layout="paged")


def test_row_by_row_chunk_longer_than_the_cache(policy_fp32):
    """A chunk wider than everything cached so far is placed into the batched cache too."""
    model, tokenizer = policy_fp32
    short = tokenizer("Hi.", add_special_tokens=False)["input_ids"]
    long = tokenizer(" ".join(OBSERVATIONS[1]) * 3, add_special_tokens=False)["input_ids"]
    results = []
    for ratio in (1e9, 0.0):
        generator = GroupGenerator(model, tokenizer, 2, temperature=0)
        generator.row_split_ratio = ratio
        first = generator.generate({0: short, 1: short}, 2)
        prompts = {s: short + first[s].ids + (long if s == 0 else short) for s in (0, 1)}
        assert len(long) > len(short) + 2
        results.append(generator.generate(prompts, 3))
    for slot in (0, 1):
        assert results[0][slot].ids == results[1][slot].ids
        torch.testing.assert_close(torch.tensor(results[0][slot].logprobs), torch.tensor(results[1][slot].logprobs),
                                   atol=1e-4, rtol=0)


def test_non_append_only_prompt_is_refused(policy_and_tokenizer):
    model, tokenizer = policy_and_tokenizer
    generator = GroupGenerator(model, tokenizer, 1, temperature=0)
    generator.generate({0: tokenizer("hello there", add_special_tokens=False)["input_ids"]}, 2)
    try:
        generator.generate({0: tokenizer("goodbye", add_special_tokens=False)["input_ids"]}, 2)
    except ValueError as error:
        assert "append-only" in str(error)
    else:
        raise AssertionError("a rewritten prompt must be refused when the cache is reused")
