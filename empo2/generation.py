"""Lock-step batched sampling for a group of conversations that share one KV cache.

A group of N episodes is advanced together. Every conversation only grows at
its end, so the cache built for step t is still valid at step t+1: each call
prefills only the tokens added since the previous call (the sampled response's
last token, the new observation, tips where shown) instead of re-reading the
whole history. With full history this turns O(T²) prompt tokens per episode into
O(T).

Layout of the batched cache (one row per episode, "slot"):

    row 0: [turn-1 prompt][resp][pad][turn-2 chunk][resp][pad] ...
    row 1: [pad][turn-1 prompt][resp][turn-2 chunk][pad][resp] ...

New chunks are left-padded so every row's last position is a real token and one
logit row per slot is enough; padding holes are masked out through the 2-D
attention mask, and `position_ids` count real tokens only, so each row sees
exactly the positions it would see alone. `reuse_cache=False` is the naive way
(re-encode every prompt from scratch each call) kept for truncated histories and
for the benchmark.
"""

from __future__ import annotations

import inspect

import torch


class GroupGenerator:
    """Samples one response per requested slot; slots are episodes of one group."""

    def __init__(self, model, tokenizer, num_slots: int, *, reuse_cache: bool = True,
                 temperature: float = 1.0, generator: torch.Generator | None = None):
        self.model = model
        self.pad_id = tokenizer.pad_token_id
        self.stop_id = tokenizer.eos_token_id
        self.reuse_cache = reuse_cache
        self.temperature = temperature
        self.generator = generator
        self.device = next(model.parameters()).device
        # transformers >= 5.2x calls the cache argument `cache`; older releases `past_key_values`.
        forward = model.get_base_model().forward if hasattr(model, "get_base_model") else model.forward
        self._cache_arg = "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"
        self.fed: dict[int, list[int]] = {}  # slot -> real token ids already in the cache
        self.rows: list[int] = []  # slot of each cache row
        self.cache = None
        self.mask = torch.zeros(0, 0, dtype=torch.long)  # (rows, cache_len)
        self.prefilled_tokens = 0  # real prompt tokens run through the model (for benchmarks)
        self.decoded_tokens = 0
        self._reset(list(range(num_slots)))

    def _reset(self, slots: list[int]) -> None:
        self.rows = list(slots)
        self.fed = {slot: [] for slot in slots}
        self.cache = None
        self.mask = torch.zeros(len(slots), 0, dtype=torch.long, device=self.device)

    def release(self, slots: list[int]) -> None:
        """Drop finished slots from the batch so later calls stop computing them."""
        keep = [row for row, slot in enumerate(self.rows) if slot not in set(slots)]
        if len(keep) == len(self.rows):
            return
        index = torch.tensor(keep, device=self.device)
        if self.cache is not None:
            self.cache.batch_select_indices(index)
        self.mask = self.mask[index]
        for slot in slots:
            self.fed.pop(slot, None)
        self.rows = [self.rows[row] for row in keep]

    def _forward(self, input_ids, chunk_mask, positions):
        self.mask = torch.cat([self.mask, chunk_mask], dim=1)  # (rows, cache_len + n)
        out = self.model(
            input_ids=input_ids, attention_mask=self.mask, position_ids=positions,
            use_cache=True, logits_to_keep=1, **{self._cache_arg: self.cache},
        )
        self.cache = getattr(out, self._cache_arg)
        return out.logits[:, -1].float()  # (rows, vocab)

    def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, vocab) -> sampled ids (rows,) and their log-probs under the sampling distribution."""
        if self.temperature <= 0:
            logprobs = torch.log_softmax(logits, dim=-1)  # (rows, vocab)
            tokens = logprobs.argmax(dim=-1)  # (rows,)
        else:
            logprobs = torch.log_softmax(logits / self.temperature, dim=-1)  # (rows, vocab)
            tokens = torch.multinomial(logprobs.exp(), 1, generator=self.generator).squeeze(1)  # (rows,)
        return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)

    @torch.no_grad()
    def generate(self, prompts: dict[int, list[int]], max_new_tokens: dict[int, int] | int
                 ) -> dict[int, tuple[list[int], list[float]]]:
        """Sample a response for each slot in `prompts` (slot -> full prompt ids).

        Returns slot -> (response ids, per-token log-probs). A response ends with
        the end-of-turn token or after `max_new_tokens` tokens.
        """
        if isinstance(max_new_tokens, int):
            max_new_tokens = {slot: max_new_tokens for slot in prompts}
        if not self.reuse_cache:
            self._reset(sorted(prompts))
        unknown = set(prompts) - set(self.rows)
        if unknown:
            raise ValueError(f"generate: slots {sorted(unknown)} were released or never existed")

        chunks = {}
        for slot, prompt in prompts.items():
            fed = self.fed[slot]
            if prompt[: len(fed)] != fed:
                raise ValueError(
                    f"generate: the prompt of slot {slot} does not extend what is cached; the "
                    "conversation must be append-only to reuse the cache (use reuse_cache=False)"
                )
            chunks[slot] = prompt[len(fed):]
            if not chunks[slot]:
                raise ValueError(f"generate: the prompt of slot {slot} adds no new token")
        width = max(len(chunk) for chunk in chunks.values())
        num_rows = len(self.rows)
        input_ids = torch.full((num_rows, width), self.pad_id, dtype=torch.long)  # (rows, width)
        chunk_mask = torch.zeros(num_rows, width, dtype=torch.long)  # (rows, width)
        positions = torch.zeros(num_rows, width, dtype=torch.long)  # (rows, width)
        for row, slot in enumerate(self.rows):
            chunk = chunks.get(slot, [])
            if chunk:
                start = width - len(chunk)
                input_ids[row, start:] = torch.tensor(chunk)
                chunk_mask[row, start:] = 1
                positions[row, start:] = torch.arange(len(self.fed[slot]), len(self.fed[slot]) + len(chunk))
                self.fed[slot].extend(chunk)
                self.prefilled_tokens += len(chunk)
        logits = self._forward(input_ids.to(self.device), chunk_mask.to(self.device), positions.to(self.device))

        responses = {slot: ([], []) for slot in prompts}
        active = set(prompts)
        row_of = {slot: row for row, slot in enumerate(self.rows)}
        while True:
            tokens, logprobs = self._sample(logits)
            for slot in list(active):
                token = int(tokens[row_of[slot]])
                ids, lps = responses[slot]
                ids.append(token)
                lps.append(float(logprobs[row_of[slot]]))
                if token == self.stop_id or len(ids) >= max_new_tokens[slot]:
                    active.discard(slot)
            self.decoded_tokens += len(prompts)
            if not active:
                break
            step_ids = torch.full((num_rows, 1), self.pad_id, dtype=torch.long)  # (rows, 1)
            step_mask = torch.zeros(num_rows, 1, dtype=torch.long)  # (rows, 1)
            step_positions = torch.zeros(num_rows, 1, dtype=torch.long)  # (rows, 1)
            for slot in active:
                row = row_of[slot]
                step_ids[row, 0] = responses[slot][0][-1]
                step_mask[row, 0] = 1
                step_positions[row, 0] = len(self.fed[slot])
                self.fed[slot].append(responses[slot][0][-1])
            logits = self._forward(step_ids.to(self.device), step_mask.to(self.device), step_positions.to(self.device))
        return responses
