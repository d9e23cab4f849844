"""`pcd batch`: decide every row of a file, resumably, here or on a Ray cluster.

`pcd batch --schema myapp.schemas:Ticket --input tickets.csv --text-column body
--output decided.parquet` writes one row per input row: the id, `<field>` and
`<field>__p` per field, `confidence` and `error`. Killed and run again with the same
command, it continues after the last checkpointed chunk. `--ray [ADDRESS]` runs the same
job on a Ray cluster (`pcd_tools.ray.run_batch`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ._common import UsageError, check_at_least, check_file, check_temperature, load_decider

HELP = "decide every row of a CSV/JSONL/Parquet file, resumably (--ray: on a Ray cluster)"

_EXTRA = {"pyarrow": "batch", "ray": "ray"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `pcd batch` options (the dispatcher adds --model, --json and --calibration).

    Args:
        parser: The sub-command's parser.
    """
    parser.add_argument(
        "--schema", required=True, help="'module:Class' (a Pydantic model) or a JSON schema file"
    )
    parser.add_argument("--input", required=True, help="a .csv, .tsv, .jsonl or .parquet file")
    parser.add_argument("--output", required=True, help="a .parquet, .csv or .jsonl file")
    parser.add_argument(
        "--text-column", default="text", help="the column to decide on (default %(default)s)"
    )
    parser.add_argument(
        "--id-column",
        default=None,
        help="the column that identifies a row (default: `id` if present, else the row number)",
    )
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--scoring", choices=["auto", "full", "constrained", "pmi"], default="auto")
    parser.add_argument(
        "--batch-size", type=int, default=32, help="contexts per model batch (default %(default)s)"
    )
    parser.add_argument(
        "--chunk-rows",
        type=int,
        default=256,
        help="rows per checkpointed chunk: the most a kill can cost (default %(default)s)",
    )
    parser.add_argument(
        "--allow-empty", action="store_true", help="decide on empty texts instead of failing them"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="discard an existing output and its checkpoint, and start afresh",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    ray = parser.add_argument_group("ray (the `ray` extra)")
    ray.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        default=None,
        metavar="ADDRESS",
        help="run on Ray: `auto` (the running cluster, else a local one; the default), "
        "`local` or a cluster address (ray://host:10001)",
    )
    ray.add_argument(
        "--actors",
        default=None,
        metavar="N|MIN:MAX",
        help="model actors: a fixed count or an autoscaling range (default: 1 to the "
        "cluster's CPUs / --num-cpus-per-actor)",
    )
    ray.add_argument(
        "--num-cpus-per-actor",
        type=float,
        default=2.0,
        help="CPUs per model actor; its BLAS and stream threads follow (default %(default)s)",
    )


def parse_actors(value: str | None) -> int | tuple[int, int] | None:
    """`--actors`: `N` or `MIN:MAX`.

    Raises:
        UsageError: for anything else, or counts below 1.
    """
    if value is None:
        return None
    lo, sep, hi = value.partition(":")
    try:
        sizes = (int(lo), int(hi)) if sep else (int(lo), int(lo))
    except ValueError:
        raise UsageError(f"--actors takes N or MIN:MAX (e.g. 4 or 1:8); got {value!r}.") from None
    if sizes[0] < 1 or sizes[1] < sizes[0]:
        raise UsageError(f"--actors needs 1 <= MIN <= MAX; got {value!r}.")
    return sizes[0] if not sep else sizes


def check_args(args: argparse.Namespace) -> Any:
    """Checks the options and loads the schema, before any model loads.

    Returns:
        The schema object named by `--schema`.

    Raises:
        UsageError: naming the first bad option.
    """
    from ..batch.io import INPUT_FORMATS, OUTPUT_FORMATS

    check_temperature(args.temperature)
    check_at_least(args, 1, "batch_size", "chunk_rows")
    check_at_least(args, 0.01, "num_cpus_per_actor")
    args.actors_spec = parse_actors(args.actors)
    check_file(args.input, "--input")
    for flag, path, table in (
        ("--input", args.input, INPUT_FORMATS),
        ("--output", args.output, OUTPUT_FORMATS),
    ):
        ext = os.path.splitext(path)[1].lower()
        if ext not in table:
            raise UsageError(
                f"{flag} {path!r}: unknown file type {ext!r}; accepted: {sorted(table)}."
            )
    if os.path.abspath(args.input) == os.path.abspath(args.output):
        raise UsageError("--output is the --input file; choose another path.")
    if os.getcwd() not in sys.path:  # `module:Class` from the current folder, as uvicorn does
        sys.path.insert(0, os.getcwd())
    from ..eval.datasets.base import DatasetError
    from ..eval.datasets.files import load_schema

    try:
        schema = load_schema(args.schema)
        from ..schema import compile_schema

        compile_schema(schema)
    except DatasetError as e:
        raise UsageError(f"--schema: {e}") from e
    return schema


