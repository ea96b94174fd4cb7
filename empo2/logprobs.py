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


def forward_passes(episode: Episode, *, with_tips: bool, packed: bool = True
                   ) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """The forward passes that score `episode`, in turn order: (token ids, action-token spans).

    One pass over the last turn when `packed` and the conversation is append-only,
    otherwise one pass per turn.
    """
    turns = episode.turns
    prompts = [turn.prompt_ids if with_tips else turn.prompt_ids_tip_free for turn in turns]
    if packed and _is_append_only(episode, with_tips):
        ids = prompts[-1] + turns[-1].response_ids
        spans = [(len(prompt), len(prompt) + len(turn.response_ids)) for prompt, turn in zip(prompts, turns)]
        return [(ids, spans)]
    return [(prompt + turn.response_ids, [(len(prompt), len(prompt) + len(turn.response_ids))])
            for prompt, turn in zip(prompts, turns)]


def episode_logprobs(model, episode: Episode, *, with_tips: bool, packed: bool = True,
                     temperature: float = 1.0, chunk_size: int = 1024) -> torch.Tensor:
    """Log-probs of every action token of `episode`, turn after turn: (n_action_tokens,).

    `with_tips` picks the context (behaviour context of memory episodes, or tip-free).
    `packed` uses one forward pass when the conversation is append-only, and
    falls back to the per-turn path when it is not.
    """
    return torch.cat([sequence_logprobs(model, ids, spans, temperature=temperature, chunk_size=chunk_size)
                      for ids, spans in forward_passes(episode, with_tips=with_tips, packed=packed)])


def tokens_processed(episode: Episode, *, with_tips: bool, packed: bool) -> int:
    """How many tokens the forward pass(es) of `episode_logprobs` read."""
    return sum(len(ids) for ids, _ in forward_passes(episode, with_tips=with_tips, packed=packed))
