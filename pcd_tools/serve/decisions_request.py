"""The parts of a `/v1/decisions` request: its input as text, its choices and levels
checked, and its request errors.

`input` is a string or an ordered list of items: user, developer, system and assistant
messages (text parts; assistant `output_text` and `refusal` parts) and
`function_call` / `function_call_output` and `custom_tool_call` /
`custom_tool_call_output` pairs. `input_parts` splits them into the task instructions
(the text of the leading system and developer messages, those before any other item)
and the context: the other items rendered as a readable transcript, the way the chat
route renders messages (`input_text`). A tool output must name a call that appears
before it. An image part raises `ImagePart` (the model reads text only).
"""

from __future__ import annotations

import json
from typing import Any

from ..schema import MAX_CHOICES
from ..schema.decisions_port import API_MIN_CHOICES, MAX_LEVELS, MIN_LEVELS
from .errors import ApiError
from .systemone import _json_type

__all__ = [
    "API_MIN_CHOICES",
    "ITEM_TYPES",
    "MAX_LEVELS",
    "MESSAGE_ROLES",
    "MIN_LEVELS",
    "ImagePart",
    "bad",
    "choices",
    "input_parts",
    "input_text",
    "levels",
    "parts_text",
]

# MIN_LEVELS / MAX_LEVELS and API_MIN_CHOICES are the API's own rules ("Provide between 2
# and 255 choices", `decision_create_params`), shared with `pcd_tools.schema.decisions_port`;
# the library's MIN_CHOICES is 1 (one allowed value is answered with p=1).
INSTRUCTION_ROLES = ("system", "developer")


def bad(
    message: str, param: str | None, code: str = "invalid_value", status: int = 400
) -> ApiError:
    """An OpenAI-style request error: `param` is the JSON path of the value at fault."""
    return ApiError(status, code, message, field=param)


MESSAGE_ROLES = ("user", "developer", "system", "assistant")
ITEM_TYPES = (
    "message",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
)
_PARTS: dict[str, tuple[str, ...]] = {
    "user": ("input_text", "input_image", "input_json"),
    "developer": ("input_text",),
    "system": ("input_text",),
    "assistant": ("output_text", "refusal"),
    "output": ("input_text", "input_image"),
    "instructions": ("input_text", "input_image", "input_json"),
}


class ImagePart(Exception):
    """An image part where the model reads text only (its JSON path)."""

    def __init__(self, where: str):
        super().__init__(where)
        self.where = where


