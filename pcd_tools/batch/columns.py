"""The decision columns of a batch job, and deciding a list of texts where a row may fail.

`pcd batch` and `pcd_tools.ray.decide_dataset` write the same columns:

| column         | type                   | content                                            |
|----------------|------------------------|----------------------------------------------------|
| `<field>`      | bool, int64 or string  | the answer's JSON value (`FieldResult.label`)       |
| `<field>__p`   | float64                | its probability (`FieldResult.probability`)         |
| `confidence`   | float64                | the lowest probability over the fields              |
| `error`        | string                 | why the row was not decided; null when it was       |

A boolean field is a bool column; an enum whose values are all strings is a string
column, all integers an int64 column; an `Optional` field's "not stated" answer is null.
Any other answer (an enum mixing strings and integers; multi-label lists, union branches
or generated values as the schema language grows) is written as its JSON text, and
`<field>__p` is null when the answer has no probability. Nested and union fields keep
their dotted names (`payment.method`). A row that failed has every decision column null
except `error`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Union

from ..errors import InvalidArgumentError
from ..schema import FieldSpec, Schema, compile_schema

if TYPE_CHECKING:
    import pyarrow as pa

    from ..answers.result import Decision
    from ..decide.decider import Decider

__all__ = [
    "CONFIDENCE",
    "ERROR",
    "PROB_SUFFIX",
    "BadRow",
    "Outcome",
    "check_column_clash",
    "decide_texts",
    "decision_column_names",
    "decision_schema",
    "decision_table",
    "row_problem",
]

PROB_SUFFIX = "__p"
CONFIDENCE = "confidence"
ERROR = "error"

Outcome = Union["Decision[Any]", str]
"""A row's outcome: its `Decision`, or the message that says why it failed."""


class BadRow:
    """A row the reader could not turn into a text (a malformed JSON line, say).

    Args:
        message: Why, naming the line.
    """

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message

    def __repr__(self) -> str:
        return f"BadRow({self.message!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BadRow) and other.message == self.message

    def __hash__(self) -> int:
        return hash(self.message)


def _kind(spec: FieldSpec) -> str:
    """The column kind of a field: `bool`, `int`, `str` or `json`."""
    labels = [c.label for c in spec.choices if c.label is not None]
    if labels and all(isinstance(x, bool) for x in labels):
        return "bool"
    if labels and all(isinstance(x, int) and not isinstance(x, bool) for x in labels):
        return "int"
    if labels and all(isinstance(x, str) for x in labels):
        return "str"
    return "json"


def decision_column_names(schema: Any) -> list[str]:
    """The decision columns, in order: `<field>`, `<field>__p` per field, `confidence`, `error`.

    Args:
        schema: Any accepted schema form.
    """
    compiled = compile_schema(schema)
    names: list[str] = []
    for f in compiled.fields:
        names += [f.name, f.name + PROB_SUFFIX]
    return [*names, CONFIDENCE, ERROR]


def check_column_clash(schema: Any, existing: Iterable[str], *, where: str = "the input") -> None:
    """Refuses a decision column whose name is already taken.

    Args:
        schema: Any accepted schema form.
        existing: Column names already present (input columns, the id column).
        where: What holds `existing`, for the message.

    Raises:
        InvalidArgumentError: naming the clashing columns.
    """
    taken = set(existing)
    clash = [n for n in decision_column_names(schema) if n in taken]
    if clash:
        raise InvalidArgumentError(
            f"{where} already has column(s) {clash}, which the decisions would overwrite "
            f"(decision columns: {decision_column_names(schema)}). Rename or drop them first."
        )


def decision_schema(schema: Any) -> pa.Schema:
    """The Arrow schema of the decision columns.

    Args:
        schema: Any accepted schema form.
    """
    import pyarrow as pa

    types = {"bool": pa.bool_(), "int": pa.int64(), "str": pa.string(), "json": pa.string()}
    cols: list[pa.Field] = []
    for f in compile_schema(schema).fields:
        cols.append(pa.field(f.name, types[_kind(f)]))
        cols.append(pa.field(f.name + PROB_SUFFIX, pa.float64()))
    cols += [pa.field(CONFIDENCE, pa.float64()), pa.field(ERROR, pa.string())]
    return pa.schema(cols)


def _cell(kind: str, label: Any) -> Any:
    if label is None or kind != "json":
        return label
    return json.dumps(label, ensure_ascii=False, default=str)


