"""The chat messages as a PCD context: one user message is the context itself; a longer
conversation is the model's own chat template between the cached schema part and the
answer; anything else falls back to a transcript."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel

from pcd_tools.prompt import build_prompt, render_system
from pcd_tools.schema import compile_schema
from pcd_tools.serve.openai_chat import conversation_context

pytestmark = pytest.mark.unit


class ChatML:
    """A tokenizer stand-in with a ChatML template (SmolLM2's layout)."""

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(ids).decode()

    def apply_chat_template(self, messages, add_generation_prompt=True):
        out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")


class Route(BaseModel):
    """Route the ticket."""

    team: Literal["billing", "tech"]


SCHEMA = compile_schema(Route)


def test_one_user_message_is_the_context():
    assert conversation_context(ChatML(), SCHEMA, [{"role": "user", "content": "hi"}]) == "hi"


def test_a_conversation_is_rendered_by_the_template():
    turns = [
        {"role": "user", "content": "My card was charged twice."},
        {"role": "assistant", "content": "Which card?"},
        {"role": "user", "content": "The Visa ending 4242."},
    ]
    tok = ChatML()
    ctx = conversation_context(tok, SCHEMA, turns)
    parts = build_prompt(tok, SCHEMA)
    full = tok.apply_chat_template([{"role": "system", "content": render_system(SCHEMA)}, *turns])
    assert parts.head + ctx + parts.tail == full + "{"
    assert "<|im_start|>assistant\nWhich card?<|im_end|>" in ctx


def test_a_tool_turn_last_is_rendered_by_the_template():
    turns = [
        {"role": "user", "content": "Check order 17."},
        {"role": "assistant", "content": "[called lookup with {}]"},
        {"role": "tool", "content": "[lookup returned] shipped"},
    ]
    tok = ChatML()
    ctx = conversation_context(tok, SCHEMA, turns)
    assert ctx.endswith("<|im_start|>tool\n[lookup returned] shipped")


def test_other_shapes_fall_back_to_a_transcript():
    turns = [
        {"role": "assistant", "content": "How can I help?"},
        {"role": "user", "content": "Refund please."},
    ]
    assert conversation_context(ChatML(), SCHEMA, turns) == (
        "assistant: How can I help?\n\nuser: Refund please."
    )


def test_no_template_falls_back_to_a_transcript():
    class Plain(ChatML):
        def apply_chat_template(self, messages, add_generation_prompt=True):
            return None

    turns = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    assert conversation_context(Plain(), SCHEMA, turns) == "user: a\n\nassistant: b\n\nuser: c"
