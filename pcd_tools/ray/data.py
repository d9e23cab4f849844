"""Ray Data: `decide_dataset` and its model actor, `DecideBatch`.

`decide_dataset` maps a stateful actor class, `DecideBatch`, over the dataset's batches
with an actor pool (`compute=ray.data.ActorPoolStrategy(...)`). Each actor sizes its
threads to its CPUs and loads the model once, in its own process: the model is never
pickled, and a batch costs only its decisions. Ray restarts an actor that dies and
retries its batch, so no row is lost or repeated.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Union

from pcd_tools.errors import InvalidArgumentError
from pcd_tools.schema import Schema, compile_schema

if TYPE_CHECKING:
    import pyarrow as pa
    import ray.data

    from pcd_tools.decide.decider import Decider

__all__ = [
    "DecideBatch",
    "ModelSource",
    "check_model_source",
    "decide_dataset",
    "load_calibration",
    "load_decider",
    "model_name",
    "ship_by_value",
    "size_threads",
]

ModelSource = Union[str, "os.PathLike[str]", Callable[[], "Decider"], None]
"""What an actor loads: `None` (the embedded model), a GGUF file, an MLX directory, a
Hugging Face id, or a callable that returns a `Decider` (called inside the actor)."""

# Rows the file job (`pcd_tools.ray.job`) could not read carry their reason in this column.
PROBLEM_COLUMN = "__pcd_problem"


def size_threads(num_cpus: float) -> int:
    """Sizes this process's threads to its share of the machine: the engine's thread
    budget (`engine.host.threads.set_thread_budget`, which its passes, CPU streams, native
    decode pool and kernels read; call it before loading a decider), the BLAS's threads,
    and `OMP_NUM_THREADS` / `OPENBLAS_NUM_THREADS` / `MKL_NUM_THREADS`.

    The engine otherwise runs on every CPU this process may use, which oversubscribes a
    node shared by several actors.

    Args:
        num_cpus: The CPUs reserved for this process (rounded down, at least 1).

    Returns:
        The thread count set.
    """
    n = max(1, int(num_cpus))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    from pcd_tools.engine.host.blas import set_blas_threads
    from pcd_tools.engine.host.threads import set_thread_budget

    set_thread_budget(n)
    set_blas_threads(n)
    return n


def check_model_source(model: Any) -> None:
    """Refuses a loaded `Decider`: it would be pickled to every actor.

    Raises:
        InvalidArgumentError: for a `Decider` or anything that is not a source.
    """
    if hasattr(model, "decide_many"):
        raise InvalidArgumentError(
            "model must be a model source (None for the embedded model, a path or a Hugging "
            "Face id) or a callable that returns a Decider; got a loaded Decider, which would "
            "be pickled to every actor. Pass its source instead."
        )
    if model is not None and not isinstance(model, (str, os.PathLike)) and not callable(model):
        raise InvalidArgumentError(
            f"model must be None, a path, a Hugging Face id or a callable returning a "
            f"Decider; got {type(model).__name__}."
        )


def model_name(model: ModelSource) -> str:
    """A stable name for a model source (for a job's checkpoint); `None` and `"embedded"`
    name the same model (`pcd_tools.engine.load.sources.model_source`)."""
    if model is None or isinstance(model, (str, os.PathLike)):
        from pcd_tools.engine.load.sources import EMBEDDED, model_source

        return model_source(model) or EMBEDDED
    target = getattr(model, "func", model)  # functools.partial
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"


def load_calibration(calibration: Any) -> Any:
    """A `Calibration` from a path (read here, so that workers need not see the file)."""
    if calibration is None or not isinstance(calibration, (str, os.PathLike)):
        return calibration
    from pcd_tools.answers.calibration import Calibration

    return Calibration.load(calibration)


def load_decider(model: ModelSource, calibration: Any = None, threads: int = 2) -> Decider:
    """Loads the decider of one actor or replica.

    Args:
        model: The model source, or a callable returning a `Decider`.
        calibration: A `Calibration`, its path, or None.
        threads: The process's threads; the engine gets `min(2, threads)` CPU streams.
    """
    from pcd_tools.decide.decider import Decider

    cal = load_calibration(calibration)
    if callable(model) and not isinstance(model, (str, os.PathLike)):
        decider = model()
        return decider.with_calibration(cal) if cal is not None else decider
    return Decider.load(model, calibration=cal, streams=min(2, threads))


class DecideBatch:
    """The Ray Data actor: loads the model once, then decides one batch per call.

    Args:
        schema: The schema (any accepted form; it travels pickled, the model does not).
        text_column: The column with the text.
        model: What to load (see `ModelSource`).
        calibration: A `Calibration`, its path, or None.
        num_cpus: The actor's CPUs; its BLAS and stream threads follow.
        batch_size: Contexts per engine batch.
        temperature: Softmax temperature.
        scoring: `"auto"` (the default: a large field by certified pruned search, the
            others `"full"`), `"full"` or `"constrained"`.
        allow_empty: Decide on empty texts instead of failing them.
    """

    def __init__(
        self,
        schema: Any,
        *,
        text_column: str,
        model: ModelSource = None,
        calibration: Any = None,
        num_cpus: float = 1.0,
        batch_size: int = 32,
        temperature: float = 1.0,
        scoring: str = "auto",
        allow_empty: bool = False,
    ):
        self.decider = load_decider(model, calibration, size_threads(num_cpus))
        self.schema: Schema = compile_schema(schema)
        if self.decider.calibration is not None:
            self.decider.calibration.check_schema(self.schema)
        self.text_column = text_column
        self.options: dict[str, Any] = {
            "batch_size": batch_size,
            "temperature": temperature,
            "scoring": scoring,
            "allow_empty": allow_empty,
        }

    def __call__(self, batch: pa.Table) -> pa.Table:
        """The batch with the decision columns appended."""
        from pcd_tools.batch.columns import (
            BadRow,
            check_column_clash,
            decide_texts,
            decision_table,
        )

        if self.text_column not in batch.column_names:
            raise InvalidArgumentError(
                f"the dataset has no text column {self.text_column!r}; its columns: "
                f"{batch.column_names}."
            )
        texts: list[Any] = batch.column(self.text_column).to_pylist()
        if PROBLEM_COLUMN in batch.column_names:  # rows the file job could not read
            problems = batch.column(PROBLEM_COLUMN).to_pylist()
            texts = [BadRow(p) if p is not None else t for t, p in zip(texts, problems)]
            batch = batch.drop_columns([PROBLEM_COLUMN])
        check_column_clash(self.schema, batch.column_names, where="the dataset")
        decided = decision_table(
            self.schema, decide_texts(self.decider, self.schema, texts, **self.options)
        )
        for i, name in enumerate(decided.column_names):
            batch = batch.append_column(decided.field(i), decided.column(name))
        return batch


def ship_by_value(schema: Any) -> None:
    """Pickles the schema's own module by value, so that workers need not import it.

    A schema defined in the user's folder (`module:Class` for `pcd batch`, a notebook's
    module, a package loaded from a path) is not installed on the cluster; modules in
    site-packages or the standard library, pcd-tools' own and `__main__` (which
    cloudpickle already sends by value) are left alone.
    """
    name = getattr(compile_schema(schema).model, "__module__", "")
    mod = sys.modules.get(name)
    path = getattr(mod, "__file__", None)
    if mod is None or not path or name == "__main__" or name.split(".")[0] == "pcd_tools":
        return
    roots = {os.path.abspath(p) for k, p in sysconfig.get_paths().items() if "lib" in k}
    if any(os.path.abspath(path).startswith(r + os.sep) for r in roots):
        return
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(mod)


def _pool(actors: int | tuple[int, int] | None, num_cpus: float) -> Any:
    import ray
    import ray.data

    if actors is None:
        if ray.is_initialized():
            cpus = ray.cluster_resources().get("CPU", 1)
        else:
            from pcd_tools.engine.host.cpus import usable_cpus

            cpus = usable_cpus()
        return ray.data.ActorPoolStrategy(min_size=1, max_size=max(1, int((cpus or 1) // num_cpus)))
    lo, hi = (actors, actors) if isinstance(actors, int) else actors
    for v in (lo, hi):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidArgumentError(f"actors must be an int >= 1 or (min, max); got {actors!r}.")
    if hi < lo:
        raise InvalidArgumentError(f"actors (min, max) needs min <= max; got {actors!r}.")
    if lo == hi:
        return ray.data.ActorPoolStrategy(size=lo)
    return ray.data.ActorPoolStrategy(min_size=lo, max_size=hi)


def decide_dataset(
    ds: ray.data.Dataset,
    schema: Any,
    *,
    text_column: str,
    model: ModelSource = None,
    calibration: Any = None,
    actors: int | tuple[int, int] | None = None,
    batch_size: int = 32,
    num_cpus_per_actor: float = 2.0,
    temperature: float = 1.0,
    scoring: str = "auto",
    allow_empty: bool = False,
) -> ray.data.Dataset:
    """Decides every row of a Ray dataset on a pool of model actors.

    The result keeps the input columns and adds the decision columns of `pcd batch`:
    `<field>`, `<field>__p`, `confidence` and `error` (see `pcd_tools.batch.columns`). A
    row that cannot be decided gets its reason in `error`; the job goes on. Like every
    Ray dataset it is lazy: it runs when consumed (`write_parquet`, `iter_batches`, ...).

    Args:
        ds: The dataset.
        schema: Any accepted schema form. When its module is not installed (a file in
            your folder, a notebook), the module is sent to the workers by value; a
            schema that imports other modules of yours needs them on the workers
            (`runtime_env={"py_modules": [...]}` in `ray.init`).
        text_column: The column with the text.
        model: What each actor loads: None (the embedded model), a path, a Hugging Face
            id, or a callable returning a `Decider` (called inside the actor). Not a
            loaded `Decider`.
        calibration: A `Calibration` or its path (read here), applied in every actor.
        actors: Pool size: an int, a `(min, max)` autoscaling range, or None for 1 up to
            the cluster's CPUs divided by `num_cpus_per_actor`.
        batch_size: Rows per actor call (and per engine batch).
        num_cpus_per_actor: CPUs each actor reserves; its BLAS and stream threads follow.
        temperature: Softmax temperature (> 0).
        scoring: `"auto"` (the default: a large field by certified pruned search, the
            others `"full"`), `"full"` or `"constrained"`.
        allow_empty: Decide on empty or whitespace-only texts instead of failing them.

    Returns:
        The dataset with the decision columns.

    Raises:
        InvalidArgumentError: for a bad option, a loaded `Decider` as `model`, a missing
            text column, or a decision column the dataset already has (when its schema
            is known without running it).
        ImportError: when the `ray` extra is not installed.
    """
    from pcd_tools.batch.columns import check_column_clash
    from pcd_tools.batch.job import check_job_options

    check_job_options(temperature, scoring, batch_size, 1)
    check_model_source(model)
    if not (isinstance(num_cpus_per_actor, (int, float)) and num_cpus_per_actor > 0):
        raise InvalidArgumentError(f"num_cpus_per_actor must be > 0; got {num_cpus_per_actor!r}.")
    compiled = compile_schema(schema)
    cal = load_calibration(calibration)
    if cal is not None:
        cal.check_schema(compiled)
    known = ds.schema(fetch_if_missing=False)
    if known is not None:
        if text_column not in known.names:
            raise InvalidArgumentError(
                f"the dataset has no text column {text_column!r}; its columns: {known.names}."
            )
        check_column_clash(compiled, known.names, where="the dataset")
    ship_by_value(compiled)
    return ds.map_batches(
        DecideBatch,
        batch_size=batch_size,
        batch_format="pyarrow",
        compute=_pool(actors, num_cpus_per_actor),
        num_cpus=num_cpus_per_actor,
        udf_modifying_row_count=False,
        fn_constructor_kwargs={
            "schema": compiled,
            "text_column": text_column,
            "model": model,
            "calibration": cal,
            "num_cpus": num_cpus_per_actor,
            "batch_size": batch_size,
            "temperature": temperature,
            "scoring": scoring,
            "allow_empty": allow_empty,
        },
    )
