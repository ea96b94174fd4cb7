"""Lock-step batched sampling for a group of conversations that share one KV cache.

A group of N episodes is advanced together. Every conversation only grows at
its end, so the cache built for step t is still valid at step t+1: each call
prefills only the tokens added since the previous call (the sampled response's
last token, the new observation, tips where shown) instead of re-reading the
whole history. With full history this turns O(T²) prompt tokens per episode into
O(T). `reuse_cache=False` is the naive way (re-encode every prompt from scratch
each call), kept for single-turn prompts (rewritten every step with a truncated
history) and for the benchmark.

The cache is ragged: one row per episode ("slot"), each row's entries
contiguous from position 0 (`RaggedLayer`), in buffers that double when full,
so a decode step writes its new entries instead of copying the cache:

    row 0: [turn-1 prompt][resp][turn-2 chunk][resp]
    row 1: [turn-1 prompt][resp][turn-2 chunk][resp][turn-3 chunk][resp]
    row 2: [turn-1 prompt][resp]

A call computes only the slots it feeds, so finished episodes cost nothing
until they are asked again (for their tips). The fed chunks go in one
left-padded batch, so that every batch row's last position is a real token and
one logit row per slot is enough, or row by row when padding would dominate;
`position_ids` count each row's own tokens. Attention (`ragged_attention`,
registered with transformers for the generator's passes only) reads each row up
to its own length, so no padding is stored or read, and the key/value heads
are never repeated per query head.

Two other layouts, the left-padded cache (rows as long as the longest, holes
masked out) written in place and the same copied at every call as transformers'
`DynamicCache` does, live in `benchmarks/cache_layouts.py`, which compares them.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.cache_utils import Cache, DynamicLayer

from empo2.llm.constrained import ActionConstraint, Cursor


RAGGED_ATTENTION = "empo2_ragged"  # the name `ragged_attention` is registered under in transformers


class GroupGenerator:
    """Samples one response per requested slot; slots are episodes of one group."""

    def __init__(self, model, tokenizer, num_slots: int, *, reuse_cache: bool = True,
                 temperature: float = 1.0, sampling_rng: torch.Generator | None = None):
        self.model = model
        self.pad_id = tokenizer.pad_token_id
        self.stop_id = tokenizer.eos_token_id
        self.reuse_cache = reuse_cache
        self.temperature = temperature
        self.sampling_rng = sampling_rng
        self.device = next(model.parameters()).device
        self.trunk, self.lm_head = trunk_and_head(model)
        self.num_layers = model.config.num_hidden_layers
        # transformers >= 5.2x calls the cache argument `cache`; older releases `past_key_values`.
        self._cache_arg = "cache" if "cache" in inspect.signature(self.trunk.forward).parameters else "past_key_values"
        self.fed: dict[int, list[int]] = {}  # slot -> real token ids already in the cache
        self.rows: list[int] = []  # slot of each cache row
        self.cache: Cache | None = None
        self.prefilled_tokens = 0  # real prompt tokens run through the model (for benchmarks)
        self.forward_calls = 0  # model calls, prefill and decode (for benchmarks)
        self.computed_tokens = 0  # token positions run through the model, padding included (for benchmarks)
        self.row_split_ratio = 2.0
        """Run a chunk row by row when the padded batch would hold more than this many times its real tokens."""
        self._reset(list(range(num_slots)))

    def _reset(self, slots: list[int]) -> None:
        self.rows = list(slots)
        self.fed = {slot: [] for slot in slots}
        self.cache = Cache(layers=[RaggedLayer(len(slots)) for _ in range(self.num_layers)])

    def _feed(self, chunks: dict[int, list[int]]) -> torch.Tensor:
        """Run each fed slot's new tokens through the model; logits after each one's last token: (rows, vocab) by
        cache row, zero for rows not fed.

        Chunks of similar length go in one left-padded batch. When padding would dominate
        (one row brings a long observation, the others a few tokens), each row runs alone.
        Either way each row's new entries land right after its own cached tokens.
        """
        slots = list(chunks)
        width = max(len(chunk) for chunk in chunks.values())
        real = sum(len(chunk) for chunk in chunks.values())
        input_ids = torch.full((len(slots), width), self.pad_id, dtype=torch.long)  # (batch, width)
        positions = torch.zeros(len(slots), width, dtype=torch.long)  # (batch, width)
        row_of = {slot: row for row, slot in enumerate(self.rows)}
        rows, starts, counts = [], [], []
        for b, slot in enumerate(slots):
            chunk, start = chunks[slot], len(self.fed[slot])
            input_ids[b, width - len(chunk):] = torch.tensor(chunk)
            positions[b, width - len(chunk):] = torch.arange(start, start + len(chunk))
            rows.append(row_of[slot])
            starts.append(start)
            counts.append(len(chunk))
            self.fed[slot].extend(chunk)
        input_ids, positions = input_ids.to(self.device), positions.to(self.device)
        if len(slots) > 1 and self._padding_dominates(len(slots), width, real):
            batches = [[b] for b in range(len(slots))]
        else:
            batches = [list(range(len(slots)))]
        logits = None
        for batch in batches:
            n = max(counts[b] for b in batch)  # this call's width
            call = RaggedCall([rows[b] for b in batch], [starts[b] for b in batch], [counts[b] for b in batch])
            out = self._forward(input_ids[batch, width - n:], positions[batch, width - n:], call)  # (batch, vocab)
            if logits is None:
                logits = out.new_zeros(len(self.rows), out.shape[-1])  # (rows, vocab)
            logits[call.rows] = out
        return logits

    def _padding_dominates(self, rows: int, width: int, real: int) -> bool:
        """A padded batch of `rows` × `width` would compute more than `row_split_ratio` times its `real` tokens."""
        return width >= 8 and rows * width > self.row_split_ratio * real

    def _forward(self, input_ids, positions, call: "RaggedCall") -> torch.Tensor:
        """One pass: (batch, width) inputs -> logits after each batch row's last token (batch, vocab)."""
        for layer in self.cache.layers:
            layer.call = call
        self.forward_calls += 1
        self.computed_tokens += input_ids.numel()
        config = self.trunk.config
        previous = config._attn_implementation
        config._attn_implementation = RAGGED_ATTENTION  # for this pass only; training passes use the model's own
        try:
            out = self.trunk(input_ids=input_ids, position_ids=positions, use_cache=True, ragged=call,
                             **{self._cache_arg: self.cache})
        finally:
            config._attn_implementation = previous
        return self.lm_head(out.last_hidden_state[:, -1].contiguous()).float()  # (batch, vocab)

    def _sample(self, logits: torch.Tensor, allowed: list[tuple[int, ...] | None]
                ) -> tuple[list[int], list[float], list[float]]:
        """(rows, vocab) -> one sampled id per row, its log-prob under the sampling distribution, and that
        distribution's entropy.

        Row r samples only among `allowed[r]` (None: the whole vocabulary), renormalised.
        Constrained rows work on their allowed logits alone: no vocabulary-wide mask.
        """
        tokens, logprobs, entropies = [], [], []
        for row, choices in enumerate(allowed):
            index = None if choices is None else torch.tensor(choices, device=logits.device)  # (k,)
            scores = logits[row] if index is None else logits[row, index]  # (vocab,) or (k,)
            scores = with_temperature(scores, self.temperature)
            row_logprobs = torch.log_softmax(scores, dim=-1)  # (vocab,) or (k,)
            if self.temperature <= 0:
                pick = int(row_logprobs.argmax())
            else:
                probs = row_logprobs.exp()  # (vocab,) or (k,)
                if self.sampling_rng is not None:
                    probs = probs.to(self.sampling_rng.device)  # a CPU generator samples CPU tensors only
                pick = int(torch.multinomial(probs, 1, generator=self.sampling_rng))
            tokens.append(pick if index is None else choices[pick])
            logprobs.append(float(row_logprobs[pick]))
            entropies.append(float(-(row_logprobs.exp() * row_logprobs).nansum()))  # 0 · log 0 counts 0
        return tokens, logprobs, entropies

    @torch.no_grad()
    def generate(self, prompts: dict[int, list[int]], max_new_tokens: dict[int, int] | int,
                 constraints: dict[int, ActionConstraint] | None = None) -> dict[int, Response]:
        """Sample a response for each slot in `prompts` (slot -> full prompt ids).

        A free response ends with the end-of-turn token or after `max_new_tokens`
        tokens. A slot in `constraints` samples only tokens that continue one of
        its admissible actions and ends when the action is complete; forced
        tokens (the only allowed continuation) get log-prob 0 and are fed to the
        model together with the next sampled token, in one forward pass.
        """
        if isinstance(max_new_tokens, int):
            max_new_tokens = {slot: max_new_tokens for slot in prompts}
        constraints = constraints or {}
        if not self.reuse_cache:
            self._reset(sorted(prompts))
        unknown = set(prompts) - set(self.rows)
        if unknown:
            raise ValueError(f"generate: slots {sorted(unknown)} do not exist (this generator has {len(self.rows)})")

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

        cursors = {slot: constraints[slot].cursor() for slot in prompts if slot in constraints}
        responses = {slot: Response([], [], [] if slot in cursors else None) for slot in prompts}
        active = set()
        for slot in prompts:
            if not append_forced(responses[slot], cursors.get(slot)):
                active.add(slot)
                self.prefilled_tokens += len(chunks[slot])
                chunks[slot] += responses[slot].ids
        # A slot already complete keeps its chunk for the next call (it is not fed now).
        row_of = {slot: row for row, slot in enumerate(self.rows)}
        while active:
            logits = self._feed({slot: chunks[slot] for slot in active})
            rows = [row_of[slot] for slot in sorted(active)]
            allowed = [cursors[slot].allowed() if slot in cursors else None for slot in sorted(active)]
            tokens, logprobs, entropies = self._sample(logits[rows], allowed)
            for slot, token, logprob, choices, entropy in zip(sorted(active), tokens, logprobs, allowed, entropies):
                response, cursor = responses[slot], cursors.get(slot)
                response.append(token, logprob, choices, entropy)
                if cursor is not None:
                    cursor.advance(token)
                    done = cursor.done
                else:
                    done = token == self.stop_id or len(response.ids) >= max_new_tokens[slot]
                start = len(response.ids) - 1
                if done or append_forced(response, cursor):
                    active.discard(slot)
                else:
                    chunks[slot] = response.ids[start:]
        return responses