def ray_model(args: argparse.Namespace) -> Any:
    """The model the Ray actors load: `--model` (default: the embedded model)."""
    return args.model


def run(args: argparse.Namespace) -> int:
    """Checks the options, runs the job and prints its summary.

    Args:
        args: The parsed arguments.

    Returns:
        The exit code: 0 when the output is written (rows that failed are in its
        `error` column), 2 for a bad option or a missing extra.
    """
    schema = check_args(args)
    try:
        import pyarrow  # noqa: F401

        if args.ray is not None:
            import ray  # noqa: F401
    except ImportError as e:
        root = (e.name or "").split(".")[0]
        extra = _EXTRA.get(root, "batch")
        print(
            f"error: `pcd batch{' --ray' if args.ray else ''}` needs {root!r}; install it with "
            f"`pip install 'pcd-tools[{extra}]'`.",
            file=sys.stderr,
        )
        return 2
    from rich.console import Console

    console = Console(stderr=True)
    bar = None if args.quiet else _Bar(console, args.output)
    kw: dict[str, Any] = {
        "text_column": args.text_column,
        "id_column": args.id_column,
        "temperature": args.temperature,
        "scoring": args.scoring,
        "batch_size": args.batch_size,
        "chunk_rows": args.chunk_rows,
        "allow_empty": args.allow_empty,
        "overwrite": args.overwrite,
        "on_progress": bar.update if bar is not None else None,
    }
    try:
        if args.ray is not None:
            from ..ray import run_batch as ray_run_batch

            report = ray_run_batch(
                schema,
                args.input,
                args.output,
                model=ray_model(args),
                calibration=args.calibration or None,
                address=args.ray,
                actors=args.actors_spec,
                num_cpus_per_actor=args.num_cpus_per_actor,
                **kw,
            )
        else:
            from ..batch import run_batch

            report = run_batch(lambda: load_decider(args), schema, args.input, args.output, **kw)
    except KeyboardInterrupt:
        if bar is not None:
            bar.stop()
        print(
            "pcd batch: interrupted. The finished chunks are checkpointed beside the output; "
            "run the same command to resume.",
            file=sys.stderr,
        )
        return 130
    finally:
        if bar is not None:
            bar.stop()
    if args.json:
        print(json.dumps(report.to_dict()))
    elif not args.quiet:
        skipped = f", {report.skipped} skipped (done before)" if report.skipped else ""
        console.print(
            f"pcd batch: {report.rows} rows in {report.output}: {report.decided} decided now "
            f"({report.rows_per_s:.2f} rows/s){skipped}; {report.errors} with an error.",
            soft_wrap=True,
        )
    return 0


class _Bar:
    """Says how many rows a resumed job skips, then shows a bar with rows/s and ETA."""

    def __init__(self, console: Any, output: str):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.console = console
        self.output = output
        self.progress = Progress(
            TextColumn("[bold]pcd batch"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} rows/s  {task.fields[errors]} errors  "),
            TextColumn("elapsed {task.fields[elapsed]}  ETA {task.fields[eta]}"),
            console=console,
        )
        self.task: Any = None

    def update(self, p: Any) -> None:
        """Takes one `BatchProgress`."""
        rate = p.rows_per_s
        left = p.total - p.done
        fields = {
            "rate": f"{rate:.2f}",
            "errors": p.errors,
            "elapsed": _clock(p.seconds),
            "eta": _clock(left / rate) if rate > 0 else ("0:00:00" if not left else "-:--:--"),
        }
        if self.task is None:  # the first call: the job starts
            if p.skipped >= p.total and p.total:
                self.console.print(
                    f"pcd batch: {self.output} is already complete ({p.total} rows); nothing to do.",
                    soft_wrap=True,
                )
            elif p.skipped:
                self.console.print(
                    f"pcd batch: resuming from the checkpoint: {p.skipped} of {p.total} rows "
                    "already decided, skipped.",
                    soft_wrap=True,
                )
            self.progress.start()
            self.task = self.progress.add_task("rows", total=p.total, completed=p.done, **fields)
            return
        self.progress.update(self.task, completed=p.done, **fields)

    def stop(self) -> None:
        """Leaves the bar as it last was."""
        if self.task is not None:
            self.progress.stop()


def _clock(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
