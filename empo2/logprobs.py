"""Log-probabilities of the action tokens of an episode, in either context.

Packed path (full history, append-only conversation): the episode's last turn
already contains every earlier turn, so one forward pass over
`final prompt + final response` yields the log-probs of all action tokens of all
turns. Per-turn path: one forward pass per turn over `prompt + response`; it is
what truncated histories need, and costs O(T²) tokens on full histories.

Only the positions that predict action tokens go through the LM head
(`logits_to_keep` with an index tensor), in chunks, so the 49k-vocabulary
logits never fill memory.
"""

from __future__ import annotations

import torch

from empo2.rollout import Episode


def _is_append_only(episode: Episode, with_tips: bool) -> bool:
    previous = []
    for turn in episode.turns:
        prompt = turn.prompt_ids if with_tips else turn.prompt_ids_tip_free
        if prompt[: len(previous)] != previous:
            return False
        previous = prompt + turn.response_ids
    return True


def sequence_logprobs(model, ids: list[int], spans: list[tuple[int, int]], *,
                      temperature: float = 1.0, chunk_size: int = 1024) -> torch.Tensor:
    """Log-probs of the tokens inside `spans` of one sequence, concatenated: (n_action_tokens,)."""
    device = next(model.parameters()).device
    input_ids = torch.tensor([ids], device=device)  # (1, L)
    targets = torch.tensor([ids[p] for start, end in spans for p in range(start, end)], device=device)  # (A,)
    predicting = torch.tensor([p - 1 for start, end in spans for p in range(start, end)], device=device)  # (A,)
    if (predicting < 0).any():
        raise ValueError("sequence_logprobs: an action token cannot be the first token of the sequence")
    # One pass through the trunk; the LM head then runs on the predicting rows only, chunk by chunk.
    out = model(input_ids=input_ids, logits_to_keep=1, output_hidden_states=True)
    hidden = out.hidden_states[-1][0, predicting]  # (A, hidden), after the final norm
    lm_head = model.get_output_embeddings()
    pieces = []
    for start in range(0, len(predicting), chunk_size):
        logits = lm_head(hidden[start : start + chunk_size]).float()  # (a, vocab)
        if temperature > 0 and temperature != 1.0:
            logits = logits / temperature
        logprobs = logits.log_softmax(dim=-1)  # (a, vocab)
        pieces.append(logprobs.gather(1, targets[start : start + chunk_size, None]).squeeze(1))  # (a,)
    return torch.cat(pieces) if pieces else torch.zeros(0, device=device)


def episode_logprobs(model, episode: Episode, *, with_tips: bool, packed: bool = True,
                     temperature: float = 1.0, chunk_size: int = 1024) -> torch.Tensor:
    """Log-probs of every action token of `episode`, turn after turn: (n_action_tokens,).

    `with_tips` picks the context (behaviour context of memory episodes, or tip-free).
    `packed` uses one forward pass when the conversation is append-only, and
    falls back to the per-turn path when it is not.
    """
    turns = episode.turns
    if packed and _is_append_only(episode, with_tips):
        last = turns[-1]
        ids = (last.prompt_ids if with_tips else last.prompt_ids_tip_free) + last.response_ids
        spans = []
        for turn in turns:
            prompt = turn.prompt_ids if with_tips else turn.prompt_ids_tip_free
            spans.append((len(prompt), len(prompt) + len(turn.response_ids)))
        return sequence_logprobs(model, ids, spans, temperature=temperature, chunk_size=chunk_size)
    pieces = []
    for turn in turns:
        prompt = turn.prompt_ids if with_tips else turn.prompt_ids_tip_free
        span = [(len(prompt), len(prompt) + len(turn.response_ids))]
        pieces.append(sequence_logprobs(model, prompt + turn.response_ids, span,
                                        temperature=temperature, chunk_size=chunk_size))
    return torch.cat(pieces)


def tokens_processed(episode: Episode, *, with_tips: bool, packed: bool) -> int:
    """How many tokens the forward pass(es) of `episode_logprobs` read."""
    if packed and _is_append_only(episode, with_tips):
        last = episode.turns[-1]
        return len(last.prompt_ids if with_tips else last.prompt_ids_tip_free) + len(last.response_ids)
    return sum(len(t.prompt_ids if with_tips else t.prompt_ids_tip_free) + len(t.response_ids)
               for t in episode.turns)