@dataclass
class RaggedCall:
    """Which cache rows one ragged pass feeds: batch row b is cache row `rows[b]`, whose `counts[b]` new
    tokens (the last ones of the padded width) go at positions `starts[b]` onwards."""

    rows: list[int]
    starts: list[int]
    counts: list[int]


class BufferLayer(DynamicLayer):
    """One layer's KV cache in buffers (rows, kv_heads, capacity, head_dim) written in place.

    transformers' `DynamicLayer` concatenates, so every call (every decode step) copies the
    whole cache; a buffer layer grows its buffers only when full and a call writes only its
    new entries. `length` is the longest row's. Subclasses say where a call's entries go (`update`).
    """

    def __init__(self, rows: int):
        super().__init__()
        self.rows = rows
        self.length = 0
        self.key_buffer = self.value_buffer = None  # (rows, kv_heads, capacity, head_dim)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        heads, dim = key_states.shape[1], key_states.shape[3]
        self.key_buffer = key_states.new_zeros(self.rows, heads, 0, dim)
        self.value_buffer = value_states.new_zeros(self.rows, heads, 0, dim)
        self.device = key_states.device
        self.is_initialized = True

    def grow(self, capacity: int) -> None:
        """Reallocate the buffers to `capacity` positions, keeping the first `length`."""
        for name in ("key_buffer", "value_buffer"):
            old = getattr(self, name)
            grown = old.new_zeros(*old.shape[:2], capacity, old.shape[3])
            grown[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, grown)

    def get_seq_length(self) -> int:
        return self.length


