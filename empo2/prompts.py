"""The words the agent sees: system prompt, turn layout, the tip prompt, memory entries.

What is specific to an environment (its action syntax, what it lists each turn) is written by the
environment class (`first_turn_text`, `next_turn_text`) inside the layout given here.

Per-turn text is fixed once written (instructions in the first turn, tips in the
turn where they were shown), so a conversation only ever grows at its end and
the rollout can keep its KV cache.
"""

from __future__ import annotations

SYSTEM_PROMPT = (
    "You are an agent in a text-based environment. Each turn you read an observation "
    "and reply with exactly one action, written as a short command, and nothing else."
)

TIP_PROMPT = (
    "Thank you. This attempt has ended with score {score:.0f}. In one line of at most "
    "100 words, write a tip for your next attempt: summarise what you did, what you "
    "learned, and how far you are from completing the task."
)


_CONSTRAINED_TIP_ASK = "Thank you. This attempt has ended with score {score:.0f}. Write a tip for your next attempt: "

CONSTRAINED_TIP_PROMPT = _CONSTRAINED_TIP_ASK + "the action that helped most, the action to avoid, and an action to try next time."
"""The tip prompt of `tip_decoding="constrained"` with `tip_template="helpful_avoid_next"`."""

TIP_ASKS_BY_SCORE = {
    True: "the action that helped most, and an action to try next time.",
    False: "the action to avoid, and an action to try next time.",
}
"""What the tip prompt of `tip_template="by_score"` asks for, after a score above 0 (True) or not."""

TIP_TEMPLATES = ("helpful_avoid_next", "by_score")


def constrained_tip_prompt(score: float, template: str = "helpful_avoid_next") -> str:
    """The tip prompt of a constrained tip: the final score, then what the template's slots hold."""
    if template == "helpful_avoid_next":
        return CONSTRAINED_TIP_PROMPT.format(score=score)
    return _CONSTRAINED_TIP_ASK.format(score=score) + TIP_ASKS_BY_SCORE[score > 0]


def tip_template(taken: list[str], seen: list[str], score: float = 0.0,
                 template: str = "helpful_avoid_next") -> list[list[str]]:
    """The pieces of a constrained tip: literals and slots, each slot a choice among episode text.

    helpful_avoid_next (whatever the score):
        Helpful: <an action it took>. Avoid: <an action it took>. Next, try: <an admissible action it saw>.
    by_score (the first slot's name follows the score, so one action is never both):
        Helpful: <an action it took>. Next, try: <an admissible action it saw>.   (score above 0)
        Avoid: <an action it took>. Next, try: <an admissible action it saw>.     (score 0 or below)

    `taken`: the actions the episode executed; `seen`: the admissible actions of the states it acted in
    (those it did not take, or all of them if it took every one).
    """
    if template not in TIP_TEMPLATES:
        raise ValueError(f"tip_template: {template!r} is not allowed; choose one of {', '.join(TIP_TEMPLATES)}")
    untried = [a for a in seen if a not in set(taken)] or list(seen)
    slot = lambda actions: [f" {a}." for a in actions]  # noqa: E731
    if template == "by_score":
        return [["Helpful:" if score > 0 else "Avoid:"], slot(taken), [" Next, try:"], slot(untried)]
    return [["Helpful:"], slot(taken), [" Avoid:"], slot(taken), [" Next, try:"], slot(untried)]


def first_turn(task_description: str, observation: str, extra: str = "") -> str:
    """The first user turn: the task, the environment's `extra` lines on how to act, the first observation."""
    return f"Task: {task_description}\n{extra}Observation: {observation.strip()}\nYour action:"


def next_turn(observation: str, step: int, max_steps: int, extra: str = "") -> str:
    """A later user turn: the result of the last action, then the environment's `extra` lines."""
    return f"Observation: {observation.strip()}\n{extra}Step {step} of {max_steps}. Your action:"


def memory_content(tip: str, action: str, score: float) -> str:
    """What one memory entry says: the tip, the action taken in that state, the episode score."""
    return f"In a similar state you did '{action}'; that attempt scored {score:.0f}. Tip: {tip.strip()}"


SINGLE_TURN_SYSTEM = (
    "You are an expert autonomous agent. Each step you get the task, your recent actions, the current "
    "observation and the admissible actions, and you choose one admissible action."
)


def single_turn_prompt(task_description: str, step: int, history: list[tuple[str, str]], observation: str,
                       info: dict, *, think_first: bool = True) -> str:
    """One self-contained prompt per step (the WebShop RL baselines' style): task, step count, recent
    history, current observation, admissible actions; reasoning in <think> (when `think_first`),
    the action in <action>."""
    lines = [f"Task: {task_description}", f"You have taken {step - 1} step(s) so far."]
    if history:
        lines.append(f"Your last {len(history)} action(s) and what followed:")
        lines += [f"- {action} -> {result.strip()[:300]}" for action, result in history]
    lines += [
        f"Step {step}. Current observation: {observation.strip()}",
        f"Admissible actions: [{', '.join(info.get('valid_actions', []))}]",
        "Think step by step inside <think> </think>, then give exactly one admissible action inside "
        "<action> </action>." if think_first else
        "Give exactly one admissible action inside <action> </action>, and nothing else.",
    ]
    return "\n".join(lines)


def extract_action(text: str) -> str:
    """The content of the last <action>...</action> block, or the whole text when there is none."""
    start = text.rfind("<action>")
    if start < 0:
        return text
    end = text.find("</action>", start)
    return text[start + len("<action>") : end if end >= 0 else len(text)].strip()
