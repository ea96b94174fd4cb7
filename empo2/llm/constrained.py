"""Constrained action decoding: the policy can only spell an admissible action.

A 135M model asked for a ScienceWorld command writes prose; snapping that prose
to the nearest valid action turns it into an arbitrary command (often a fatal
`focus on`). With `action_decoding="constrained"` the policy instead samples
from its own distribution *renormalised over the tokens that continue an
admissible action*:

    π_c(a_t | h, a_<t) = softmax(logits / T)[a_t] / Σ_{v ∈ allowed(a_<t)} softmax(logits / T)[v]

`ActionConstraint` is a token trie over the state's admissible actions, each
tokenised on its own and ended with the end-of-turn token, so every path from
the root spells exactly one admissible action. An admissible action written as
`prefix[...]` (WebShop's `search[...]`) is a free-text template: after its
forced prefix any token may follow, until a token containing `]`, the
end-of-turn token, or the free-text budget.

The same per-position allowed sets are used when sampling (`empo2.llm.generation`)
and when the update scores the sampled tokens (`empo2.llm.logprobs`), so behaviour
and learner log-probs are of one distribution. A position with a single allowed
token is *forced*: its log-prob is 0, it carries no gradient, the update masks
it out of the token mean, and the generator feeds a run of forced tokens in one
forward pass instead of one decode step each.

Why a trie of our own rather than a grammar library (xgrammar, llguidance,
outlines): the allowed set changes at every step of every episode (hundreds to
a few thousand actions), so the per-state cost is building the constraint, not
applying it; `python benchmarks/bench_constraints.py` measures both ways on ScienceWorld's
largest valid-action lists. On the GPU engine the same constraint is vLLM's
structured output with a `choice` list (see docs/design.md).
"""

from __future__ import annotations

from collections import OrderedDict

from empo2.episode import is_forced

FREE_TEXT = "[...]"
"""An admissible action ending with this is a template: its prefix, then free text up to `]`."""

_END = -1  # trie key: the action ends here (the end-of-turn token follows)
_FREE = -2  # trie key: free text follows
_CLOSE = -3  # trie key (word loops): the argument is closed here


class ActionEncoder:
    """Tokenises action strings once (actions repeat across steps and episodes) and builds constraints."""

    def __init__(self, tokenizer, *, cache_size: int = 50_000, constraint_cache: int = 64):
        self.tokenizer = tokenizer
        self.end_id = tokenizer.eos_token_id
        self._ids: dict[str, tuple[int, ...]] = {}
        self._cache_size = cache_size
        self._constraints: OrderedDict[tuple[str, ...], ActionConstraint] = OrderedDict()
        self._constraint_cache = constraint_cache
        self._closing_ids: frozenset[int] | None = None

    def encode(self, actions: list[str]) -> list[tuple[int, ...]]:
        """Token ids of each action, tokenised on its own (no special tokens)."""
        new = [a for a in dict.fromkeys(actions) if a not in self._ids]
        if new:
            if len(self._ids) + len(new) > self._cache_size:
                self._ids.clear()
            for action, ids in zip(new, self.tokenizer(new, add_special_tokens=False)["input_ids"]):
                self._ids[action] = tuple(ids)
        return [self._ids[a] for a in actions]

    @property
    def closing_ids(self) -> frozenset[int]:
        """Tokens whose text contains `]`: one of them ends a free-text argument."""
        if self._closing_ids is None:
            vocab = self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer))))
            self._closing_ids = frozenset(i for i, token in enumerate(vocab) if token and "]" in token)
        return self._closing_ids

    def word_loop(self, words: list[str]) -> WordLoop:
        words = list(dict.fromkeys(w for w in words if w and "]" not in w))
        [close] = self.encode(["]"])
        if len(close) != 1:
            raise ValueError("word_loop: this tokenizer spells ']' with several tokens")
        later = _trie([close], _CLOSE, _trie(self.encode([" " + w for w in words])))
        return WordLoop(_trie(self.encode(words)), later)

    def constraint(self, actions: list[str], free_text_tokens: int = 32,
                   words: list[str] | None = None) -> "ActionConstraint":
        """The trie over `actions` (cached: the episodes of a group often share a state). With `words`, a
        template's argument is not free text but a sequence of those words, chosen one at a time (`WordLoop`)."""
        key = (free_text_tokens, tuple(words or ()), *actions)
        cached = self._constraints.get(key)
        if cached is not None:
            self._constraints.move_to_end(key)
            return cached
        if not actions:
            raise ValueError("constraint: the state lists no admissible action")
        fixed = [a for a in actions if not a.endswith(FREE_TEXT)]
        templates = [a[: -len(FREE_TEXT)] + "[" for a in actions if a.endswith(FREE_TEXT)]
        root = _trie(self.encode(templates), _FREE, _trie(self.encode(fixed), _END))
        built = ActionConstraint(root, self.end_id, self.closing_ids if templates else frozenset(),
                                 free_text_tokens, self.word_loop(words) if words and templates else None)
        self._constraints[key] = built
        if len(self._constraints) > self._constraint_cache:
            self._constraints.popitem(last=False)
        return built