def decision_table(schema: Any, outcomes: Sequence[Outcome]) -> pa.Table:
    """The decision columns for `outcomes`, one row each, as an Arrow table.

    Args:
        schema: The schema the decisions answer.
        outcomes: Per row, its `Decision` or its error message.
    """
    import pyarrow as pa

    compiled = compile_schema(schema)
    kinds = [(f.name, _kind(f)) for f in compiled.fields]
    cols: dict[str, list[Any]] = {n: [] for n in decision_column_names(compiled)}
    for out in outcomes:
        if isinstance(out, str):
            for name in cols:
                cols[name].append(out if name == ERROR else None)
            continue
        for name, kind in kinds:
            res = out.fields[name]
            cols[name].append(_cell(kind, res.label))
            cols[name + PROB_SUFFIX].append(res.probability)
        cols[CONFIDENCE].append(_confidence(out))
        cols[ERROR].append(None)
    return pa.Table.from_pydict(cols, schema=decision_schema(compiled))


def _confidence(d: Decision[Any]) -> float | None:
    probs = [f.probability for f in d.fields.values() if f.probability is not None]
    return min(probs) if probs else None


def _message(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def row_problem(text: Any, allow_empty: bool = False) -> str | None:
    """Why `text` cannot be decided, found without the model (missing, not a string,
    empty, unreadable), or None."""
    if isinstance(text, BadRow):
        return text.message
    if text is None or (isinstance(text, float) and text != text):  # null or NaN
        return "InvalidContextError: the text is missing (null)."
    if not isinstance(text, str):
        shown = repr(text)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return f"InvalidContextError: the text must be a string; got {type(text).__name__} {shown}."
    if not allow_empty and not text.strip():
        return (
            f"InvalidContextError: the text is empty or only whitespace ({text[:20]!r}); "
            "pass allow_empty to decide on it anyway."
        )
    return None


def decide_texts(
    decider: Decider,
    schema: Any,
    texts: Sequence[Any],
    *,
    temperature: float = 1.0,
    scoring: str = "auto",
    batch_size: int = 32,
    allow_empty: bool = False,
    on_rows: Callable[[int], None] | None = None,
) -> list[Outcome]:
    """Decides every text it can; a row that cannot be decided gets its reason instead.

    Texts that are missing, not strings, empty (unless `allow_empty`) or too long for the
    model's window fail on their own without reaching the model. The rest are scored in
    the batches `decide_many(texts, batch_size=...)` would make (similar lengths
    together); should a batch raise, each of its rows is decided alone so that only the
    bad ones fail.

    Args:
        decider: The loaded decider.
        schema: Any accepted schema form.
        texts: The rows' texts (any values; `BadRow` for unreadable rows).
        temperature: Softmax temperature (> 0).
        scoring: `"auto"` (the default: a large field by certified pruned search, the
            others `"full"`), `"full"` or `"constrained"`.
        batch_size: Contexts per engine batch.
        allow_empty: Decide on empty or whitespace-only texts instead of failing them.
        on_rows: Called with the number of rows finished, after the checks and after
            each batch.

    Returns:
        Per row, in order, its `Decision` or `"<ErrorType>: <message>"`.
    """
    compiled: Schema = compile_schema(schema)
    engine = decider.engine
    plan = engine.plan(compiled)
    out: list[Outcome | None] = [None] * len(texts)
    todo: list[int] = []
    for i, text in enumerate(texts):
        why = row_problem(text, allow_empty)
        if why is None:
            try:
                engine.check_length(plan, engine.encode_ids(text))
            except Exception as e:  # ContextTooLongError, or a tokenizer that refuses it
                why = _message(e)
        if why is None:
            todo.append(i)
        else:
            out[i] = why
    if on_rows is not None and len(todo) < len(texts):
        on_rows(len(texts) - len(todo))
    kw: dict[str, Any] = {
        "temperature": temperature,
        "scoring": scoring,
        "allow_empty": allow_empty,
    }
    todo.sort(key=lambda i: len(texts[i]))  # stable: the batches decide_many itself makes
    for lo in range(0, len(todo), batch_size):
        idx = todo[lo : lo + batch_size]
        batch = [texts[i] for i in idx]
        decided: list[Outcome]
        try:
            decided = list(decider.decide_many(compiled, batch, batch_size=len(batch), **kw))
        except Exception:
            decided = [_decide_one(decider, compiled, t, kw) for t in batch]
        for i, d in zip(idx, decided):
            out[i] = d
        if on_rows is not None:
            on_rows(len(idx))
    missing = [i for i, o in enumerate(out) if o is None]
    if missing:  # pragma: no cover - every row is either checked out or decided above
        raise RuntimeError(f"rows {missing} were neither decided nor failed")
    return [o for o in out if o is not None]


def _decide_one(decider: Decider, schema: Schema, text: str, kw: dict[str, Any]) -> Outcome:
    try:
        return decider.decide(schema, text, **kw)
    except Exception as e:
        return _message(e)
