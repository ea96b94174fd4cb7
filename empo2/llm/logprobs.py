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

from empo2.episode import Episode, is_forced
from empo2.llm.generation import allowed_mask, trunk_and_head, with_temperature


def _is_append_only(episode: Episode, with_tips: bool) -> bool:
    previous = []
    for turn in episode.turns:
        prompt = turn.prompt_ids if with_tips else turn.prompt_ids_tip_free
        if prompt[: len(previous)] != previous:
            return False
        previous = prompt + turn.response_ids
    return True


def sequence_logprobs(model, ids: list[int], spans: list[tuple[int, int]], *, temperature: float = 1.0,
                      allowed: list[tuple[int, ...] | None] | None = None, chunk_size: int = 1024) -> torch.Tensor:
    """Log-probs of the tokens inside `spans` of one sequence, concatenated: (n_action_tokens,).

    `allowed` (one entry per action token) renormalises each position over the
    tokens that were allowed when it was sampled (constrained decoding; None: the
    whole vocabulary). A forced position (one allowed token) is exactly 0 and
    does not go through the LM head, so it carries no gradient.
    """
    device = next(model.parameters()).device
    positions = [p for start, end in spans for p in range(start, end)]
    if allowed is not None and len(allowed) != len(positions):
        raise ValueError(f"sequence_logprobs: {len(allowed)} allowed sets for {len(positions)} action tokens")
    if any(p < 1 for p in positions):
        raise ValueError("sequence_logprobs: an action token cannot be the first token of the sequence")
    scored = [k for k in range(len(positions)) if allowed is None or not is_forced(allowed[k])]
    if not scored:
        return torch.zeros(len(positions), device=device)
    input_ids = torch.tensor([ids], device=device)  # (1, L)
    targets = torch.tensor([ids[positions[k]] for k in scored], device=device, dtype=torch.long)  # (S,)
    predicting = torch.tensor([positions[k] - 1 for k in scored], device=device, dtype=torch.long)  # (S,)
    # One pass through the trunk; the LM head then runs on the predicting rows only, chunk by chunk.
    trunk, lm_head = trunk_and_head(model)
    hidden = trunk(input_ids=input_ids).last_hidden_state[0, predicting]  # (S, hidden), after the final norm
    pieces = []
    for start in range(0, len(scored), chunk_size):
        logits = with_temperature(lm_head(hidden[start : start + chunk_size]).float(), temperature)  # (s, vocab)
        if allowed is not None:
            rows = [allowed[k] for k in scored[start : start + chunk_size]]
            if any(r is not None for r in rows):
                logits = logits + allowed_mask(rows, logits.shape[-1], device)  # (s, vocab)
        logprobs = logits.log_softmax(dim=-1)  # (s, vocab)
        pieces.append(logprobs.gather(1, targets[start : start + chunk_size, None]).squeeze(1))  # (s,)
    values = torch.cat(pieces) if pieces else hidden.new_zeros(0).float()  # (S,)
    if len(scored) == len(positions):
        return values
    full = values.new_zeros(len(positions))  # (A,) forced positions stay 0
    return full.index_copy(0, torch.tensor(scored, device=device, dtype=torch.long), values)


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


def pass_allowed(episode: Episode, spans_per_pass: list[list[tuple[int, int]]]
                 ) -> list[list[tuple[int, ...] | None] | None]:
    """The allowed sets of each forward pass's action tokens (None for a pass of free-text turns only)."""
    per_token = [allowed for turn in episode.turns for allowed in turn.allowed_sets()]
    result, first = [], 0
    for spans in spans_per_pass:
        count = sum(end - start for start, end in spans)
        piece = per_token[first : first + count]
        first += count
        result.append(piece if any(a is not None for a in piece) else None)
    return result


def episode_logprobs(model, episode: Episode, *, with_tips: bool, packed: bool = True,
                     temperature: float = 1.0, chunk_size: int = 1024) -> torch.Tensor:
    """Log-probs of every action token of `episode`, turn after turn: (n_action_tokens,).

    `with_tips` picks the context (behaviour context of memory episodes, or tip-free).
    `packed` uses one forward pass when the conversation is append-only, and
    falls back to the per-turn path when it is not. Constrained turns are scored
    under the distribution they were sampled from (renormalised over the allowed tokens).
    """
    passes = forward_passes(episode, with_tips=with_tips, packed=packed)
    allowed = pass_allowed(episode, [spans for _, spans in passes])
    return torch.cat([sequence_logprobs(model, ids, spans, temperature=temperature, allowed=sets,
                                        chunk_size=chunk_size)
                      for (ids, spans), sets in zip(passes, allowed)])


def tokens_processed(episode: Episode, *, with_tips: bool, packed: bool) -> int:
    """How many tokens the forward pass(es) of `episode_logprobs` read."""
    return sum(len(ids) for ids, _ in forward_passes(episode, with_tips=with_tips, packed=packed))


def context_tokens(episode: Episode) -> dict[str, int]:
    """The tokens `episode` carries in context, as a packed pass over its behaviour context reads them (one pass
    per turn where the conversation is not append-only): all of them ("context"), split into its actions
    ("response"), the tips shown ("tips") and the rest ("prompt": system prompt, task, observations); and the
    tip it wrote afterwards ("tip_written"), which is generated, not read again by the update."""
    context = tokens_processed(episode, with_tips=True, packed=True)
    tips = context - tokens_processed(episode, with_tips=False, packed=True)
    response = sum(len(turn.response_ids) for turn in episode.turns)
    return {"context": context, "prompt": context - response - tips, "response": response, "tips": tips,
            "tip_written": len(episode.tip_ids)}

