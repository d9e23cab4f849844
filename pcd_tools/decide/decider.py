"""`Decider`: a loaded model plus the PCD engine, the object users call.

It also hosts the process-wide default decider used by `@decision` models' `.decide()`
(the seed-compatible `run_parallel_generation` is in `pcd_tools.decide.seed`).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..answers.result import Decision
from ..errors import InvalidArgumentError
from ..prompt import PromptPreview
from ..schema import compile_schema
from .checks import check_batch_size, check_contexts
from .contextual import ContentFreeScores, check_method, method_with
from .generated import decide_hybrid
from .loo import LooChoices, check_auto, choose
from .methods import Method
from .options import DecideOptions, check_options
from .orders import average, orderings
from .scored import decide_in_order, prompt_preview
from .state import DecideState

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..engine.load.sources import LoadedModel
    from ..engine.scorer import Engine, ScoredBatch
    from .options import DecideKwargs

__all__ = ["Decider", "default_decider"]

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
        from ..engine.scorer import Engine

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
        self.label_free = "none"  # the label-free calibration of calls that name none
        self.content_free = ContentFreeScores(
            self.engine, max_plans=self.engine.prefix_cache.max_entries
        )
        # `calibration="auto"` choices, per schema (`pcd_tools.decide.loo`)
        self.loo_choices = LooChoices()

    @classmethod
    def load(
        cls,
        source: str | os.PathLike[str] | None = None,
        *,
        dtype: str = "auto",
        compute: str = "auto",
        calibration: Any = None,
        **engine: Any,
    ) -> Decider:
        """Loads a model and returns a ready `Decider`.

        Args:
            source: `None` for the embedded SmolLM2-135M-Instruct, a `.gguf` file (llama,
                mistral, qwen2, qwen3, gemma3 or phi3; any quant type), an MLX model directory or a Hugging Face repo id.
            dtype: `"auto"` (or `PCD_DTYPE`): on CPU a GGUF's matrices stay in the file's
                encoding, memory-mapped, unless a dense float32 load (the copies and
                the scratch of the largest matrix) takes at most 1 GiB (then dense
                float32, faster on small models; `engine.load.gguf.dense_fits`); other
                sources are dense
                float32; on a GPU stored weights are kept. Also `"quantized"`,
                `"float32"`, `"float16"`, `"bfloat16"`, `"keep"` (see
                `pcd_tools.engine.load.sources.load_model`).
            compute: `"auto"` (or `PCD_COMPUTE`: int8 for a file mostly in K-quants, such
                as a Q4_K_M, on a CPU with an int8 SIMD kernel, and on AVX2 / AVX-VNNI for
                any file of at least 256 MiB of matrices; else float32;
                `pcd_tools.engine.load.qlinear.auto_compute`), `"float32"`, `"int8"` or
                `"bf16"`: the arithmetic of the passes' matrix products over a GGUF file's
                blocks on CPU (see `pcd_tools.engine.load.sources.load_model`).
                `Decision.compute` reports it.
            calibration: `"contextual"` (label-free contextual calibration on every
                decision, `pcd_tools.decide.contextual`), a fitted `Calibration` or the path of
                its JSON file; see `with_calibration`.
            **engine: Engine options.

        Raises:
            ModelLoadError: naming the source and the fix.
        """
        from ..engine.host.blas import ensure_fast_path
        from ..engine.load.sources import load_model

        ensure_fast_path()
        decider = cls(load_model(source, dtype=dtype, compute=compute), **engine)
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

    @property
    def state(self) -> DecideState:
        """What the orchestrators read (`pcd_tools.decide.state`): the engine, the model,
        the calibrations and the caches, as they are now."""
        return DecideState(
            engine=self.engine,
            loaded=self.loaded,
            calibration=self.calibration,
            label_free=self.label_free,
            content_free=self.content_free,
            loo_choices=self.loo_choices,
        )

    def __repr__(self) -> str:
        return (
            f"Decider(model={self.model_id!r}, device={self.device!r}, "
            f"dtype={self.loaded.dtype!r}, compute={self.loaded.compute!r})"
        )

    # --- calibration ----------------------------------------------------------------------

    def with_calibration(self, calibration: Any) -> Decider:
        """A decider sharing this one's model and caches, with another calibration.

        Args:
            calibration: `"contextual"` (label-free contextual calibration by default on
                every decision) or `"none"` (no label-free calibration by default); or a
                fitted `pcd_tools.answers.calibration.Calibration` or the path of its JSON file
                (a file named `contextual` or `none` goes as a `Path`), applied after the
                label-free correction. A calibration fitted on top of contextual
                calibration turns it on.

        Raises:
            CalibrationError: if the file cannot be read.
            CalibrationMismatchError: if the calibration was fitted for another model, or
                on top of another label-free correction than this decider's.
        """
        from ..answers.calibration import Calibration

        clone = object.__new__(Decider)
        clone.__dict__.update(self.__dict__)
        if isinstance(calibration, str) and calibration in ("contextual", "none"):
            if self.calibration is not None:
                check_method(calibration, self.calibration)
            clone.label_free = calibration
            return clone
        cal = (
            Calibration.load(calibration)
            if isinstance(calibration, (str, os.PathLike))
            else calibration
        )
        if not isinstance(cal, Calibration):
            raise InvalidArgumentError(
                f"calibration must be 'contextual', 'none', a Calibration or a path; got "
                f"{type(calibration).__name__}."
            )
        cal.check_model(self.model_id)
        cal.check_compute(self.loaded.compute)
        clone.label_free = method_with(self.label_free, cal)
        clone.calibration = cal
        return clone

    def with_content_free(self, inputs: Sequence[str], *, mean: str = "geometric") -> Decider:
        """A decider sharing this one's model whose contextual calibration measures the
        answer prior on `inputs` instead of `pcd_tools.decide.contextual.CONTENT_FREE`.

        Args:
            inputs: Texts that say nothing about the answer (e.g. `["N/A"]`, or a few
                in-domain texts with the content removed).
            mean: How their distributions are averaged: `"geometric"` (mean
                log-probability; cancels an input-independent logit bias exactly) or
                `"arithmetic"` (mean probability, as in Zhao et al. 2021).

        Raises:
            InvalidArgumentError: unless `inputs` is a non-empty list of distinct str and
                `mean` one of those two.
        """
        clone = object.__new__(Decider)
        clone.__dict__.update(self.__dict__)
        clone.content_free = ContentFreeScores(
            self.engine, inputs, max_plans=self.content_free.max_plans, mean=mean
        )
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
        from ..agents.tools import DecisionTool

        return DecisionTool.from_decider(self, schema, name=name, description=description, **kwargs)

    def with_structured_output(self, schema: Any, include_raw: bool = False, **kwargs: Any) -> Any:
        """A Runnable that maps a string, messages or a `PromptValue` to a validated `schema`.

        Drop-in for a chat model's `with_structured_output(schema)` in LangChain recipes.

        Args:
            schema: The decision schema (Pydantic model).
            include_raw: Return `{"raw": AIMessage, "parsed": ..., "parsing_error": None}`.
            **kwargs: Options such as `temperature`.
        """
        from ..agents.structured import structured_runnable

        return structured_runnable(self, schema, include_raw=include_raw, **kwargs)

    # --- deciding -------------------------------------------------------------------------

    def decide(
        self,
        schema: Any,
        context: str,
        *,
        options: DecideOptions | None = None,
        **kwargs: Unpack[DecideKwargs],
    ) -> Decision[Any]:
        """Scores every field of `schema` for `context` (and generates its generated ones).

        Args:
            schema: A Pydantic model class, `StructuredSchema`, dict spec or `Schema`.
            context: The text to decide on (any Unicode; never truncated).
            options: A `DecideOptions` to reuse across calls (None: the defaults).
            **kwargs: The options as keywords, overriding `options`' fields:
                `temperature`, `scoring`, `mode`, `choice_order`, `orders`,
                `allow_empty`, `calibration`, `pruning` and `max_new_tokens` (each
                documented on `DecideOptions`), and `examples`: few-shot examples for this
                call, replacing the schema's own (`[]` for none; None keeps them):
                `(text, answer)` or `{"input": text, "output": answer}`, the answer a dict
                of the fields or a model instance (see `pcd_tools.schema.examples`). They
                are earlier turns in the cached schema part of the prompt.

        Returns:
            A `Decision` whose `.value` is an instance of the schema's model.

        Raises:
            SchemaError: if the schema is invalid.
            InvalidExampleError: if an example does not fit the schema.
            InvalidContextError: if `context` is not a str, or is empty and `allow_empty`
                is not set.
            InvalidArgumentError: for an unknown option; a bad temperature, scoring, mode,
                calibration, `orders` or `pruning`; `scoring="pmi"` with contextual
                calibration; `calibration="auto"` with scoring `"constrained"` or
                `"pmi"`, `pruning="on"` or generated fields; or `pruning="on"` with
                `orders > 1`, `scoring="pmi"`, contextual calibration, generated fields or
                a pass mode other than packed.
            CalibrationMismatchError: if the decider's fitted calibration was fitted for
                another schema or on top of another label-free correction.
            ContextTooLongError: if the prompt does not fit the model's window.
            GenerationLimitError: if a generated field reaches its token limit (it carries
                the text generated so far; nothing is truncated).
        """
        return self.decide_many(schema, [context], options=options, batch_size=1, **kwargs)[0]

    def decide_many(
        self,
        schema: Any,
        contexts: Sequence[str],
        *,
        options: DecideOptions | None = None,
        batch_size: int = 32,
        **kwargs: Unpack[DecideKwargs],
    ) -> list[Decision[Any]]:
        """Scores `schema` for several contexts, batching them for throughput.

        Each decision's `elapsed_ms`, `prefill_ms`, `suffix_eval_ms` (and `generate_ms`)
        are its equal share of the engine call that scored it, so they add up to the wall
        time; the call's totals and size are in `Decision.batch`. Every argument but these
        two is as for `decide` (and raises as there):

        Args:
            contexts: The texts, in order; results come back in the same order.
            batch_size: Contexts handed to the engine at once; it splits them into row
                groups of similar length (`batch_tokens`) that run concurrently. Generated
                fields decode context by context (the prefill and scored passes batch).
        """
        compiled, opts = check_options(schema, options, **kwargs)
        ctxs = check_contexts(contexts, opts.allow_empty)
        size = check_batch_size(batch_size)
        if opts.calibration == "auto":  # the recipe chosen by leave-one-out, cached
            opts, choice = choose(self, compiled, opts)
            got = self.decide_many(compiled, ctxs, options=opts, batch_size=size)
            return [
                dataclasses.replace(
                    d, calibration_method=f"auto:{choice.method}", calibration_choice=choice
                )
                for d in got
            ]
        state = self.state
        if compiled.hybrid:  # generated fields: segments in declaration order
            return decide_hybrid(state, compiled, ctxs, size, opts)
        method = Method.resolve(opts.scoring, state.label_free, opts.calibration, state.calibration)
        if opts.orders > 1:  # averaged distributions: every field scored whole
            runs = [
                decide_in_order(state, compiled, ctxs, size, opts, o, method, "off")
                for o in orderings(compiled, opts.orders)
            ]
            return average(compiled, runs)
        return decide_in_order(state, compiled, ctxs, size, opts, opts.order, method, opts.pruning)

    async def adecide(
        self,
        schema: Any,
        context: str,
        *,
        options: DecideOptions | None = None,
        **kwargs: Unpack[DecideKwargs],
    ) -> Decision[Any]:
        """`decide` for async code: awaits the engine worker, never blocks the event loop.

        Concurrent awaiters with the same schema (examples included) and options are
        micro-batched into one `decide_many` call on the engine's worker thread (see
        `pcd_tools.decide.aio`). Arguments are checked before anything is queued, so a bad one
        raises here at once.

        Takes the same arguments as `decide`.
        """
        return (await self.adecide_many(schema, [context], options=options, **kwargs))[0]

    async def adecide_many(
        self,
        schema: Any,
        contexts: Sequence[str],
        *,
        options: DecideOptions | None = None,
        progress: Callable[[int, int], Awaitable[None] | None] | None = None,
        **kwargs: Unpack[DecideKwargs],
    ) -> list[Decision[Any]]:
        """`decide_many` for async code; the contexts join the engine worker's queue.

        Takes the same arguments as `decide_many`, less `batch_size` (the queue batches);
        results come back in the order of `contexts`. `progress(done, total)`, if given,
        is called (or awaited) after each decision completes. Cancelling the call, or a
        decision failing, cancels the decisions not yet started.
        """
        from .aio import gather, queue_for

        compiled, opts = check_options(schema, options, **kwargs)
        if opts.calibration == "auto":
            check_auto(compiled)
        else:  # refuses PMI with contextual calibration before anything is queued
            Method.resolve(opts.scoring, self.label_free, opts.calibration, self.calibration)
        ctxs = check_contexts(contexts, opts.allow_empty)
        return await gather(queue_for(self).submit(compiled, ctxs, opts), progress)

    def scores(self, schema: Any, contexts: Sequence[str], **kwargs: Any) -> ScoredBatch:
        """Raw per-edge log-probabilities (for evaluation and calibration tooling)."""
        return self.engine.score(compile_schema(schema), list(contexts), **kwargs)

    def prompt(
        self,
        schema: Any,
        context: str,
        *,
        choice_order: Mapping[str, Sequence[int]] | None = None,
        examples: Sequence[Any] | None = None,
    ) -> PromptPreview:
        """The exact prompt the model sees for `schema` and `context`, and its token count.

        Args:
            schema: As for `decide`.
            context: The text to decide on.
            choice_order: As for `decide`.
            examples: As for `decide`; they show as earlier user/assistant turns.

        Returns:
            A `PromptPreview`: the text (decoded from the very token ids the engine runs,
            up to the answer's opening `{`), its token counts per part (the examples are
            in the schema part), and the JSON text each field's pass continues with.

        Raises:
            InvalidExampleError: if an example does not fit the schema.
            ContextTooLongError: if the prompt does not fit the model's window.
        """
        return prompt_preview(self.state, schema, context, choice_order, examples)


_DEFAULT: Decider | None = None
_DEFAULT_LOCK = threading.Lock()


def default_decider() -> Decider:
    """The process-wide `Decider` on the embedded model, loaded on first use."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = Decider.load()
        return _DEFAULT
