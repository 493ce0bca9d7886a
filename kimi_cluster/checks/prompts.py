"""What the checks ask the model, and the token budgets they allow for it."""

from __future__ import annotations

from typing import Any

WHO_PROMPT = "Who are you? One sentence."
BILL_PROMPT = (
    "Three friends split a bill. Ana pays twice what Ben pays, and Ben pays 3 more "
    "than Cara. The total is 43. How much does each pay?"
)
# The earlier turn's reasoning holds two numbers its content does not: only a server that sends
# the reasoning back through the chat template can name them.
PRESERVED_HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Tell me three random numbers."},
    {
        "role": "assistant",
        "reasoning_content": "I will start by listing five numbers: 473, 921, 235, 215, 222, "
        "and I will tell you the first three.",
        "content": "473, 921, 235",
    },
    {"role": "user", "content": "What are the other two numbers you have in mind?"},
]
PRESERVED_ONLY_IN_REASONING = frozenset({"215", "222"})
TOOL_TASK = (
    "What is 47 * 89? Also, what is the weather in Tokyo? "
    "Use your tools, then give me one combined answer."
)
IMAGE_PROMPT = "What do you see in this image? Name the colours and how they are arranged."
STREAM_PROMPT = "Count from 1 to 20, separated by spaces."
ANTHROPIC_PROMPT = "In one short sentence: what is the capital of France?"

MAX_TOOL_TURNS = 4
# The thinking counts against max_tokens, so budgets leave room for it before the answer.
SHORT_BUDGET = 2048
LONG_BUDGET = 8192