def parts_text(value: Any, where: str, kind: str) -> str:
    """The text of a string or a list of content parts; `_Image` for an image part."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad(
            f"{where} must be a string or an array of content parts; got {_json_type(value)}.",
            where,
            "invalid_type",
        )
    accepted = _PARTS[kind]
    texts = []
    for j, part in enumerate(value):
        at = f"{where}[{j}]"
        ptype = part.get("type") if isinstance(part, dict) else None
        if ptype not in accepted:
            raise bad(
                f"{at} has type {ptype if ptype is not None else _json_type(part)!r}; "
                f"accepted here: {list(accepted)}.",
                f"{at}.type",
                "invalid_type",
            )
        if ptype == "input_image":
            raise ImagePart(at)
        if ptype == "input_json":
            data = part.get("data")
            if not isinstance(data, (dict, list)):
                raise bad(
                    f"{at}.data must be a JSON object or an array of objects; got "
                    f"{_json_type(data)}.",
                    f"{at}.data",
                    "invalid_type",
                )
            texts.append(json.dumps(data, ensure_ascii=False, indent=2))
            continue
        key = "refusal" if ptype == "refusal" else "text"
        text = part.get(key)
        if not isinstance(text, str):
            raise bad(f"{at}.{key} must be a string; got {_json_type(text)}.", f"{at}.{key}")
        texts.append(f"[refused] {text}" if ptype == "refusal" else text)
    return "\n".join(texts)


def _str(item: dict[str, Any], key: str, where: str) -> str:
    v = item.get(key)
    if not isinstance(v, str):
        raise bad(
            f"{where}.{key} is required and must be a string; got {_json_type(v)}.",
            f"{where}.{key}",
            "missing_required_parameter" if v is None else "invalid_type",
        )
    return v


def input_text(value: Any) -> str:
    """The context text of a Decisions `input`: `input_parts`' context.

    Raises:
        ApiError: as `input_parts`.
    """
    return input_parts(value)[1]


def input_parts(value: Any) -> tuple[str | None, str]:
    """The task instructions and the context text of a Decisions `input`.

    The instructions are the text of the leading system and developer messages (those
    before the first other item), joined by blank lines; None when there are none (a
    string input, or a list that starts with another item). Later system and developer
    messages stay in the context's transcript.

    Raises:
        ApiError: 400 naming the item at fault: an empty input (or one with only
            instructions), an image part, an unknown item or part type, a tool output
            without its call.
    """
    instructions: str | None = None
    if value is None:
        raise bad(
            "input is required: a string or an array of input items.",
            "input",
            "missing_required_parameter",
        )
    if isinstance(value, str):
        text = value
    elif isinstance(value, list):
        try:
            instructions, text = _items_text(value)
        except ImagePart as e:
            raise bad(
                f"{e.where} is an image; this server's model reads text only, and every "
                "question reads the input. Send the text (or describe the image in an "
                "input_text part).",
                e.where,
                "unsupported_content",
            ) from None
    else:
        raise bad(
            f"input must be a string or an array of input items; got {_json_type(value)}.",
            "input",
            "invalid_type",
        )
    if not text.strip():
        lead = (
            " (its leading system / developer messages are the task instructions, not "
            "content to decide on: add a user message)"
            if instructions is not None
            else ""
        )
        raise bad(
            f"input is empty or only whitespace{lead}: there is nothing to decide on.",
            "input",
            "empty_input",
        )
    return instructions, text


def _items_text(items: list[Any]) -> tuple[str | None, str]:
    if not items:
        raise bad("input is an empty array: there is nothing to decide on.", "input", "empty_input")
    lead: list[str] | None = None  # the leading instructions, while they last
    turns: list[tuple[str, str]] = []
    calls: dict[str, tuple[str, str]] = {}  # call_id -> (kind, name)
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(f"{where} must be an object; got {_json_type(item)}.", where, "invalid_type")
        itype = item.get("type", "message" if "role" in item else None)
        if itype not in ITEM_TYPES:
            raise bad(
                f"{where} has type {itype!r}; accepted: {list(ITEM_TYPES)}.",
                f"{where}.type",
                "invalid_type",
            )
        if itype == "message":
            role = item.get("role")
            if role not in MESSAGE_ROLES:
                raise bad(
                    f"{where}.role is {role!r}; accepted: {list(MESSAGE_ROLES)}.",
                    f"{where}.role",
                )
            if "content" not in item:
                raise bad(
                    f"{where}.content is required.",
                    f"{where}.content",
                    "missing_required_parameter",
                )
            text = parts_text(item["content"], f"{where}.content", role)
            if role in INSTRUCTION_ROLES and not turns:
                lead = [*(lead or []), text]
            else:
                turns.append((role, text))
            continue
        call_id = _str(item, "call_id", where)
        kind = itype.removesuffix("_output")
        if not itype.endswith("_output"):
            name = _str(item, "name", where)
            args = _str(item, "arguments" if kind == "function_call" else "input", where)
            calls[call_id] = (kind, name)
            turns.append(("assistant", f"[called {name} with {args}]"))
            continue
        call = calls.get(call_id)
        if call is None or call[0] != kind:
            raise bad(
                f"{where} is a {itype} for call_id {call_id!r}, but no earlier {kind} item "
                f"in input has that call_id; calls so far: "
                f"{sorted(c for c, (k, _) in calls.items() if k == kind)}. Send the call "
                "before its output.",
                f"{where}.call_id",
                "tool_output_without_call",
            )
        if "output" not in item:
            raise bad(
                f"{where}.output is required.", f"{where}.output", "missing_required_parameter"
            )
        out = parts_text(item["output"], f"{where}.output", "output")
        turns.append(("tool", f"[{call[1]} returned] {out}"))
    instructions = None if lead is None else "\n\n".join(lead)
    if all(role == "user" for role, _ in turns):
        return instructions, "\n\n".join(text for _, text in turns)
    return instructions, "\n\n".join(f"{role}: {text}" for role, text in turns)


def choices(raw: Any, where: str) -> tuple[list[str | bool], list[list[Any]]]:
    at = f"{where}.choices"
    if not isinstance(raw, list):
        raise bad(
            f"{at} is required: an array of {{value, description?}}; got {_json_type(raw)}.",
            at,
            "missing_required_parameter" if raw is None else "invalid_type",
        )
    if len(raw) > MAX_CHOICES:
        raise bad(
            f"{at} has {len(raw)} choices; the Decisions API accepts {API_MIN_CHOICES} to "
            f"{MAX_CHOICES} choices per question, and this route keeps that contract (the "
            "SDKs enforce it). pcd_tools' Python API, /v1/decide and MCP tools take a field "
            "of any size, scored exactly by certified pruned search; or split it into a "
            "coarse and a fine question.",
            at,
            "too_many_choices",
        )
    if len(raw) < API_MIN_CHOICES:
        raise bad(
            f"{at} has {len(raw)} choice(s); the Decisions API accepts {API_MIN_CHOICES} to "
            f"{MAX_CHOICES} choices per question. "
            + (
                "pcd_tools' Python API, /v1/systemone and /v1/decide accept a single allowed "
                "value and answer it with probability 1; this route keeps the API's rule so "
                "that a request valid here is valid on every Decisions server."
                if raw
                else "A question needs something to choose from."
            ),
            at,
            "too_few_choices",
        )
    values: list[str | bool] = []
    descs: list[list[Any]] = []
    seen: set[tuple[type, Any]] = set()
    for j, c in enumerate(raw):
        cw = f"{at}[{j}]"
        if not isinstance(c, dict) or "value" not in c:
            raise bad(
                f"{cw} must be an object with a 'value'; got {_json_type(c)}.", cw, "invalid_type"
            )
        extra = sorted(set(c) - {"value", "description"})
        if extra:
            raise bad(
                f"{cw} has unknown key(s) {extra}; accepted: ['description', 'value'].",
                f"{cw}.{extra[0]}",
                "unknown_parameter",
            )
        v = c["value"]
        if not isinstance(v, (str, bool)):
            raise bad(
                f"{cw}.value must be a string or a boolean; got {_json_type(v)}.",
                f"{cw}.value",
                "invalid_type",
            )
        if isinstance(v, str) and not v.strip():
            raise bad(
                f"{cw}.value is empty or only whitespace; a choice needs a name.", f"{cw}.value"
            )
        if (type(v), v) in seen:
            raise bad(
                f"{cw}.value {json.dumps(v)} is declared twice in {at}; each choice must be "
                'unique (the string "true" and the boolean true are different values).',
                f"{cw}.value",
                "duplicate_choice",
            )
        seen.add((type(v), v))
        d = c.get("description")
        if d is not None and not isinstance(d, str):
            raise bad(
                f"{cw}.description must be a string; got {_json_type(d)}.",
                f"{cw}.description",
                "invalid_type",
            )
        values.append(v)
        descs.append([v, d or None])
    return values, descs


def levels(raw: Any, where: str) -> tuple[list[str], list[str]]:
    at = f"{where}.levels"
    if not isinstance(raw, list):
        raise bad(
            f"{at} is required: an ordered array of {{label, description?}}; got "
            f"{_json_type(raw)}.",
            at,
            "missing_required_parameter" if raw is None else "invalid_type",
        )
    if not MIN_LEVELS <= len(raw) <= MAX_LEVELS:
        raise bad(
            f"{at} has {len(raw)} level(s); accepted: {MIN_LEVELS} to {MAX_LEVELS}.",
            at,
            "too_many_levels" if len(raw) > MAX_LEVELS else "too_few_levels",
        )
    labels, texts = [], []
    for j, lv in enumerate(raw):
        lw = f"{at}[{j}]"
        if not isinstance(lv, dict):
            raise bad(
                f"{lw} must be an object with a 'label'; got {_json_type(lv)}.", lw, "invalid_type"
            )
        extra = sorted(set(lv) - {"label", "description"})
        if extra:
            raise bad(
                f"{lw} has unknown key(s) {extra}; accepted: ['description', 'label'].",
                f"{lw}.{extra[0]}",
                "unknown_parameter",
            )
        label = lv.get("label")
        if not isinstance(label, str) or not label.strip():
            raise bad(f"{lw}.label must be a non-empty string; got {label!r}.", f"{lw}.label")
        d = lv.get("description")
        if d is not None and not isinstance(d, str):
            raise bad(
                f"{lw}.description must be a string; got {_json_type(d)}.",
                f"{lw}.description",
                "invalid_type",
            )
        labels.append(label)
        texts.append(f"{label}: {d}" if d else label)
    return labels, texts
