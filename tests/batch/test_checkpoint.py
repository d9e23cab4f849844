"""The checkpoint: resuming, refusing another job's checkpoint or output, the lock."""

from __future__ import annotations

import json

import pytest

from pcd_tools.batch import (
    BatchLockedError,
    CheckpointMismatchError,
    OutputExistsError,
    run_batch,
    work_dir,
)
from pcd_tools.batch.checkpoint import Checkpoint
from pcd_tools.cli import main
from tests.schemas import Ticket

from .helpers import assert_matches, read, texts, write_jsonl

pytestmark = pytest.mark.engine


class Stop(Exception):
    """Raised from the progress callback: the job dies between two chunks."""


def _stop_after(chunks: int):
    seen: set[int] = set()

    def on_progress(p):
        if p.committed > p.skipped:
            seen.add(p.committed)
            if len(seen) == chunks:
                raise Stop

    return on_progress


@pytest.fixture
def src(tmp_path):
    return write_jsonl(
        tmp_path / "in.jsonl", [{"id": f"r{i}", "text": t} for i, t in enumerate(texts(23))]
    )


def test_an_interrupted_job_resumes_without_losing_or_repeating_a_row(tmp_path, tiny, src):
    out = tmp_path / "o.parquet"
    with pytest.raises(Stop):
        run_batch(tiny, Ticket, src, out, chunk_rows=5, on_progress=_stop_after(2))
    assert not out.exists()
    parts = sorted(p.name for p in work_dir(out).glob("part-*.parquet"))
    assert parts == ["part-000000000000-000000005.parquet", "part-000000000005-000000005.parquet"]
    (work_dir(out) / "part-000000000010-000000005.parquet.tmp").write_bytes(b"half a write")
    seen = []
    rep = run_batch(tiny, Ticket, src, out, chunk_rows=5, on_progress=seen.append)
    assert seen[0].skipped == 10 and seen[0].done == 10  # said at the start
    assert (rep.rows, rep.skipped, rep.decided, rep.chunks) == (23, 10, 13, 3)
    rows = read(out)
    assert [r["id"] for r in rows] == [f"r{i}" for i in range(23)]
    assert_matches(rows, tiny.decide_many(Ticket, texts(23)))
    assert not work_dir(out).exists()


def test_resuming_with_another_chunk_size_keeps_every_row(tmp_path, tiny, src):
    out = tmp_path / "o.jsonl"
    with pytest.raises(Stop):
        run_batch(tiny, Ticket, src, out, chunk_rows=5, on_progress=_stop_after(3))
    rep = run_batch(tiny, Ticket, src, out, chunk_rows=4)
    assert rep.skipped == 15 and rep.chunks == 2
    assert [r["id"] for r in read(out)] == [f"r{i}" for i in range(23)]


def test_another_jobs_checkpoint_is_refused(tmp_path, tiny, src):
    out = tmp_path / "o.parquet"
    with pytest.raises(Stop):
        run_batch(tiny, Ticket, src, out, chunk_rows=5, on_progress=_stop_after(1))
    with pytest.raises(CheckpointMismatchError, match=r"temperature: 1\.0 then, 0\.5 now") as e:
        run_batch(tiny, Ticket, src, out, chunk_rows=5, temperature=0.5)
    assert e.value.differences == [("temperature", 1.0, 0.5)]
    rep = run_batch(tiny, Ticket, src, out, temperature=0.5, overwrite=True)
    assert rep.skipped == 0 and rep.rows == 23


def test_a_changed_input_file_is_another_job(tmp_path, tiny, src):
    out = tmp_path / "o.parquet"
    with pytest.raises(Stop):
        run_batch(tiny, Ticket, src, out, chunk_rows=5, on_progress=_stop_after(1))
    with src.open("a") as fh:
        fh.write(json.dumps({"id": "new", "text": "one more"}) + "\n")
    with pytest.raises(CheckpointMismatchError, match="input"):
        run_batch(tiny, Ticket, src, out, chunk_rows=5)


