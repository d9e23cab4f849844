"""`pcd batch` on this machine, on the tiny random-weight model: output, bad rows, options."""

from __future__ import annotations

import json

import pytest

from pcd_tools.batch import decision_column_names, run_batch
from pcd_tools.cli import main
from tests.schemas import Department, Sentiment, Ticket

from .helpers import assert_matches, read, texts, write_csv, write_jsonl, write_parquet

pytestmark = pytest.mark.engine


@pytest.fixture
def cli_tiny(monkeypatch, tiny):
    """`pcd batch` through `main(argv)`, loading the tiny model instead of the embedded one."""
    monkeypatch.setattr("pcd_tools.cli.batch.load_decider", lambda args: tiny)
    return tiny


def _batch(*argv: str) -> int:
    return main(["batch", "--schema", "tests.schemas:Ticket", *argv])


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_300_rows_equal_decide_many(tmp_path, cli_tiny, capsys, fmt):
    body = texts(300)
    ids = [f"T-{1000 + i}" for i in range(300)]
    src = (
        write_csv(tmp_path / "in.csv", [{"id": i, "body": b} for i, b in zip(ids, body)])
        if fmt == "csv"
        else write_parquet(tmp_path / "in.parquet", {"id": ids, "body": body})
    )
    out = tmp_path / "decided.parquet"
    argv = ["--input", str(src), "--output", str(out), "--text-column", "body"]
    assert _batch(*argv, "--chunk-rows", "64", "--batch-size", "16", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rows"] == 300 and summary["decided"] == 300
    assert summary["skipped"] == 0 and summary["errors"] == 0 and summary["chunks"] == 5
    rows = read(out)
    assert [r["id"] for r in rows] == ids  # one row per input row, in input order
    assert list(rows[0]) == ["id", *decision_column_names(Ticket)]
    assert_matches(rows, cli_tiny.decide_many(Ticket, body))
    assert not (tmp_path / "decided.parquet.pcd-batch").exists()  # the checkpoint is gone


def test_column_types_and_layout(tmp_path, tiny):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "text": t} for i, t in enumerate(texts(5))])
    run_batch(tiny, Sentiment, src, tmp_path / "o.parquet")
    schema = pq.read_schema(tmp_path / "o.parquet")
    assert schema.field("id").type == pa.int64()  # JSON integer ids stay integers
    assert schema.field("positive").type == pa.bool_()
    assert schema.field("topic").type == pa.string()  # Optional: "not stated" is null
    for name in ("positive__p", "topic__p", "confidence"):
        assert schema.field(name).type == pa.float64()
    assert schema.field("error").type == pa.string()
    rows = read(tmp_path / "o.parquet")
    assert {r["topic"] for r in rows} <= {"food", "service", "price", None}


def test_no_id_column_numbers_the_rows_and_other_formats(tmp_path, tiny):
    body = texts(7)
    src = write_csv(tmp_path / "in.csv", [{"text": b, "lang": "en"} for b in body])
    expected = tiny.decide_many(Ticket, body)
    for suffix in ("csv", "jsonl"):
        out = tmp_path / f"o.{suffix}"
        rep = run_batch(tiny, Ticket, src, out, chunk_rows=3)
        assert rep.rows == 7 and rep.chunks == 3
        rows = read(out)
        assert [r["row"] for r in rows] == list(range(7))
        for r, d in zip(rows, expected):
            assert r["department"] == d.fields["department"].label
            assert r["requires_escalation"] == d.fields["requires_escalation"].label
            assert r["priority__p"] == pytest.approx(d.fields["priority"].probability, abs=1e-5)


def test_bad_rows_are_reported_and_the_others_decided(tmp_path, tiny):
    good = texts(6)
    lines = [
        {"id": "g0", "text": good[0]},
        {"id": "empty", "text": ""},
        {"id": "g1", "text": good[1]},
        {"id": "spaces", "text": "   \n\t"},
        {"id": "number", "text": 42},
        {"id": "null", "text": None},
        {"id": "missing"},
        {"id": "list", "text": ["a", "b"]},
        "{not json",
        "[1, 2, 3]",
        {"id": "g2", "text": good[2]},
        {"id": "long", "text": "x" * 9000},  # the tiny model's window is 8192 tokens (bytes)
        {"id": "g3", "text": good[3]},
    ]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    rep = run_batch(tiny, Ticket, src, tmp_path / "o.parquet", chunk_rows=4, batch_size=2)
    assert rep.rows == 13 and rep.errors == 9
    rows = read(tmp_path / "o.parquet")
    by_id = {r["id"]: r for r in rows if r["id"] is not None}
    errors = {k: r["error"] for k, r in by_id.items()}
    assert "empty or only whitespace" in errors["empty"]
    assert "empty or only whitespace" in errors["spaces"]
    assert "must be a string; got int 42" in errors["number"]
    assert "must be a string; got list" in errors["list"]
    assert "missing (null)" in errors["null"] and "missing (null)" in errors["missing"]
    assert errors["long"].startswith("ContextTooLongError: The prompt needs")
    assert "line 9 is not valid JSON" in rows[8]["error"] and rows[8]["id"] is None
    assert "line 10 is a JSON list, not an object" in rows[9]["error"]
    for r in rows:
        if r["error"] is not None:  # a failed row has nulls in every decision column
            assert all(r[c] is None for c in decision_column_names(Ticket) if c != "error")
    decided = [by_id[k] for k in ("g0", "g1", "g2", "g3")]
    assert_matches(decided, tiny.decide_many(Ticket, good[:4]))


