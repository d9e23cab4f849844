"""`Decider`: a loaded model plus the PCD engine, the object users call.

It also hosts the seed-compatible `run_parallel_generation` and the process-wide default
decider used by `@decision` models' `.decide()`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .checks import Scoring, check_batch_size, check_context, check_contexts, check_options
from .errors import InvalidArgumentError
from .joint import answers
from .orders import average, orderings
from .prompt import PromptPreview, field_suffix
from .result import BatchTiming, Decision
from .schema import Schema, compile_schema
from .waves import WaveAnswers, has_waves

if TYPE_CHECKING:
    from .engine.engine import Engine, PassMode, ScoredBatch
    from .engine.models import LoadedModel

__all__ = ["Decider", "default_decider", "run_parallel_generation"]

T = TypeVar("T")


class Decider:
    """Scores schemas on one loaded model.

    Create one with `Decider.load(...)`. Instances are thread-safe: the engine runs one
    pass at a time.

    Args:
        loaded: The loaded model.
        engine: Engine options (`pack_budget`, `streams`, `prefix_cache_size`, ...).
    """

    def __init__(self, loaded: LoadedModel, **engine: Any):
        from .engine.engine import Engine

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
        orders: int = 1,
        allow_empty: bool = False,
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
            orders: Average each field's distribution over this many evenly spaced
                rotations of its listing, to reduce the model's lean towards values listed
                early or late. Costs `orders` times the prefill and fields pass (each
                rotation's schema prefix is cached). The decision reports `orders` and
                each field's `flip_rate`.
            allow_empty: Decide on an empty or whitespace-only context instead of raising.

        Returns:
            A `Decision` whose `.value` is an instance of the schema's model.

        Raises:
            SchemaError: if the schema is invalid.
            InvalidContextError: if `context` is not a str, or is empty and `allow_empty`
                is not set.
            InvalidArgumentError: for a bad temperature, scoring, mode or `orders`.
            ContextTooLongError: if the prompt does not fit the model's window.
        """
        return self.decide_many(
            schema,
            [context],
            temperature=temperature,
            scoring=scoring,
            mode=mode,
            choice_order=choice_order,
            orders=orders,
            allow_empty=allow_empty,
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
        orders: int = 1,
        allow_empty: bool = False,
        batch_size: int = 32,
    ) -> list[Decision[Any]]:
        """Scores `schema` for several contexts, batching them for throughput.

        Each decision's `elapsed_ms`, `prefill_ms` and `suffix_eval_ms` are its equal
        share of the engine call that scored it, so they add up to the wall time; the
        call's totals and size are in `Decision.batch`.

        Args:
            schema: As for `decide`.
            contexts: The texts, in order; results come back in the same order.
            temperature: As for `decide`.
            scoring: As for `decide`.
            mode: As for `decide`.
            choice_order: As for `decide`.
            orders: As for `decide`.
            allow_empty: As for `decide`.
            batch_size: Contexts handed to the engine at once; it splits them into row
                groups of similar length (`batch_tokens`) that run concurrently.
        """
        compiled, options = check_options(
            schema, temperature, scoring, mode, choice_order, orders, allow_empty
        )
        ctxs = check_contexts(contexts, allow_empty)
        size = check_batch_size(batch_size)
        return self._decide_checked(compiled, ctxs, size, **options)

    def _decide_checked(
        self,
        compiled: Schema,
        ctxs: list[str],
        batch_size: int,
        *,
        temperature: float,
        scoring: Scoring,
        mode: PassMode | None,
        choice_order: dict[str, Sequence[int]] | None,
        orders: int,
        allow_empty: bool,
    ) -> list[Decision[Any]]:
        if orders > 1:
            runs = [
                self._decide_in_order(
                    compiled, ctxs, batch_size, temperature, scoring, mode, dict(o)
                )
                for o in orderings(compiled, orders)
            ]
            return average(compiled, runs)
        return self._decide_in_order(
            compiled, ctxs, batch_size, temperature, scoring, mode, choice_order
        )

    def _decide_in_order(
        self,
        compiled: Schema,
        ctxs: list[str],
        batch_size: int,
        temperature: float,
        scoring: Scoring,
        mode: PassMode | None,
        order: Mapping[str, Sequence[int]] | None,
    ) -> list[Decision[Any]]:
        order = dict(order) if order is not None else None
        # Batch contexts of similar length together (less padding); answer in input order.
        by_len = sorted(range(len(ctxs)), key=lambda i: len(ctxs[i]))
        out: list[Decision[Any] | None] = [None] * len(ctxs)
        for start in range(0, len(ctxs), batch_size):
            idx = by_len[start : start + batch_size]
            t0 = time.perf_counter()
            follow_up = (
                WaveAnswers(compiled, temperature, scoring, self.calibration).next_questions
                if has_waves(compiled)
                else None
            )
            batch = self.engine.score(
                compiled, [ctxs[i] for i in idx], mode=mode, choice_order=order, follow_up=follow_up
            )
            timing = BatchTiming(
                size=len(idx),
                elapsed_ms=(time.perf_counter() - t0) * 1e3,
                prefill_ms=batch.prefill_ms,
                suffix_eval_ms=batch.suffix_eval_ms,
            )
            for j, i in enumerate(idx):
                out[i] = self._decision(
                    compiled, batch, j, temperature, scoring, timing, mode, order
                )
        return [d for d in out if d is not None]

    async def adecide(
        self,
        schema: Any,
        context: str,
        *,
        temperature: float = 1.0,
        scoring: Scoring = "full",
        mode: PassMode | None = None,
        choice_order: Mapping[str, Sequence[int]] | None = None,
        orders: int = 1,
        allow_empty: bool = False,
    ) -> Decision[Any]:
        """`decide` for async code: awaits the engine worker, never blocks the event loop.

        Concurrent awaiters with the same schema and options are micro-batched into one
        `decide_many` call on the engine's worker thread (see `pcd_tools.aio`). Arguments
        are checked before anything is queued, so a bad one raises here at once.

        Takes the same arguments as `decide`.
        """
        return (
            await self.adecide_many(
                schema,
                [context],
                temperature=temperature,
                scoring=scoring,
                mode=mode,
                choice_order=choice_order,
                orders=orders,
                allow_empty=allow_empty,
            )
        )[0]

    async def adecide_many(
        self,
        schema: Any,
        contexts: Sequence[str],
        *,
        temperature: float = 1.0,
        scoring: Scoring = "full",
        mode: PassMode | None = None,
        choice_order: Mapping[str, Sequence[int]] | None = None,
        orders: int = 1,
        allow_empty: bool = False,
    ) -> list[Decision[Any]]:
        """`decide_many` for async code; the contexts join the engine worker's queue.

        Takes the same arguments as `decide_many`, less `batch_size` (the queue batches);
        results come back in the order of `contexts`.
        """
        from .aio import gather, queue_for

        compiled, options = check_options(
            schema, temperature, scoring, mode, choice_order, orders, allow_empty
        )
        ctxs = check_contexts(contexts, allow_empty)
        return await gather(queue_for(self).submit(compiled, ctxs, options))

    def scores(self, schema: Any, contexts: Sequence[str], **kwargs: Any) -> ScoredBatch:
        """Raw per-edge log-probabilities (for evaluation and calibration tooling)."""
        return self.engine.score(compile_schema(schema), list(contexts), **kwargs)

    def prompt(
        self,
        schema: Any,
        context: str,
        *,
        choice_order: Mapping[str, Sequence[int]] | None = None,
    ) -> PromptPreview:
        """The exact prompt the model sees for `schema` and `context`, and its token count.

        Args:
            schema: As for `decide`.
            context: The text to decide on.
            choice_order: As for `decide`.

        Returns:
            A `PromptPreview`: the text (decoded from the very token ids the engine runs,
            up to the answer's opening `{`), its token counts per part, and the JSON text
            each field's pass continues with.

        Raises:
            ContextTooLongError: if the prompt does not fit the model's window.
        """
        compiled = compile_schema(schema)
        ctx = check_context(context, allow_empty=True)
        order: dict[str, Sequence[int]] | None = (
            {n: list(o) for n, o in choice_order.items()} if choice_order else None
        )
        plan = self.engine.plan(compiled, order)
        ctx_ids = self.engine.encode_ids(ctx)
        self.engine.check_length(plan, ctx_ids)
        ids = [*plan.head_ids, *ctx_ids, *plan.tail_ids]
        return PromptPreview(
            text=self.loaded.tokenizer.decode(ids),
            token_ids=tuple(ids),
            schema_tokens=len(plan.head_ids),
            context_tokens=len(ctx_ids),
            answer_start_tokens=len(plan.tail_ids),
            field_suffixes={f.name: field_suffix(f) for f in compiled.fields},
        )

    def _decision(
        self,
        schema: Schema,
        batch: ScoredBatch,
        i: int,
        temperature: float,
        scoring: Scoring,
        timing: BatchTiming,
        mode: PassMode | None,
        choice_order: dict[str, Sequence[int]] | None = None,
    ) -> Decision[Any]:
        plan = self.engine.plan(schema, choice_order)
        cal = self.calibration
        if cal is not None:
            cal.check_schema(schema)
        asked = batch.questions[i] if batch.questions else plan.questions
        tries = batch.tries[i] if batch.tries else plan.tries
        logz = [
            trie.score(edge, constrained=scoring == "constrained")
            for trie, edge in zip(tries, batch.edge_logp[i])
        ]
        fields, joint = answers(schema, asked, logz, temperature, cal)
        return Decision(
            value=schema.build({n: f.value for n, f in fields.items()}),
            fields=fields,
            prefill_ms=timing.prefill_ms / timing.size,
            suffix_eval_ms=timing.suffix_eval_ms / timing.size,
            elapsed_ms=timing.elapsed_ms / timing.size,
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
            batch=timing,
            joint=joint,
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
