"""Token-level chat conversations in which tips can be removed exactly.

EMPO²'s off-policy update scores the actions of a tip-guided episode under the
*tip-free* context. Doing that by re-rendering text would re-tokenise the
sampled actions and could shift token boundaries, so conversations here are kept
as a list of token segments:

    text     | tokens the chat template produces (role headers, observations, ...)
    tip      | the tip block shown in a memory-augmented turn
    response | the exact token ids the policy sampled

Dropping the tip segments gives the tip-free conversation token for token
(`tests/test_chat.py` checks it against `apply_chat_template` of the tip-free
messages). The template is rendered once per call with placeholder characters
where responses and tip blocks go, so any chat template that does not rewrite
message contents works.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TIP_OPEN, TIP_CLOSE = "<tip>", "</tip>"

# Private-use code points mark where sampled ids and tip blocks go in the rendered text.
_RESPONSE_MARK = "\ue000{}\ue001"
_TIP_MARK = "\ue002{}\ue003"
_MARK_PATTERN = re.compile("(\ue000\\d+\ue001|\ue002\\d+\ue003)")


@dataclass
class Message:
    """One chat message. An assistant message carries the sampled `ids`; a user message may carry `tips`."""

    role: str
    text: str = ""
    tips: str | None = None
    """The tip block (already formatted, see `format_tip_block`); shown before `text`."""
    ids: list[int] | None = None
    """Token ids of an assistant response exactly as sampled (may end with the end-of-turn token)."""


@dataclass
class Segment:
    kind: str
    """"text", "tip" or "response"."""
    ids: list[int]
    message_index: int


@dataclass
class Rendered:
    """A conversation as segments, with helpers to get either context."""

    segments: list[Segment] = field(default_factory=list)

    def ids(self, with_tips: bool = True) -> list[int]:
        return [t for s in self.segments if with_tips or s.kind != "tip" for t in s.ids]

    def response_spans(self, with_tips: bool = True) -> list[tuple[int, int]]:
        """[start, end) positions of every response segment in `ids(with_tips)`."""
        spans, position = [], 0
        for segment in self.segments:
            if segment.kind == "tip" and not with_tips:
                continue
            if segment.kind == "response":
                spans.append((position, position + len(segment.ids)))
            position += len(segment.ids)
        return spans

    @property
    def has_tips(self) -> bool:
        return any(s.kind == "tip" for s in self.segments)


def format_tip_block(tips: list[str]) -> str:
    """The delimited block that shows retrieved tips inside a user turn."""
    lines = "\n".join(f"- {tip}" for tip in tips)
    return f"{TIP_OPEN}\nTips from earlier attempts:\n{lines}\n{TIP_CLOSE}\n"


class ChatFormat:
    """Renders `Message` lists into token segments with a tokenizer's chat template."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.end_of_turn_id = tokenizer.eos_token_id
        self.end_of_turn_text = tokenizer.eos_token

    def _tokenize(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def render(self, messages: list[Message], add_generation_prompt: bool) -> Rendered:
        """Token segments of `messages`; with `add_generation_prompt` it ends ready for the assistant."""
        template_messages, tip_texts, response_ids = [], {}, {}
        for index, message in enumerate(messages):
            if message.role == "assistant":
                if message.ids is None:
                    raise ValueError("Message.ids: an assistant message needs its sampled token ids")
                response_ids[index] = message.ids
                content = _RESPONSE_MARK.format(index)
            else:
                content = message.text
                if message.tips:
                    tip_texts[index] = message.tips
                    content = _TIP_MARK.format(index) + content
            template_messages.append({"role": message.role, "content": content})
        text = self.tokenizer.apply_chat_template(
            template_messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        rendered = Rendered()
        pieces = _MARK_PATTERN.split(text)
        for position, piece in enumerate(pieces):
            if not piece:
                continue
            if piece[0] == "\ue000":
                index = int(piece[1:-1])
                ids = list(response_ids[index])
                rendered.segments.append(Segment("response", ids, index))
                # A response that already ends with the end-of-turn token must not get a second one.
                if ids and ids[-1] == self.end_of_turn_id and position + 1 < len(pieces):
                    following = pieces[position + 1]
                    if following.startswith(self.end_of_turn_text):
                        pieces[position + 1] = following[len(self.end_of_turn_text) :]
            elif piece[0] == "\ue002":
                index = int(piece[1:-1])
                rendered.segments.append(Segment("tip", self._tokenize(tip_texts[index]), index))
            else:
                rendered.segments.append(Segment("text", self._tokenize(piece), -1))
        return rendered
