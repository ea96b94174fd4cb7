"""Cached lock-step generation (the ragged KV cache) equals re-encoding and a plain forward pass without any
cache, and each cache row holds exactly its own tokens' keys and values.

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


def _play(model, tokenizer, reuse_cache, row_split_ratio=2.0):
    chat = ChatFormat(tokenizer)
    generator = GroupGenerator(model, tokenizer, 3, reuse_cache=reuse_cache, temperature=0)
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


def _full_logprobs(model, ids: list[int]) -> torch.Tensor:
    """Log-probs after each position of one forward pass over `ids`, no cache: (L, vocab)."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)


def _assert_greedy_continuations_of_full_forward(model, tokenizer, outputs, messages):
    """Each sampled response is the greedy continuation, with its log-probs, of one forward pass over the whole
    conversation without any cache."""
    chat = ChatFormat(tokenizer)
    for slot in range(3):
        rendered = chat.render(messages[slot], add_generation_prompt=False)
        ids = rendered.ids()
        full = _full_logprobs(model, ids)  # (L, vocab)
        sampled = [o for o in outputs if o[0] == slot]
        assert len(rendered.response_spans()) == len(sampled)
        for (start, end), (_, turn, response, logprobs) in zip(rendered.response_spans(), sampled):
            assert ids[start:end] == response
            before = full[start - 1 : end - 1]  # (n, vocab): the distributions the response was sampled from
            assert before.argmax(-1).tolist() == response, f"slot {slot} turn {turn}: not the greedy tokens"
            expected = before.gather(1, torch.tensor(response)[:, None])[:, 0]  # (n,)
            torch.testing.assert_close(torch.tensor(logprobs), expected, atol=1e-4, rtol=0)


def test_cache_reuse_prefills_less_and_matches_reencoding_and_full_forward(policy_fp32):
    model, tokenizer = policy_fp32
    cached, cached_gen, messages = _play(model, tokenizer, reuse_cache=True)
    naive, naive_gen, _ = _play(model, tokenizer, reuse_cache=False)
    assert cached_gen.prefilled_tokens < 0.6 * naive_gen.prefilled_tokens
    for (s, t, ids, lps), (_, _, ids2, lps2) in zip(cached, naive):
        assert ids == ids2, f"slot {s} turn {t}: greedy tokens differ"
        torch.testing.assert_close(torch.tensor(lps), torch.tensor(lps2), atol=1e-4, rtol=0)
    _assert_greedy_continuations_of_full_forward(model, tokenizer, cached, messages)


@pytest.mark.parametrize("row_split_ratio", [1e9, 0.0])  # chunks in padded batches; row by row
def test_ragged_cache_matches_a_plain_forward_pass(policy_fp32, row_split_ratio):
    """Batched or row by row, with slot 2 idle in the last turn: the responses are a full forward pass's, each
    cache row holds its own tokens' keys and values (a forward pass over them alone) from position 0 and nothing
    after, and row by row computes exactly the real tokens (no padding, the idle slot not at all)."""
    model, tokenizer = policy_fp32
    outputs, generator, messages = _play(model, tokenizer, reuse_cache=True, row_split_ratio=row_split_ratio)
    _assert_greedy_continuations_of_full_forward(model, tokenizer, outputs, messages)
    real = sum(len(ids) for ids in generator.fed.values())
    if row_split_ratio == 0.0:
        assert generator.computed_tokens == real
    else:
        assert generator.computed_tokens > real  # the padding of the batched chunks
    layers = generator.cache.layers
    assert layers[0].length == max(len(ids) for ids in generator.fed.values())
    for row, slot in enumerate(generator.rows):
        fed = generator.fed[slot]
        with torch.no_grad():
            alone = model(torch.tensor([fed]), use_cache=True).past_key_values
        for ours, plain in zip(layers, alone.layers, strict=True):
            for buffer, expected in ((ours.key_buffer, plain.keys), (ours.value_buffer, plain.values)):
                torch.testing.assert_close(buffer[row, :, : len(fed)], expected[0], atol=1e-4, rtol=0)
                assert not buffer[row, :, len(fed) :].any(), f"slot {slot}: entries past its own tokens"


def test_row_by_row_chunk_longer_than_the_cache(policy_fp32):
    """A chunk wider than everything cached so far, batched or row by row, gives a plain forward pass's tokens and
    log-probs."""
    model, tokenizer = policy_fp32
    short = tokenizer("Hi.", add_special_tokens=False)["input_ids"]
    long = tokenizer(" ".join(OBSERVATIONS[1]) * 3, add_special_tokens=False)["input_ids"]
    for ratio in (1e9, 0.0):
        generator = GroupGenerator(model, tokenizer, 2, temperature=0)
        generator.row_split_ratio = ratio
        first = generator.generate({0: short, 1: short}, 2)
        prompts = {s: short + first[s].ids + (long if s == 0 else short) for s in (0, 1)}
        assert len(long) > len(short) + 2
        responses = generator.generate(prompts, 3)
        for slot in (0, 1):
            ids = prompts[slot] + responses[slot].ids
            before = _full_logprobs(model, ids)[len(prompts[slot]) - 1 : -1]  # (n, vocab) for the n response tokens
            assert before.argmax(-1).tolist() == responses[slot].ids
            expected = before.gather(1, torch.tensor(responses[slot].ids)[:, None])[:, 0]  # (n,)
            torch.testing.assert_close(torch.tensor(responses[slot].logprobs), expected, atol=1e-4, rtol=0)


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