class RaggedLayer(BufferLayer):
    """A `BufferLayer` whose rows each hold their entries contiguous from position 0, so no holes; the buffers
    double when full. The generator sets `call` before each pass."""

    def __init__(self, rows: int):
        super().__init__(rows)
        self.call: RaggedCall | None = None

    def reserve(self, length: int) -> None:
        """Make room for `length` positions, doubling the buffers when they are full."""
        capacity = self.key_buffer.shape[2]
        if length > capacity:
            self.grow(max(length, 2 * capacity))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write each fed row's new entries after its cached ones; return the whole buffers (read by
        `ragged_attention`, row by row up to each row's own length)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        call, width = self.call, key_states.shape[2]
        end = max(start + count for start, count in zip(call.starts, call.counts))
        self.reserve(end)
        for b, (row, start, count) in enumerate(zip(call.rows, call.starts, call.counts)):
            self.key_buffer[row, :, start : start + count] = key_states[b, :, width - count :]
            self.value_buffer[row, :, start : start + count] = value_states[b, :, width - count :]
        self.length = max(self.length, end)
        return self.key_buffer, self.value_buffer


def ragged_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, ragged=None, **kwargs):
    """Attention of a ragged pass, in transformers' attention-function interface.

    query (batch, heads, width, head_dim), left-padded; key and value are a `RaggedLayer`'s
    buffers (rows, kv_heads, capacity, head_dim). Each batch row attends to its own cache
    row up to its own length; returns (batch, width, heads, head_dim), zero at padding.
    """
    batch, heads, width, dim = query.shape
    out = query.new_zeros(batch, width, heads, dim)
    for b, (row, start, count) in enumerate(zip(ragged.rows, ragged.starts, ragged.counts)):
        end = start + count
        mask = None
        if count > 1:  # causal within the chunk: its query i sees the keys up to start + i
            mask = torch.ones(count, end, dtype=torch.bool, device=query.device).tril(start)  # (count, end)
        # enable_gqa: the kernel maps query heads to their key/value head (repeating the keys would copy them).
        o = F.scaled_dot_product_attention(query[b : b + 1, :, width - count :], key[row : row + 1, :, :end],
                                           value[row : row + 1, :, :end], attn_mask=mask, scale=scaling,
                                           enable_gqa=True)  # (1, heads, count, dim)
        out[b, width - count :] = o[0].transpose(0, 1)  # (count, heads, dim)
    return out, None


