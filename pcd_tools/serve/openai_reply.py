"""The chat-completions answer to a scored decision: a `ChatCompletion`, or its SSE stream.

The answer is the decision's JSON, as `message.content` (`finish_reason: "stop"`) or as
the arguments of the forced tool's call (`finish_reason: "tool_calls"`). Its
probabilities ride along in an extension that OpenAI clients keep and ignore:

    choices[0].pcd = {
        "fields": {name: {"value", "probability", "distribution", "labels"?, "expected"?}},
        "confidence", "temperature", "prefill_ms", "suffix_eval_ms", "elapsed_ms",
        "prompt_tokens", "prefix_cache_hit", "sequential_forward_passes",
    }

With `logprobs: true`, `choices[0].logprobs.content` has one entry per field value (per
chosen label for a multi-label field): its JSON text as `token` and the log of its PCD
probability as `logprob`, with up to `top_logprobs` alternatives.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..answers.payload import DISTRIBUTION_LIMIT, large_field_extras, shown_distribution
from .errors import ApiError
from .openai_chat import ChatRequest

if TYPE_CHECKING:
    from ..answers.result import Decision, FieldResult
    from ..prompt import TextTokenizer

__all__ = ["Completion", "build_completion", "sse_chunks"]

_FLOOR = -9999.0  # OpenAI's log-probability for "never", which JSON can carry


def _json_key(label: Any) -> str:
    return label if isinstance(label, str) else json.dumps(label)


def _logprob(p: float) -> float:
    return round(math.log(p), 6) if p > 0 else _FLOOR


class Completion:
    """One decision's chat-completions answer (both the whole body and its stream).

    Args:
        req: The request.
        decision: Its decision.
        model: The served model's name.
        tokenizer: Counts the answer's tokens for `usage`.
    """

    def __init__(
        self, req: ChatRequest, decision: Decision[Any], model: str, tokenizer: TextTokenizer
    ):
        self.req = req
        self.decision = decision
        self.model = model
        self.id = "chatcmpl-" + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.content = json.dumps(decision.value.model_dump(mode="json"), ensure_ascii=False)
        self.completion_tokens = len(tokenizer.encode(self.content))
        if req.max_tokens is not None and self.completion_tokens > req.max_tokens:
            raise ApiError(
                400,
                "invalid_request_error",
                f"The answer's JSON is {self.completion_tokens} tokens, over max_tokens="
                f"{req.max_tokens}; this server never cuts an answer short. Raise "
                "max_tokens (or max_completion_tokens), or leave it out.",
                field="max_tokens",
            )
        self.call_id = "call_" + uuid.uuid4().hex[:24]

    # --- pieces -------------------------------------------------------------------------

    def _probs(self, f: FieldResult) -> dict[Any, float]:
        """The field's distribution (for a multi-label field: each label's probability of
        applying); at temperature 0, the limit: probability 1 on the answer."""
        if self.req.temperature != 0:
            return dict(shown_distribution(f))
        chosen = f.label if f.labels is not None else [f.label]
        keys = f.distribution if len(f.distribution) <= DISTRIBUTION_LIMIT else chosen
        return {k: (1.0 if k in chosen else 0.0) for k in keys}

    def extension(self) -> dict[str, Any]:
        """The `pcd` object of `choices[0]`."""
        d = self.decision
        zero = self.req.temperature == 0
        fields = {}
        for name, f in d.fields.items():
            dist = self._probs(f)
            entry: dict[str, Any] = {
                "value": f.label,
                "probability": None
                if f.probability is None
                else (1.0 if zero else round(f.probability, 6)),
                "distribution": {_json_key(k): round(p, 6) for k, p in dist.items()},
            }
            if f.labels is not None:
                entry["labels"] = dict(entry["distribution"])
            if f.expected is not None:
                limit = None if f.value is None else float(f.value)
                entry["expected"] = limit if zero else round(f.expected, 6)
            if f.certified is not None and f.probability_bounds and f.unscored_mass is not None:
                entry["certified"] = f.certified  # a pruned field (`pruning`)
                entry["probability_bounds"] = [round(b, 6) for b in f.probability_bounds]
                entry["unscored_mass"] = round(f.unscored_mass, 6)
            entry.update({k: v for k, v in large_field_extras(f).items() if k != "certified"})
            fields[name] = entry
        probs = [e["probability"] for e in fields.values() if e["probability"] is not None]
        return {
            "fields": fields,
            "confidence": min(probs) if probs else None,
            "temperature": self.req.temperature,
            "scoring": d.scoring,
            "orders": d.orders,
            "prefill_ms": round(d.prefill_ms, 3),
            "suffix_eval_ms": round(d.suffix_eval_ms, 3),
            "elapsed_ms": round(d.elapsed_ms, 3),
            "prompt_tokens": d.prompt_tokens,
            "prefix_cache_hit": d.prefix_cache_hit,
            "sequential_forward_passes": d.sequential_forward_passes,
        }

    def logprobs(self) -> dict[str, Any] | None:
        """`choices[0].logprobs`, or None when not asked for."""
        if not self.req.logprobs:
            return None
        content = []
        for f in self.decision.fields.values():
            if f.labels is not None:  # multi-label: each chosen label, P(it applies)
                labels = self._probs(f)
                for label in f.label or []:
                    content.append(self._entry(label, labels[label], []))
                continue
            if f.probability is None:  # a generated value: no distribution to report
                continue
            dist = self._probs(f)
            top = sorted(dist.items(), key=lambda kv: -kv[1])[: self.req.top_logprobs]
            content.append(self._entry(f.label, dist[f.label], top))
        return {"content": content, "refusal": None}

    @staticmethod
    def _entry(label: Any, p: float, top: list[tuple[Any, float]]) -> dict[str, Any]:
        text = json.dumps(label, ensure_ascii=False)
        return {
            "token": text,
            "logprob": _logprob(p),
            "bytes": list(text.encode()),
            "top_logprobs": [
                {
                    "token": json.dumps(k, ensure_ascii=False),
                    "logprob": _logprob(q),
                    "bytes": list(json.dumps(k, ensure_ascii=False).encode()),
                }
                for k, q in top
            ],
        }

    def usage(self) -> dict[str, Any]:
        prompt = self.decision.prompt_tokens
        return {
            "prompt_tokens": prompt,
            "completion_tokens": self.completion_tokens,
            "total_tokens": prompt + self.completion_tokens,
        }

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.req.tool else "stop"

    def _head(self, obj: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "pcd-" + self.decision.scoring,
        }

    # --- whole answer -------------------------------------------------------------------

    def body(self) -> dict[str, Any]:
        """The `ChatCompletion` JSON."""
        message: dict[str, Any] = {"role": "assistant", "refusal": None}
        if self.req.tool:
            message["content"] = None
            message["tool_calls"] = [
                {
                    "id": self.call_id,
                    "type": "function",
                    "function": {"name": self.req.tool, "arguments": self.content},
                }
            ]
        else:
            message["content"] = self.content
        return {
            **self._head("chat.completion"),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": self.logprobs(),
                    "finish_reason": self.finish_reason,
                    "pcd": self.extension(),
                }
            ],
            "usage": self.usage(),
        }

    # --- stream -------------------------------------------------------------------------

    def chunks(self) -> Iterator[dict[str, Any]]:
        """The `chat.completion.chunk` objects of the stream, in order."""

        def chunk(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
            choice.update(extra)
            out = {**self._head("chat.completion.chunk"), "choices": [choice]}
            if self.req.include_usage:
                out["usage"] = None
            return out

        pieces = _pieces(self.content)
        if self.req.tool:
            yield chunk(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": self.call_id,
                            "type": "function",
                            "function": {"name": self.req.tool, "arguments": ""},
                        }
                    ],
                }
            )
            for piece in pieces:
                yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
        else:
            yield chunk({"role": "assistant", "content": ""})
            for i, piece in enumerate(pieces):
                yield chunk({"content": piece}, logprobs=self.logprobs() if i == 0 else None)
        yield chunk({}, finish_reason=self.finish_reason, pcd=self.extension())
        if self.req.include_usage:
            yield {**self._head("chat.completion.chunk"), "choices": [], "usage": self.usage()}


def _pieces(content: str, size: int = 24) -> list[str]:
    """The answer in pieces of about `size` characters (at least one piece)."""
    return [content[i : i + size] for i in range(0, len(content), size)] or [""]


def build_completion(
    req: ChatRequest, decision: Decision[Any], *, model: str, tokenizer: TextTokenizer
) -> Completion:
    """The answer to `req` (see `Completion`).

    Raises:
        ApiError: 400 when the answer's JSON is over the request's `max_tokens`.
    """
    return Completion(req, decision, model, tokenizer)


def sse_chunks(completion: Completion) -> Iterator[str]:
    """The stream as server-sent events: `data: {chunk}` lines, then `data: [DONE]`."""
    for c in completion.chunks():
        yield f"data: {json.dumps(c, ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"
