"""The answer styles models really produce, for every LLM consumer of the service.

Each entry is (style, answer text). ``wrap`` builds the styles that wrap a correct
answer (fenced, prose around it, a ``<think>`` block first); the consumers' tests add
the styles that depend on their shape (variant keys, missing and extra fields, wrong
types, truncated, empty) and say what each one teaches.
"""

from __future__ import annotations

import json

REFUSAL = "I'm sorry, but I can't help with that."
GARBAGE = "The weather is lovely today. Is there anything else I can do for you?"
THINKING = (
    "<think>\nThe user mentions a habit {not JSON here}. I should answer with the "
    "object only.\n</think>\n\n"
)


def wrap(correct: str) -> list[tuple[str, str]]:
    """The styles of a correct answer that only wrap it."""
    return [
        ("correct", correct),
        ("fenced", f"```json\n{correct}\n```"),
        ("prose-wrapped", f"Sure! Here is what I found:\n{correct}\nLet me know if you need more."),
        ("think-block", THINKING + correct),
        ("think-block-unopened", "The user said something. </think>" + correct),
    ]


# The unreadable ones: what each says went wrong.
UNREADABLE = [
    ("empty", "", "the answer is empty"),
    ("refusal", REFUSAL, "the model declined: I'm sorry, but I can't help with that."),
    ("garbage", GARBAGE, "no JSON in the answer"),
    ("only-thinking", "<think>Let me think about what the user", "only a <think> block"),
]


def dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)