AttentionInterface.register(RAGGED_ATTENTION, ragged_attention)


@dataclass
class Response:
    """One sampled response: token ids, their log-probs, the allowed set at each position, and the entropy of
    the distribution each was sampled from."""

    ids: list[int]
    logprobs: list[float]
    allowed: list[tuple[int, ...] | None] | None
    """Per token: the ids that were allowed there (None: any); None for a free-text response."""
    entropies: list[float | None] = field(default_factory=list)
    """Per token: the entropy (nats) of the sampling distribution, over the allowed ids and at the sampling
    temperature (0 for a forced token; None where the sampler does not report it, as vLLM's)."""

    def append(self, token: int, logprob: float, allowed: tuple[int, ...] | None, entropy: float | None = None) -> None:
        self.ids.append(token)
        self.logprobs.append(logprob)
        self.entropies.append(entropy)
        if self.allowed is not None:
            self.allowed.append(allowed)


def append_forced(response: "Response", cursor: Cursor | None) -> bool:
    """Append the run of forced tokens at the cursor (log-prob 0 each); True when that completes the response."""
    if cursor is None:
        return False
    while not cursor.done:
        token = cursor.forced()
        if token is None:
            return False
        response.append(token, 0.0, (token,), 0.0)
        cursor.advance(token)
    return True


def trunk_and_head(model):
    """The transformer trunk (hidden states after the final norm) and the LM head of a causal LM (LoRA-wrapped or not).

    Calling them apart lets the head run on exactly the rows that need logits, as one
    contiguous matrix product (`logits_to_keep` on a multi-token chunk made a copy of the
    head weight per row, hundreds of MB per call on CPU).
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model, base.get_output_embeddings()


def with_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Logits of the distribution sampled at `temperature` (0: greedy, logits unchanged). The sampler and the
    update's log-probs both go through here, so that the two agree."""
    return logits / temperature if temperature > 0 and temperature != 1.0 else logits


def allowed_mask(allowed: list[tuple[int, ...] | None], vocab: int, device=None) -> torch.Tensor:
    """Additive mask (rows, vocab): 0 where a token is allowed (every token for None), -inf elsewhere."""
    mask = torch.full((len(allowed), vocab), float("-inf"), device=device)  # (rows, vocab)
    for row, tokens in enumerate(allowed):
        if tokens is None:
            mask[row] = 0.0
        else:
            mask[row, list(tokens)] = 0.0
    return mask
