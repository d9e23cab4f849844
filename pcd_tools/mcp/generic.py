"""The generic MCP tools: `classify` (one of the given labels), `tag` (the labels that
apply, any number of them) and `yes_no`, each a one-field schema made per call's labels
or question (cached) and scored like any other (`pcd_tools.mcp.tools`)."""

from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from ..answers.payload import label_key, shown_distribution
from ..errors import SchemaError
from ..schema import Schema, compile_schema
from ._sdk import CallToolResult
from .tools import (
    MIN_LABELS,
    Limits,
    TextArg,
    ToolInputError,
    ToolSpec,
    _annotate,
    _decide,
    _input_error,
    _param,
    _result,
    check_text,
)

__all__ = ["classify_schema", "generic_tools", "tag_schema", "yes_no_schema"]


class ClassifyResult(BaseModel):
    """The answer of `classify`."""

    model_config = ConfigDict(extra="forbid")

    label: str = Field(description="The most probable label.")
    probability: float = Field(description="Its probability.")
    distribution: dict[str, float] = Field(description="Every label's probability.")
    action: Literal["act", "review"] = Field(
        description="'review' when the probability is below the threshold."
    )


class TagResult(BaseModel):
    """The answer of `tag`."""

    model_config = ConfigDict(extra="forbid")

    labels: list[str] = Field(description="The labels that apply, most probable first.")
    probability: float = Field(
        description="Their total share of the model's ranking (0 when none applies)."
    )
    distribution: dict[str, float] = Field(
        description="Each label's share of the ranking (more than 255 labels: the 20 most "
        "probable)."
    )
    certified: bool | None = Field(
        default=None,
        description="For a large label set read by certified pruned search: whether the "
        "labels are provably those the exhaustive reading chooses.",
    )
    action: Literal["act", "review"] = Field(
        description="'review' when the probability is below the threshold."
    )


class YesNoResult(BaseModel):
    """The answer of `yes_no`."""

    model_config = ConfigDict(extra="forbid")

    answer: bool = Field(description="The more probable answer.")
    probability: float = Field(description="Its probability.")
    action: Literal["act", "review"] = Field(
        description="'review' when the probability is below the threshold."
    )


CLASSIFY_DOC = (
    "Classify a text into exactly one of the given labels, by scoring each label with a "
    "local language model (never generating text). Returns the most probable label, its "
    "probability, every label's probability, and action: 'review' when the probability is "
    "below {threshold:g}, else 'act'. Give {min} or more distinct labels (thousands are fine); `question` says what "
    "to judge (default: which label fits the text)."
)
TAG_DOC = (
    "Tag a text with the given labels that apply to it, by scoring one ranking over all of "
    "them with a local language model (never generating text). Returns the labels whose "
    "share of the ranking is at least `min_share` (default {share:g}), most probable first, "
    "at most `max_labels` (default {most}); their total share as probability; each label's "
    "share; and action: 'review' when that total is below {threshold:g}, else 'act'. Give "
    "{min} or more distinct labels (thousands are fine)."
)
TAG_SHARE = 0.1
TAG_MOST = 3
YES_NO_DOC = (
    "Answer a yes/no question about a text by scoring true and false with a local language "
    "model. Returns the answer (true = yes), its probability and action: 'review' when the "
    "probability is below {threshold:g}, else 'act'."
)