class WordLoop:
    """A template argument made of words from a list, then `]`: the first word as written, each later one
    after a space, and `]` only after at least one word (WebShop's query from the goal's words)."""

    def __init__(self, first: dict, later: dict):
        self.first = first
        """Trie of the words, each ending `_END`."""
        self.later = later
        """Trie of " " + each word (`_END`) and of "]" (`_CLOSE`)."""


def _trie(sequences, leaf: int = _END, root: dict | None = None) -> dict:
    """Add each token sequence to a trie of nested dicts (token -> child), marking where it ends with `leaf`."""
    root = {} if root is None else root
    for ids in sequences:
        node = root
        for token in ids:
            node = node.setdefault(token, {})
        node[leaf] = True
    return root


def action_text(text: str) -> str:
    """The action a constrained response spells: a free-text argument is cut after its first `]`,
    or closed with `]` when the end-of-turn token or the budget ended it."""
    if "[" not in text:
        return text
    close = text.find("]", text.index("["))
    return text + "]" if close < 0 else text[: close + 1]


class ActionConstraint:
    """The admissible actions of one state as a token trie; `cursor()` walks one response through it."""

    def __init__(self, root: dict, end_id: int, closing_ids: frozenset[int], free_text_tokens: int,
                 words: WordLoop | None = None):
        self.root = root
        self.end_id = end_id
        self.closing_ids = closing_ids
        self.free_text_tokens = free_text_tokens
        self.words = words
        """A template's argument as a loop over words (None: free text)."""

    def cursor(self) -> "Cursor":
        return Cursor(self)

    def paths(self) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        """The token ids of every admissible action in the trie, and of every free-text template's prefix."""
        fixed, templates = [], []
        stack = [((), self.root)]
        while stack:
            prefix, node = stack.pop()
            for key, child in node.items():
                if key == _END:
                    fixed.append(prefix)
                elif key == _FREE:
                    templates.append(prefix)
                else:
                    stack.append((prefix + (key,), child))
        return fixed, templates