def test_an_existing_output_is_kept_unless_overwrite(tmp_path, tiny, src):
    out = tmp_path / "o.csv"
    out.write_text("someone else's file\n")
    with pytest.raises(OutputExistsError, match="--overwrite"):
        run_batch(tiny, Ticket, src, out)
    assert out.read_text() == "someone else's file\n"
    assert not work_dir(out).exists()
    assert run_batch(tiny, Ticket, src, out, overwrite=True).rows == 23


def test_a_finished_parquet_job_run_again_is_complete(tmp_path, tiny, src):
    out = tmp_path / "o.parquet"
    run_batch(tiny, Ticket, src, out)
    before = out.read_bytes()
    rep = run_batch(tiny, Ticket, src, out)
    assert (rep.rows, rep.skipped, rep.decided, rep.errors) == (23, 23, 0, 0)
    assert out.read_bytes() == before
    with pytest.raises(OutputExistsError):  # the same output from another job
        run_batch(tiny, Ticket, src, out, temperature=2.0)


def test_killed_after_the_output_was_renamed_into_place(tmp_path, tiny, src, monkeypatch):
    from pcd_tools.batch import checkpoint

    out = tmp_path / "o.parquet"
    real_replace = checkpoint.os.replace

    def dies_on_the_folder(a, b):
        if str(a) == str(work_dir(out)):
            raise Stop  # the output is in place; the checkpoint folder is still there
        real_replace(a, b)

    monkeypatch.setattr(checkpoint.os, "replace", dies_on_the_folder)
    with pytest.raises(Stop):
        run_batch(tiny, Ticket, src, out, chunk_rows=5)
    monkeypatch.setattr(checkpoint.os, "replace", real_replace)
    assert out.exists() and (work_dir(out) / "job.json").exists()
    rep = run_batch(tiny, Ticket, src, out, chunk_rows=5)
    assert (rep.rows, rep.skipped, rep.decided) == (23, 23, 0)
    assert [r["id"] for r in read(out)] == [f"r{i}" for i in range(23)]
    assert not work_dir(out).exists()


def test_killed_while_removing_the_checkpoint(tmp_path, tiny, src, monkeypatch):
    from pcd_tools.batch import checkpoint

    out = tmp_path / "o.parquet"

    def dies(path, ignore_errors=False):
        raise Stop

    monkeypatch.setattr(checkpoint.shutil, "rmtree", dies)
    with pytest.raises(Stop):
        run_batch(tiny, Ticket, src, out, chunk_rows=5)
    monkeypatch.undo()
    assert len(list(tmp_path.glob("o.parquet.pcd-batch.done-*"))) == 1
    rep = run_batch(tiny, Ticket, src, out, chunk_rows=5)
    assert (rep.rows, rep.skipped, rep.decided) == (23, 23, 0)
    assert list(tmp_path.glob("o.parquet.pcd-batch*")) == []


def test_a_second_process_on_the_same_output_is_refused(tmp_path, tiny, src):
    out = tmp_path / "o.parquet"
    with Checkpoint(out, {"job": 1}, overwrite=False), pytest.raises(BatchLockedError):
        run_batch(tiny, Ticket, src, out)


def test_cli_says_how_many_rows_it_skipped(tmp_path, tiny, src, monkeypatch, capsys):
    monkeypatch.setattr("pcd_tools.cli.batch.load_decider", lambda args: tiny)
    out = tmp_path / "o.parquet"
    with pytest.raises(Stop):
        run_batch(tiny, Ticket, src, out, chunk_rows=5, on_progress=_stop_after(2))
    argv = ["batch", "--schema", "tests.schemas:Ticket", "--input", str(src), "--output", str(out)]
    assert main([*argv, "--chunk-rows", "5"]) == 0
    err = capsys.readouterr().err
    assert "resuming from the checkpoint: 10 of 23 rows already decided, skipped." in err
    assert "10 skipped (done before)" in err
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["skipped"] == 23
