"""`pcd_tools.ray.decide_dataset` and the file job on Ray, with 2 actors on the tiny model."""

from __future__ import annotations

import json

import pytest

from pcd_tools.batch import decision_column_names, run_batch
from pcd_tools.errors import InvalidArgumentError
from tests.batch.helpers import assert_matches, read, texts, write_csv, write_jsonl
from tests.schemas import Ticket

from .factories import NAMESPACE, REGISTRY, registering_slow_tiny

pytestmark = [pytest.mark.ray, pytest.mark.engine]

N = 200


def _dataset(ray, n: int = N):
    return ray.data.from_items([{"id": i, "body": b} for i, b in enumerate(texts(n))])


def test_200_rows_on_2_actors_equal_the_sequential_answers(ray_session, tiny_factory, tiny):
    from pcd_tools.ray import decide_dataset

    out = decide_dataset(
        _dataset(ray_session),
        Ticket,
        text_column="body",
        model=tiny_factory,
        actors=2,
        num_cpus_per_actor=1,
        batch_size=16,
    )
    rows = sorted(out.take_all(), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(N))
    assert list(rows[0]) == ["id", "body", *decision_column_names(Ticket)]  # inputs kept
    assert_matches(rows, tiny.decide_many(Ticket, texts(N)))


def test_a_killed_actor_is_restarted_and_no_row_is_lost_or_repeated(ray_session, tiny, monkeypatch):
    ray = ray_session
    from pcd_tools.ray import decide_dataset

    @ray.remote(num_cpus=0)
    class Registry:
        def __init__(self):
            self.seen: list[tuple[str, object]] = []

        def add(self, actor_id, handle):
            self.seen.append((actor_id, handle))

        def ids(self):
            return [a for a, _ in self.seen]

        def first(self):
            return self.seen[0]

    registry = Registry.options(name=REGISTRY, namespace=NAMESPACE, lifetime="detached").remote()
    try:
        assert ray.get(registry.ids.remote()) == []  # created before the actors look it up
        out = decide_dataset(
            _dataset(ray),
            Ticket,
            text_column="body",
            model=registering_slow_tiny,
            actors=2,
            num_cpus_per_actor=1,
            batch_size=8,
        )
        got: list[dict] = []
        killed = None
        for batch in out.iter_batches(batch_size=8, batch_format="pyarrow"):
            got += batch.to_pylist()
            if killed is None:
                killed, handle = ray.get(registry.first.remote())
                ray.kill(handle, no_restart=False)  # Ray restarts it and retries its batch
                killed_at = len(got)
        assert killed_at < N // 2, "the actor must die mid-job"
        ids = ray.get(registry.ids.remote())
    finally:
        ray.kill(registry)
    assert ids.count(killed) == 2  # the same actor, constructed again after the kill
    assert len(set(ids)) == 2
    got.sort(key=lambda r: r["id"])
    assert [r["id"] for r in got] == list(range(N))  # every row exactly once
    assert_matches(got, tiny.decide_many(Ticket, texts(N)))


def test_bad_rows_and_refused_arguments(ray_session, tiny_factory):
    from pcd_tools.ray import decide_dataset

    ds = ray_session.data.from_items([{"body": "fine"}, {"body": ""}, {"body": "x" * 9000}])
    rows = decide_dataset(
        ds, Ticket, text_column="body", model=tiny_factory, actors=1, num_cpus_per_actor=1
    ).take_all()
    assert rows[0]["error"] is None and rows[0]["priority"] is not None
    assert "empty or only whitespace" in rows[1]["error"]
    assert rows[2]["error"].startswith("ContextTooLongError")
    with pytest.raises(InvalidArgumentError, match="no text column 'text'"):
        decide_dataset(ds, Ticket, text_column="text", model=tiny_factory)
    clash = ray_session.data.from_items([{"body": "a", "priority": "x"}])
    with pytest.raises(InvalidArgumentError, match=r"already has column\(s\) \['priority'\]"):
        decide_dataset(clash, Ticket, text_column="body", model=tiny_factory)
    with pytest.raises(InvalidArgumentError, match="loaded Decider"):
        from tests.conftest import tiny_decider

        decide_dataset(ds, Ticket, text_column="body", model=tiny_decider(0))
    with pytest.raises(InvalidArgumentError, match="actors"):
        decide_dataset(ds, Ticket, text_column="body", model=tiny_factory, actors=(3, 1))


def test_the_file_job_on_ray_writes_what_the_local_job_writes(
    ray_session, tiny_factory, tiny, tmp_path
):
    from pcd_tools.ray import run_batch as ray_run_batch

    body = texts(40)
    body[7] = ""
    rows = [{"id": f"k{i}", "text": b} for i, b in enumerate(body)]
    rows[12] = "{broken"
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    kw = {"chunk_rows": 16, "batch_size": 8}

    class Stop(Exception):
        pass

    def stop_after_first_chunk(p):
        if p.committed > 0:
            raise Stop

    on_ray = tmp_path / "ray.parquet"
    opts = {"model": tiny_factory, "actors": 2, "num_cpus_per_actor": 1, **kw}
    with pytest.raises(Stop):
        ray_run_batch(Ticket, src, on_ray, on_progress=stop_after_first_chunk, **opts)
    rep = ray_run_batch(Ticket, src, on_ray, **opts)
    assert (rep.rows, rep.skipped, rep.errors) == (40, 16, 2)
    local = tmp_path / "local.parquet"
    run_batch(tiny, Ticket, src, local, **kw)
    a, b = read(on_ray), read(local)
    assert [r["id"] for r in a] == [r["id"] for r in b]
    for x, y in zip(a, b):
        assert x["error"] == y["error"]
        for name in decision_column_names(Ticket)[:-1]:
            if isinstance(x[name], float):
                assert x[name] == pytest.approx(y[name], abs=1e-4)  # float32, other batches
            else:
                assert x[name] == y[name]


def test_pcd_batch_ray_cli(ray_session, tiny_factory, tiny, tmp_path, monkeypatch, capsys):
    from pcd_tools.cli import main

    monkeypatch.setattr("pcd_tools.cli.batch.ray_model", lambda args: tiny_factory)
    body = texts(20)
    src = write_csv(tmp_path / "in.csv", [{"text": b} for b in body])
    out = tmp_path / "o.parquet"
    argv = ["batch", "--schema", "tests.schemas:Ticket", "--input", str(src), "--output", str(out)]
    flags = ["--ray", "--actors", "1", "--num-cpus-per-actor", "1", "--chunk-rows", "8", "--json"]
    assert main([*argv, *flags]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 20
    rows = read(out)
    assert [r["row"] for r in rows] == list(range(20))
    assert_matches(rows, tiny.decide_many(Ticket, body))


def test_size_threads_gives_the_engine_its_share_of_the_node(ray_session):
    @ray_session.remote(num_cpus=1)
    def sized():
        import os

        from pcd_tools.engine.host.threads import decode_threads, thread_budget
        from pcd_tools.engine.kernels import qgemm
        from pcd_tools.engine.passes.workers import ThreadFit
        from pcd_tools.ray import size_threads

        n = size_threads(1.5)
        counts = thread_budget(), ThreadFit().cpus, decode_threads(), qgemm._threads(None)
        return n, counts, os.environ["OPENBLAS_NUM_THREADS"]

    assert ray_session.get(sized.remote()) == (1, (1, 1, 1, 1), "1")