class Cursor:
    """Where one response is in the trie: which tokens may come next, and whether it is complete."""

    def __init__(self, constraint: ActionConstraint):
        self.constraint = constraint
        self.node: dict | None = constraint.root
        self.free_tokens = 0
        """Tokens written so far inside a free-text argument (node is None there)."""
        self.word: dict | None = None
        """Inside a word-loop argument: the node in the loop's tries (None elsewhere)."""
        self.done = False

    def _word_choices(self) -> dict:
        """The tokens that may come next inside a word-loop argument -> the node each leads to."""
        loop = self.constraint.words
        if _END not in self.word:  # inside a word (or before the first)
            return {t: child for t, child in self.word.items() if t >= 0}
        choices = {t: child for t, child in loop.later.items() if t >= 0}  # a space and a word, or "]"
        if self.free_tokens >= self.constraint.free_text_tokens:  # the budget is spent: only "]"
            choices = {t: child for t, child in choices.items() if _CLOSE in child}
        return {**choices, **{t: child for t, child in self.word.items() if t >= 0}}

    def allowed(self) -> tuple[int, ...] | None:
        """Token ids that may come next; None means any token (free text)."""
        if self.word is not None:
            return tuple(self._word_choices())
        if self.node is None or _FREE in self.node:
            return None
        tokens = tuple(t for t in self.node if t >= 0)
        if _END in self.node:
            tokens += (self.constraint.end_id,)
        return tokens

    def advance(self, token: int) -> None:
        """Append `token`; `done` becomes True when it completes the action."""
        if self.done:
            raise ValueError("Cursor.advance: the action is already complete")
        if self.word is not None:
            choices = self._word_choices()
            if token not in choices:
                raise ValueError(f"Cursor.advance: token {token} does not continue a query of the allowed words")
            self.word = choices[token]
            self.free_tokens += 1
            self.done = _CLOSE in self.word
            return
        if self.node is None or _FREE in self.node:
            self.node = None  # inside free text
            self.free_tokens += 1
            self.done = (token == self.constraint.end_id or token in self.constraint.closing_ids
                         or self.free_tokens >= self.constraint.free_text_tokens)
            return
        if token == self.constraint.end_id and _END in self.node:
            self.done = True
            return
        if token not in self.node or token < 0:
            raise ValueError(f"Cursor.advance: token {token} does not continue an admissible action")
        self.node = self.node[token]
        if self.constraint.words is not None and _FREE in self.node:  # a template's argument: its word loop
            self.word, self.node = self.constraint.words.first, None

    def forced(self) -> int | None:
        """The only token that may come next, if exactly one may."""
        allowed = self.allowed()
        return allowed[0] if is_forced(allowed) else None


class TemplateConstraint:
    """Text written in pieces, each one of its candidate strings, then the end-of-turn token: a constrained tip.

    A literal is a piece with one candidate (its tokens are forced); a slot is a piece whose candidates
    come from the episode. Each piece is a token trie over its candidates, tokenised on their own, so
    every path spells one candidate per piece and the policy chooses among a slot's candidates from its
    own probabilities renormalised over the allowed tokens, as it chooses actions.
    """

    def __init__(self, encoder: ActionEncoder, pieces: list[list[str]]):
        if not pieces or not all(pieces):
            raise ValueError("TemplateConstraint: every piece needs at least one candidate")
        self.tries = [_trie(encoder.encode(list(dict.fromkeys(piece)))) for piece in pieces]
        self.end_id = encoder.end_id

    def cursor(self) -> "TemplateCursor":
        return TemplateCursor(self)


class TemplateCursor:
    """Where one response is in a `TemplateConstraint`: the piece, the node in its trie, whether it is complete.
    Where a candidate ends, the next piece begins (or, after the last piece, the end-of-turn token)."""

    def __init__(self, template: TemplateConstraint):
        self.template = template
        self.piece = 0
        self.node: dict = template.tries[0]
        self.done = False

    def _following(self) -> dict | None:
        """The next piece's trie, None after the last piece."""
        tries = self.template.tries
        return tries[self.piece + 1] if self.piece + 1 < len(tries) else None

    def allowed(self) -> tuple[int, ...]:
        tokens = tuple(t for t in self.node if t >= 0)
        if _END in self.node:
            following = self._following()
            tokens += ((self.template.end_id,) if following is None
                       else tuple(t for t in following if t >= 0 and t not in self.node))
        return tokens

    def advance(self, token: int) -> None:
        if self.done:
            raise ValueError("TemplateCursor.advance: the text is already complete")
        if token >= 0 and token in self.node:  # a longer candidate of this piece goes on
            self.node = self.node[token]
            return
        following = self._following()
        if _END in self.node and following is None and token == self.template.end_id:
            self.done = True
        elif _END in self.node and following is not None and token in following:
            self.piece, self.node = self.piece + 1, following[token]
        else:
            raise ValueError(f"TemplateCursor.advance: token {token} does not continue the template")

    def forced(self) -> int | None:
        allowed = self.allowed()
        return allowed[0] if is_forced(allowed) else None
