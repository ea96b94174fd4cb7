"""The two KV cache layouts that `benchmarks/bench.py` compares with the ragged one (empo2.llm.generation).

Both hold the group's rows left-padded to the longest, with the holes masked out
through a 2-D attention mask and `position_ids` counting real tokens only:

    row 0: [turn-1 prompt][resp][pad][turn-2 chunk][resp][pad] ...
    row 1: [pad][turn-1 prompt][resp][turn-2 chunk][pad][resp] ...

- `PaddedGenerator`: written in place (`GrowingLayer`): buffers that double when
  full, so a decode step writes its new entries instead of copying the whole
  cache, and the slots a call asks for are kept as the first rows, so finished
  episodes cost nothing until they are asked again (for their tips).
- `PlainGenerator`: the same copied at every call with every row computed, as
  transformers' `DynamicCache` does.

When padding would dominate a chunk, each row runs alone on its own row of the
cache (`RowLayer`), writing its new entries after a padding hole.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from empo2.llm.generation import BufferLayer, GroupGenerator
from empo2.method.rollout import Roller


class PaddedGenerator(GroupGenerator):
    """A `GroupGenerator` over the left-padded cache written in place; only the asked-for slots are computed."""

    growth = 2.0  # how much the cache buffers grow when full

    def _reset(self, slots: list[int]) -> None:
        super()._reset(slots)
        self.live_rows = len(slots)  # the first `live_rows` rows are the slots of the current call
        self.cache = Cache(layers=[GrowingLayer(len(slots), self.growth) for _ in range(self.num_layers)])
        self.mask = torch.zeros(len(slots), 0, dtype=torch.long, device=self.device)  # (rows, cache_len)

    def generate(self, prompts, *args, **kwargs):
        if self.reuse_cache:  # otherwise the call starts a new cache of exactly these slots
            self._bring_forward(set(prompts))
        return super().generate(prompts, *args, **kwargs)

    def _bring_forward(self, slots: set[int]) -> None:
        """Make `slots` the first rows of the cache; only those rows are computed until the next call."""
        self.live_rows = len(slots)
        if set(self.rows[: len(slots)]) == slots:
            return
        order = ([row for row, slot in enumerate(self.rows) if slot in slots]
                 + [row for row, slot in enumerate(self.rows) if slot not in slots])
        index = torch.tensor(order, device=self.device)
        for layer in self.cache.layers:
            layer.reorder_rows(index)
        self.mask = self.mask[index]
        self.rows = [self.rows[row] for row in order]

    def _feed(self, chunks: dict[int, list[int]]) -> torch.Tensor:
        """Run each slot's new tokens through the model; logits after each live row's last token: (live, vocab).

        Chunks of similar length go in one left-padded batch. When padding would
        dominate (one row brings a long observation, the others a few tokens), each
        row runs alone on its own rows of the cache, writing its new entries after
        a padding hole: the same cache, without computing the padding.
        """
        width = max(len(chunk) for chunk in chunks.values())
        live = self.live_rows
        real = sum(len(chunk) for chunk in chunks.values())
        input_ids = torch.full((live, width), self.pad_id, dtype=torch.long)  # (live, width)
        chunk_mask = torch.zeros(len(self.rows), width, dtype=torch.long)  # (rows, width); idle rows get a hole
        positions = torch.zeros(live, width, dtype=torch.long)  # (live, width)
        for row, slot in enumerate(self.rows[:live]):
            chunk = chunks.get(slot, [])
            if chunk:
                start = width - len(chunk)
                input_ids[row, start:] = torch.tensor(chunk)
                chunk_mask[row, start:] = 1
                positions[row, start:] = torch.arange(len(self.fed[slot]), len(self.fed[slot]) + len(chunk))
                self.fed[slot].extend(chunk)
        input_ids, chunk_mask, positions = (t.to(self.device) for t in (input_ids, chunk_mask, positions))
        if self.mask.shape[1] > 0 and self._padding_dominates(live, width, real):
            return self._forward_rows(input_ids, chunk_mask, positions)
        self.forward_calls += 1
        return self._forward_padded(input_ids, chunk_mask, positions)

    def _forward_padded(self, input_ids, chunk_mask, positions):
        """Batched pass over the live rows: (live, width) inputs, chunk_mask (rows, width) -> logits (live, vocab)."""
        self.mask = torch.cat([self.mask, chunk_mask], dim=1)  # (rows, cache_len + n)
        live = input_ids.shape[0]
        self.computed_tokens += input_ids.numel()
        out = self.trunk(input_ids=input_ids, attention_mask=self.mask[:live], position_ids=positions,
                         use_cache=True, **{self._cache_arg: self.cache})
        return self.lm_head(out.last_hidden_state[:, -1].contiguous()).float()  # (live, vocab)

    def _forward_rows(self, input_ids, chunk_mask, positions) -> torch.Tensor:
        """`_forward_padded` computed row by row on the real tokens only (same cache layout and logits)."""
        layers = self.cache.layers
        length, width = self.mask.shape[1], input_ids.shape[1]
        for layer in layers:
            layer.reserve(width)
        logits = []
        for row in range(input_ids.shape[0]):
            n = int(chunk_mask[row].sum())
            if n == 0:
                logits.append(None)
                continue
            row_cache = Cache(layers=[RowLayer(layer, row, length + width - n) for layer in layers])
            mask = torch.cat([self.mask[row : row + 1], chunk_mask[row : row + 1]], dim=1)  # (1, length + width)
            out = self.trunk(
                input_ids=input_ids[row : row + 1, width - n :], attention_mask=mask,
                position_ids=positions[row : row + 1, width - n :], use_cache=True, **{self._cache_arg: row_cache},
            )
            self.forward_calls += 1
            self.computed_tokens += n
            logits.append(self.lm_head(out.last_hidden_state[0, -1]).float())
        for layer in layers:
            layer.advance(width)
        self.mask = torch.cat([self.mask, chunk_mask], dim=1)  # (rows, cache_len + width)
        vocab = next(l for l in logits if l is not None).shape[-1]
        return torch.stack([l if l is not None else torch.zeros(vocab, device=self.device) for l in logits])


class PlainGenerator(PaddedGenerator):
    """The padded cache copied at every call (exact-size buffers), every row computed at every call."""

    growth = 1.0

    def _bring_forward(self, slots: set[int]) -> None:
        self.live_rows = len(self.rows)


LAYOUTS = {"ragged": GroupGenerator, "padded": PaddedGenerator, "plain": PlainGenerator}


def cache_positions(generator: GroupGenerator) -> tuple[int, int]:
    """(cache positions a decode step over every row reads, of them real tokens); the rest are holes."""
    real = sum(len(ids) for ids in generator.fed.values())
    return (generator.mask.numel() if isinstance(generator, PaddedGenerator) else real), real


class LayoutRoller(Roller):
    """A `Roller` whose groups are sampled by `generator_class` (one of `LAYOUTS`)."""

    generator_class = GroupGenerator

    def _generator(self, n: int, temperature: float):
        generator = super()._generator(n, temperature)  # the roller's own: its settings are the ones to keep
        if self.generator_class is not GroupGenerator:
            generator = self.generator_class(self.model, self.tokenizer, n, reuse_cache=generator.reuse_cache,
                                             temperature=temperature, sampling_rng=self.sampling_rng)
            self.last_generator = generator
        return generator


class GrowingLayer(BufferLayer):
    """A `BufferLayer` for the padded layout: capacity grows by `growth` when full. A call may bring fewer rows
    than the buffers hold: they are the first rows, and the others keep a zero hole at the new positions (masked
    out; zero so that no stale value meets a zero attention weight). `growth=1` is the plain way: exact-size
    reallocation and a full copy at every call, as `DynamicLayer` does.
    """

    def __init__(self, rows: int, growth: float = 2.0):
        super().__init__(rows)
        self.growth = growth

    def reserve(self, extra: int) -> None:
        """Make room for `extra` more positions (growing the buffers if needed)."""
        needed = self.length + extra
        if self.key_buffer is not None and needed > self.key_buffer.shape[2]:
            self.grow(max(needed, int(self.key_buffer.shape[2] * self.growth)))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write the new entries of the first rows; return those rows' keys and values so far."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        rows, n = key_states.shape[0], key_states.shape[2]
        self.reserve(n)
        self.write(slice(0, rows), self.length, key_states, value_states)
        self.advance(n)
        self.keys, self.values = self.view(slice(0, rows), self.length)
        return self.keys, self.values

    def write(self, rows: slice, start: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.key_buffer[rows, :, start : start + key_states.shape[2]] = key_states
        self.value_buffer[rows, :, start : start + value_states.shape[2]] = value_states

    def view(self, rows: slice, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.key_buffer[rows, :, :end], self.value_buffer[rows, :, :end]

    def advance(self, n: int) -> None:
        self.length += n

    def reorder_rows(self, index: torch.Tensor) -> None:
        if self.key_buffer is not None:
            self.key_buffer, self.value_buffer = self.key_buffer[index], self.value_buffer[index]


class RowLayer(DynamicLayer):
    """One row of a `GrowingLayer`, for a call that runs rows one at a time.

    The row's new entries land at `start` (the end of the call's padded width); the
    hole before them stays zero. The parent advances once, after every row has run.
    """

    def __init__(self, parent: GrowingLayer, row: int, start: int):
        super().__init__()
        self.parent, self.rows, self.start = parent, slice(row, row + 1), start
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.parent.key_buffer is None:  # pragma: no cover - the row path only runs on a filled cache
            raise RuntimeError("RowLayer: the parent cache is empty")
        self.parent.write(self.rows, self.start, key_states, value_states)
        return self.parent.view(self.rows, self.start + key_states.shape[2])

    def get_seq_length(self) -> int:
        return self.start
