"""Token-level tips: stripping the tip block gives exactly the tip-free chat-template tokenisation."""

from empo2.chat import ChatFormat, Message, format_tip_block


def _as_list(ids):
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _conversation(tokenizer, tips):
    response = lambda text, end=True: tokenizer(text, add_special_tokens=False)["input_ids"] + (  # noqa: E731
        [tokenizer.eos_token_id] if end else [])
    return [
        Message("system", "You are an agent in a text world."),
        Message("user", "Task: turn on the red light bulb.\nObservation: You are in the kitchen.", tips=tips),
        Message("assistant", ids=response("open door to hallway")),
        Message("user", "Observation: The door is now open.\nStep 2 of 30. Your action:", tips=tips),
        Message("assistant", ids=response("go to hallway")),
        Message("user", "Observation: You are in the hallway.\nStep 3 of 30. Your action:"),
    ]


def test_stripping_tips_equals_tip_free_chat_template(tokenizer):
    chat = ChatFormat(tokenizer)
    tips = format_tip_block([
        "In a similar state you did 'focus on red light bulb'; that attempt scored -100. Tip: the bulb is elsewhere.",
        "In a similar state you did 'go to workshop'; that attempt scored 13. Tip: wires are in the workshop.",
    ])
    for add_generation_prompt in (True, False):
        messages = _conversation(tokenizer, tips)
        if not add_generation_prompt:
            messages = messages[:-1]
        rendered = chat.render(messages, add_generation_prompt)
        as_text = lambda with_tips: [  # noqa: E731
            {"role": m.role, "content": tokenizer.decode(m.ids, skip_special_tokens=True) if m.ids
             else ((m.tips or "") if with_tips else "") + m.text} for m in messages]
        expected_free = _as_list(tokenizer.apply_chat_template(as_text(False), add_generation_prompt=add_generation_prompt))
        expected_with = _as_list(tokenizer.apply_chat_template(as_text(True), add_generation_prompt=add_generation_prompt))
        assert rendered.has_tips
        assert rendered.ids(with_tips=False) == expected_free
        assert rendered.ids(with_tips=True) == expected_with
        assert len(rendered.ids(True)) > len(rendered.ids(False)) + 40


def test_response_spans_point_at_the_sampled_ids(tokenizer):
    chat = ChatFormat(tokenizer)
    messages = _conversation(tokenizer, format_tip_block(["a tip"]))
    rendered = chat.render(messages, add_generation_prompt=True)
    for with_tips in (True, False):
        ids = rendered.ids(with_tips)
        spans = rendered.response_spans(with_tips)
        assert [ids[a:b] for a, b in spans] == [messages[2].ids, messages[4].ids]


def test_truncated_response_gets_the_end_of_turn_token(tokenizer):
    chat = ChatFormat(tokenizer)
    cut = tokenizer("open door to", add_special_tokens=False)["input_ids"]  # no end-of-turn sampled
    messages = [Message("user", "Observation: kitchen."), Message("assistant", ids=cut), Message("user", "ok")]
    ids = chat.render(messages, add_generation_prompt=False).ids()
    start = ids.index(cut[0])
    assert ids[start + len(cut)] == tokenizer.eos_token_id
    assert all(not (a == b == tokenizer.eos_token_id) for a, b in zip(ids, ids[1:]))  # never doubled
