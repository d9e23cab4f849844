"""`Decider`: a loaded model plus the PCD engine, the object users call.

It also hosts the seed-compatible `run_parallel_generation` and the process-wide default
decider used by `@decision` models' `.decide()`.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from .errors import InvalidArgumentError, InvalidContextError
from .result import Decision, FieldResult, softmax_scores
from .schema import Schema, compile_schema

if TYPE_CHECKING:
    from .engine.models import LoadedModel
    from .engine.scorer import Engine, PassMode, ScoredBatch

__all__ = ["Decider", "default_decider", "run_parallel_generation"]

T = TypeVar("T")
Scoring = Literal["full", "constrained"]


def _check_temperature(temperature: Any) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise InvalidArgumentError(
            f"temperature must be a number > 0; got {type(temperature).__name__} {temperature!r}."
        )
    t = float(temperature)
    if not math.isfinite(t) or t <= 0:
        raise InvalidArgumentError(f"temperature must be finite and > 0; got {temperature!r}.")
    return t


def _check_scoring(scoring: Any) -> Scoring:
    if scoring not in ("full", "constrained"):
        raise InvalidArgumentError(f"unknown scoring {scoring!r}; accepted: 'full', 'constrained'.")
    return scoring


def _check_context(context: Any, index: int | None = None) -> str:
    if not isinstance(context, str):
        where = f" #{index}" if index is not None else ""
        raise InvalidContextError(
            f"context{where} must be a str; got {type(context).__name__}. Serialise structured "
            "input (e.g. json.dumps) before deciding."
        )
    return context


class Decider:
    """Scores schemas on one loaded model.

    Create one with `Decider.load(...)`. Instances are thread-safe: the engine runs one
    pass at a time.

    Args:
        loaded: The loaded model.
        engine: Engine options (`pack_budget`, `streams`, `prefix_cache_size`, ...).
    """

    def __init__(self, loaded: LoadedModel, **engine: Any):
        from .engine.scorer import Engine

        self.loaded = loaded
        self.engine: Engine = Engine(
            loaded.model,
            loaded.tokenizer,
            context_window=loaded.context_window,
            device=loaded.device,
            model_type=loaded.model_type,
            bos_token_id=loaded.bos_token_id,
            add_bos=loaded.add_bos,
            **engine,
        )
        self.calibration: Any = None

    @classmethod
    def load(
        cls,
        source: str | os.PathLike[str] | None = None,
        *,
        dtype: str = "auto",
        calibration: Any = None,
        **engine: Any,
    ) -> Decider:
        """Loads a model and returns a ready `Decider`.

        Args:
            source: `None` for the embedded SmolLM2-135M-Instruct, a `.gguf` file (llama or
                qwen2, any quant type), an MLX model directory or a Hugging Face repo id.
            dtype: `"auto"` picks float32 on CPU (fast path) and keeps stored weights on GPU.
            calibration: A `Calibration` or the path of a calibration JSON file.
            **engine: Engine options.

        Raises:
            ModelLoadError: naming the source and the fix.
        """
        from .engine.models import load_model
        from .engine.platform import ensure_fast_path

        ensure_fast_path()
        decider = cls(load_model(source, dtype=dtype), **engine)
        if calibration is not None:
            decider = decider.with_calibration(calibration)
        return decider

    # --- properties -----------------------------------------------------------------------

    @property
    def model_id(self) -> str:
        """The loaded model's id."""
        return self.loaded.model_id

    @property
    def device(self) -> str:
        """`cpu`, `metal` or `cuda`."""
        return self.loaded.device

    def __repr__(self) -> str:
        return (
            f"Decider(model={self.model_id!r}, device={self.device!r}, dtype={self.loaded.dtype!r})"
        )

    # --- calibration ----------------------------------------------------------------------

    def with_calibration(self, calibration: Any) -> Decider:
        """A decider sharing this one's model that applies per-field temperatures.

        Args:
            calibration: A `pcd_tools.calibration.Calibration` or the path of its JSON file.
        """
        from .calibration import Calibration

        cal = (
            Calibration.load(calibration)
            if isinstance(calibration, (str, os.PathLike))
            else calibration
        )
        if not isinstance(cal, Calibration):
            raise InvalidArgumentError(
                f"calibration must be a Calibration or a path; got {type(calibration).__name__}."
            )
        cal.check_model(self.model_id)
        clone = object.__new__(Decider)
        clone.loaded = self.loaded
        clone.engine = self.engine
        clone.calibration = cal
        return clone

    # --- LangChain (the `langchain` extra, imported lazily) -----------------------------

    def as_tool(
        self, schema: Any, name: str | None = None, description: str | None = None, **kwargs: Any
    ) -> Any:
        """A LangChain `DecisionTool` that decides `schema` for its input text.

        Args:
            schema: The decision schema.
            name: Tool name (default: derived from the schema).
            description: Tool description (default: the schema's instructions).
            **kwargs: More `DecisionTool` options (e.g. `args_schema`, `threshold`).
        """
        from .agents.tools import DecisionTool

        return DecisionTool.from_decider(self, schema, name=name, description=description, **kwargs)

    def with_structured_output(self, schema: Any, include_raw: bool = False, **kwargs: Any) -> Any:
        """A Runnable that maps a string, messages or a `PromptValue` to a validated `schema`.

        Drop-in for a chat model's `with_structured_output(schema)` in LangChain recipes.

        Args:
            schema: The decision schema (Pydantic model).
            include_raw: Return `{"raw": AIMessage, "parsed": ..., "parsing_error": None}`.
            **kwargs: Options such as `temperature`.
        """
        from .agents.structured import structured_runnable

        return structured_runnable(self, schema, include_raw=include_raw, **kwargs)

    # --- deciding -------------------------------------------------------------------------

    def decide(
        self,
        schema: Any,
        context: str,
        *,
        temperature: float = 1.0,
        scoring: Scoring = "full",
        mode: PassMode | None = None,
        choice_order: Mapping[str, Sequence[int]] | None = None,
    ) -> Decision[Any]:
        """Scores every field of `schema` for `context`.

        Args:
            schema: A Pydantic model class, `StructuredSchema`, dict spec or `Schema`.
            context: The text to decide on (any Unicode; never truncated).
            temperature: Softmax temperature (> 0); changes confidence, never the answer.
            scoring: `"full"` (model probability of each candidate given that it answers
                with one) or `"constrained"` (renormalised at each trie node).
            mode: `"packed"`, `"batched"` or `"sequential"`; default is the fastest exact one.
            choice_order: Per-field order (indices) in which allowed values are listed.

        Returns:
            A `Decision` whose `.value` is an instance of the schema's model.

        Raises:
            SchemaError: if the schema is invalid.
            InvalidContextError: if `context` is not a str.
            ContextTooLongError: if the prompt does not fit the model's window.
        """
        return self.decide_many(
            schema,
            [context],
            temperature=temperature,
            scoring=scoring,
            mode=mode,
            choice_order=choice_order,
            batch_size=1,
        )[0]

    def decide_many(
        self,
        schema: Any,
        contexts: Sequence[str],
        *,
        temperature: float = 1.0,
        scoring: Scoring = "full",
        mode: PassMode | None = None,
        choice_order: Mapping[str, Sequence[int]] | None = None,
        batch_size: int = 32,
    ) -> list[Decision[Any]]:
        """Scores `schema` for several contexts, batching them for throughput.

        Args:
            schema: As for `decide`.
            contexts: The texts, in order; results come back in the same order.
            temperature: As for `decide`.
            scoring: As for `decide`.
            mode: As for `decide`.
            choice_order: As for `decide`.
            batch_size: Contexts handed to the engine at once; it splits them into row
                groups of similar length (`batch_tokens`) that run concurrently.
        """
        compiled = compile_schema(schema)
        t = _check_temperature(temperature)
        sc = _check_scoring(scoring)
        if isinstance(contexts, str) or not isinstance(contexts, Sequence):
            raise InvalidContextError(
                f"contexts must be a list of str; got {type(contexts).__name__}."
            )
        ctxs = [_check_context(c, i if len(contexts) > 1 else None) for i, c in enumerate(contexts)]
        if not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidArgumentError(f"batch_size must be an int >= 1; got {batch_size!r}.")
        order = dict(choice_order) if choice_order else None
        # Batch contexts of similar length together (less padding); answer in input order.
        by_len = sorted(range(len(ctxs)), key=lambda i: len(ctxs[i]))
        out: list[Decision[Any] | None] = [None] * len(ctxs)
        for start in range(0, len(ctxs), batch_size):
            idx = by_len[start : start + batch_size]
            t0 = time.perf_counter()
            batch = self.engine.score(
                compiled, [ctxs[i] for i in idx], mode=mode, choice_order=order
            )
            elapsed = (time.perf_counter() - t0) * 1e3
            for j, i in enumerate(idx):
                out[i] = self._decision(compiled, batch, j, t, sc, elapsed, mode, order)
        return [d for d in out if d is not None]

    def scores(self, schema: Any, contexts: Sequence[str], **kwargs: Any) -> ScoredBatch:
        """Raw per-edge log-probabilities (for evaluation and calibration tooling)."""
        return self.engine.score(compile_schema(schema), list(contexts), **kwargs)

    def _decision(
        self,
        schema: Schema,
        batch: ScoredBatch,
        i: int,
        temperature: float,
        scoring: Scoring,
        elapsed_ms: float,
        mode: PassMode | None,
        choice_order: dict[str, Sequence[int]] | None = None,
    ) -> Decision[Any]:
        plan = self.engine.plan(schema, choice_order)
        fields: dict[str, FieldResult] = {}
        native: dict[str, Any] = {}
        cal = self.calibration
        if cal is not None:
            cal.check_schema(schema)
        for spec, trie, edge in zip(schema.fields, plan.tries, batch.edge_logp[i]):
            logz = trie.score(edge, constrained=scoring == "constrained")
            probs = (
                cal.probabilities(spec.name, logz, temperature)
                if cal is not None
                else softmax_scores(logz, temperature)
            )
            res = FieldResult.from_probs(spec, probs, logz)
            fields[spec.name] = res
            native[spec.name] = res.value
        return Decision(
            value=schema.build(native),
            fields=fields,
            prefill_ms=batch.prefill_ms,
            suffix_eval_ms=batch.suffix_eval_ms,
            elapsed_ms=elapsed_ms,
            sequential_forward_passes=batch.sequential_forward_passes,
            prompt_tokens=batch.prompt_tokens[i],
            prefix_cache_hit=batch.prefix_cache_hit,
            model_id=self.model_id,
            device=self.device,
            temperature=temperature,
            scoring=scoring,
            mode=mode or self.engine.default_mode,
            calibrated=cal is not None,
            calibration_file=getattr(cal, "path", None) if cal is not None else None,
        )


_DEFAULT: Decider | None = None
_DEFAULT_LOCK = threading.Lock()


def default_decider() -> Decider:
    """The process-wide `Decider` on the embedded model, loaded on first use."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = Decider.load()
        return _DEFAULT


def run_parallel_generation(
    context: str,
    schema: Any,
    temperature: float = 1.0,
    decider: Decider | None = None,
    *,
    scoring: Scoring = "full",
) -> dict[str, Any]:
    """The seed's entry point: scores `schema` for `context` and returns the response dict.

    Args:
        context: The text to decide on.
        schema: A `StructuredSchema`, dict spec, list of `FieldDefinition` or Pydantic model.
        temperature: Softmax temperature (> 0).
        decider: The decider to use; defaults to the embedded model.
        scoring: `"full"` or `"constrained"`.
    """
    d = decider or default_decider()
    return d.decide(schema, context, temperature=temperature, scoring=scoring).to_response()