def test_bad_rows_in_parquet_and_allow_empty(tmp_path, tiny):
    src = write_parquet(tmp_path / "in.parquet", {"text": ["fine text", None, "", "also fine"]})
    rep = run_batch(tiny, Ticket, src, tmp_path / "o.parquet")
    assert rep.errors == 2
    rows = read(tmp_path / "o.parquet")
    assert [r["error"] is None for r in rows] == [True, False, False, True]
    rep = run_batch(tiny, Ticket, src, tmp_path / "e.parquet", allow_empty=True)
    assert rep.errors == 1  # only the null: an empty text is decided when allowed
    numbers = write_parquet(tmp_path / "n.parquet", {"text": [1, 2, 3]})
    rep = run_batch(tiny, Ticket, numbers, tmp_path / "n_out.parquet")
    assert rep.errors == 3
    assert "must be a string; got int 1" in read(tmp_path / "n_out.parquet")[0]["error"]


def test_enum_values_and_department_labels(tmp_path, tiny):
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts(4)])
    run_batch(tiny, Ticket, src, tmp_path / "o.parquet")
    values = {d.value for d in Department}
    assert {r["department"] for r in read(tmp_path / "o.parquet")} <= values


def test_progress_bar_and_summary_on_stderr(tmp_path, cli_tiny, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts(12)])
    out = tmp_path / "o.parquet"
    assert _batch("--input", str(src), "--output", str(out), "--chunk-rows", "5") == 0
    cap = capsys.readouterr()
    assert cap.out == ""  # stdout stays clean without --json
    assert "rows/s" in cap.err and "ETA" in cap.err and "12/12" in cap.err
    assert f"12 rows in {out}" in cap.err
    out.unlink()
    assert _batch("--input", str(src), "--output", str(out), "--quiet") == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--output", "o.xlsx"], "--output 'o.xlsx': unknown file type '.xlsx'"),
        (["--temperature", "0"], "--temperature must be a finite number > 0"),
        (["--chunk-rows", "0"], "--chunk-rows must be >= 1"),
        (["--schema", "tests.schemas:Nope"], "--schema: cannot import schema"),
        (["--actors", "3:1"], "--actors needs 1 <= MIN <= MAX"),
    ],
)
def test_usage_errors_exit_2_before_the_model_loads(tmp_path, monkeypatch, capsys, argv, needle):
    def no_model(args):
        raise AssertionError("the model must not load")

    monkeypatch.setattr("pcd_tools.cli.batch.load_decider", no_model)
    monkeypatch.chdir(tmp_path)
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "hi"}])
    base = {"--schema": "tests.schemas:Ticket", "--input": str(src), "--output": "o.parquet"}
    for k, v in zip(argv[::2], argv[1::2]):
        base[k] = v
    assert main(["batch", *[x for kv in base.items() for x in kv]]) == 2
    assert needle in capsys.readouterr().err


def test_missing_text_column_names_the_columns(tmp_path, cli_tiny, capsys):
    src = write_csv(tmp_path / "in.csv", [{"id": "1", "message": "hi"}])
    assert _batch("--input", str(src), "--output", str(tmp_path / "o.parquet")) == 1
    err = capsys.readouterr().err
    assert "no text column 'text'" in err and "['id', 'message']" in err


def test_a_field_named_like_the_id_column_is_refused(tmp_path, tiny):
    from pcd_tools.errors import InvalidArgumentError

    src = write_jsonl(tmp_path / "in.jsonl", [{"positive": 1, "text": "great food"}])
    with pytest.raises(InvalidArgumentError, match="already has column"):
        run_batch(tiny, Sentiment, src, tmp_path / "o.parquet", id_column="positive")


def test_an_input_without_rows_gives_an_empty_output_with_every_column(tmp_path, tiny):
    import pyarrow.parquet as pq

    src = tmp_path / "in.csv"
    src.write_text("id,text\n")
    rep = run_batch(tiny, Ticket, src, tmp_path / "o.parquet")
    assert (rep.rows, rep.errors) == (0, 0)
    table = pq.read_table(tmp_path / "o.parquet")
    assert table.num_rows == 0 and table.column_names == ["id", *decision_column_names(Ticket)]


def test_ctrl_c_says_how_to_resume(tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("pcd_tools.batch.run_batch", interrupted)
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "hi"}])
    assert _batch("--input", str(src), "--output", str(tmp_path / "o.parquet")) == 130
    assert "run the same command to resume" in capsys.readouterr().err