def _labels(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise ToolInputError("labels must be a list of strings.")
    labels = tuple(raw)
    if len(labels) < MIN_LABELS:
        raise ToolInputError(
            f"labels has {len(labels)} item(s); accepted: {MIN_LABELS} or more labels (a large "
            "set is scored exactly by certified pruned search)."
        )
    empty = [i for i, x in enumerate(labels) if not x.strip()]
    if empty:
        raise ToolInputError(f"labels[{empty[0]}] is empty; every label needs some text.")
    seen: set[str] = set()
    dupes = [x for x in labels if x in seen or seen.add(x)]  # type: ignore[func-returns-value]
    if dupes:
        raise ToolInputError(f"labels repeats {dupes[0]!r}; every label must be distinct.")
    return labels


def _question(raw: Any, required: bool) -> str | None:
    if raw is None and not required:
        return None
    if not isinstance(raw, str) or not raw.strip():
        raise ToolInputError("question must be a non-empty string.")
    return raw.strip()


@lru_cache(maxsize=256)
def classify_schema(labels: tuple[str, ...], question: str | None) -> Schema:
    """The one-field schema `classify` scores (cached per labels and question)."""
    task = question or "Which of the labels fits the text?"
    defs: dict[str, Any] = {"label": (Literal[labels], Field(description=task))}
    model = create_model("Classify", __doc__=f"Classify the text. {task}", **defs)
    try:
        return compile_schema(model)
    except SchemaError as exc:
        raise _input_error(exc) from exc


@lru_cache(maxsize=256)
def tag_schema(
    labels: tuple[str, ...], question: str | None, min_share: float, max_labels: int
) -> Schema:
    """The one ranked multi-label field `tag` scores (cached per arguments)."""
    task = question or "Which of the labels apply to the text?"
    extra: dict[str, Any] = {"reading": "ranked", "threshold": min_share}
    field = Field(description=task, max_length=max_labels, json_schema_extra=extra)
    defs: dict[str, Any] = {"labels": (list[Literal[labels]], field)}  # type: ignore[valid-type]
    model = create_model("Tag", __doc__=f"Tag the text. {task}", **defs)
    try:
        return compile_schema(model)
    except SchemaError as exc:
        raise _input_error(exc) from exc


def _share(raw: Any) -> float:
    if raw is None:
        return TAG_SHARE
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 < raw < 1:
        raise ToolInputError(f"min_share must be a number strictly between 0 and 1; got {raw!r}.")
    return float(raw)


def _most(raw: Any, labels: int) -> int:
    if raw is None:
        return min(TAG_MOST, labels)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= labels:
        raise ToolInputError(
            f"max_labels must be a whole number from 1 to the {labels} labels given; got {raw!r}."
        )
    return raw


@lru_cache(maxsize=256)
def yes_no_schema(question: str) -> Schema:
    """The one-field schema `yes_no` scores (cached per question)."""
    model = create_model(
        "YesNo",
        __doc__=f"Answer the question about the text with true (yes) or false (no): {question}",
        answer=(bool, Field(description=question)),
    )
    return compile_schema(model)


def generic_tools(
    decider: Any, *, threshold: float, limits: Limits, decide_kwargs: dict[str, Any]
) -> list[ToolSpec]:
    """`classify(text, labels, question?)`, `tag(text, labels, question?, min_share?,
    max_labels?)` and `yes_no(text, question)`."""

    async def classify(**kwargs: Any) -> Any:
        text = check_text(kwargs.get("text"), limits)
        labels = _labels(kwargs.get("labels"))
        schema = classify_schema(labels, _question(kwargs.get("question"), required=False))
        f = (await _decide(decider, schema, text, decide_kwargs)).fields["label"]
        p = float(f.probability)
        payload = {
            "label": f.label,
            "probability": p,
            "distribution": {label_key(k): float(v) for k, v in f.distribution.items()},
            "action": "review" if p < threshold else "act",
        }
        return _result(payload, f.label)

    async def tag(**kwargs: Any) -> Any:
        text = check_text(kwargs.get("text"), limits)
        labels = _labels(kwargs.get("labels"))
        question = _question(kwargs.get("question"), required=False)
        share = _share(kwargs.get("min_share"))
        schema = tag_schema(labels, question, share, _most(kwargs.get("max_labels"), len(labels)))
        f = (await _decide(decider, schema, text, decide_kwargs)).fields["labels"]
        p = float(f.probability)
        payload: dict[str, Any] = {
            "labels": list(f.label),
            "probability": p,
            "distribution": {label_key(k): float(v) for k, v in shown_distribution(f).items()},
            "action": "review" if p < threshold else "act",
        }
        if f.certified is not None:
            payload["certified"] = bool(f.certified)
        return _result(payload, payload["labels"])

    async def yes_no(**kwargs: Any) -> Any:
        text = check_text(kwargs.get("text"), limits)
        schema = yes_no_schema(_question(kwargs.get("question"), required=True) or "")
        f = (await _decide(decider, schema, text, decide_kwargs)).fields["answer"]
        p = float(f.probability)
        payload = {
            "answer": bool(f.value),
            "probability": p,
            "action": "review" if p < threshold else "act",
        }
        return _result(payload, payload["answer"])

    labels_arg = Annotated[
        list[str],
        Field(description=f"The allowed labels, {MIN_LABELS} or more, distinct."),
    ]
    question_arg = Annotated[
        str | None, Field(description="What to judge, e.g. 'Which team owns this ticket?'")
    ]
    _annotate(
        classify,
        "classify",
        [
            _param("text", TextArg),
            _param("labels", labels_arg),
            _param("question", question_arg, None),
        ],
        Annotated[CallToolResult, ClassifyResult],
    )

    _annotate(
        tag,
        "tag",
        [
            _param("text", TextArg),
            _param("labels", labels_arg),
            _param("question", question_arg, None),
            _param(
                "min_share",
                Annotated[
                    float | None,
                    Field(description=f"The share a label needs (default {TAG_SHARE:g})."),
                ],
                None,
            ),
            _param(
                "max_labels",
                Annotated[int | None, Field(description=f"The most labels (default {TAG_MOST}).")],
                None,
            ),
        ],
        Annotated[CallToolResult, TagResult],
    )
    _annotate(
        yes_no,
        "yes_no",
        [
            _param("text", TextArg),
            _param(
                "question",
                Annotated[str, Field(description="The yes/no question about the text.")],
            ),
        ],
        Annotated[CallToolResult, YesNoResult],
    )
    kw = {"threshold": threshold, "min": MIN_LABELS}
    return [
        ToolSpec("classify", CLASSIFY_DOC.format(**kw), classify, "Classify a text"),
        ToolSpec(
            "tag",
            TAG_DOC.format(share=TAG_SHARE, most=TAG_MOST, **kw),
            tag,
            "Tag a text with the labels that apply",
        ),
        ToolSpec("yes_no", YES_NO_DOC.format(**kw), yes_no, "Yes/no question about a text"),
    ]
