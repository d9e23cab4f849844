"""Dataset adapters on the labelled sets in shared/data, the generic adapter and sampling."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from pcd_tools.eval.datasets import (
    DATASETS,
    DataNotFoundError,
    DatasetError,
    Split,
    data_dir,
    from_file,
    label_index,
    load_dataset,
    load_schema,
    stratified_sample,
)
from pcd_tools.schema import compile_schema

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _data() -> Path:
    env = os.environ.get("PCD_DATA_DIR")
    p = Path(env) if env else ROOT.parent / "shared" / "data"
    if not p.is_dir():
        pytest.skip(f"labelled data not found at {p}")
    return p


@pytest.fixture(scope="module")
def data() -> Path:
    return _data()


def _all_labels_valid(ds) -> None:
    schema = compile_schema(ds.schema)
    for split in (ds.eval_split, ds.calibration_split):
        for _, lab in split.examples[:200]:
            for k, v in lab.items():
                label_index(schema.field(k), v)


def test_banking77(data):
    ds = load_dataset("banking77", data)
    schema = compile_schema(ds.schema)
    assert schema.field_names == ["intent"]
    assert schema.fields[0].cardinality == 77
    assert len(ds.eval_split) == 3080
    # labels are offered as words: `card_arrival` becomes "card arrival"
    assert ds.eval_split.examples[0] == ("How do I locate my card?", {"intent": "card arrival"})
    assert '"card arrival"' in [c.literal for c in schema.fields[0].choices]
    assert not any("_" in c.literal for c in schema.fields[0].choices)
    assert schema.fields[0].description  # a description a user would write
    _all_labels_valid(ds)


def test_clinc150(data):
    ds = load_dataset("clinc150", data)
    schema = compile_schema(ds.schema)
    assert schema.field_names == ["domain", "intent", "in_scope"]
    assert [f.cardinality for f in schema.fields] == [10, 150, 2]
    assert len(ds.eval_split) == 4500 + 1000 and len(ds.calibration_split) == 3000 + 100
    oos = [lab for _, lab in ds.eval_split.examples if not lab["in_scope"]]
    assert len(oos) == 1000 and all(set(lab) == {"in_scope"} for lab in oos)
    first = next(lab for _, lab in ds.eval_split.examples if lab["in_scope"])
    assert not any("_" in first[k] for k in ("domain", "intent"))  # labels as words
    assert '"kitchen and dining"' in [c.literal for c in schema.fields[0].choices]
    _all_labels_valid(ds)
    only = load_dataset("clinc150", data, fields=["domain"])
    assert compile_schema(only.schema).field_names == ["domain"]
    assert len(only.eval_split) == 4500  # out-of-scope queries have no domain: dropped


def test_label_words_must_stay_distinct():
    from pcd_tools.eval.datasets.builtin import _as_words

    assert _as_words(["card_arrival", "Refund_not_showing_up"], "x") == {
        "card_arrival": "card arrival",
        "Refund_not_showing_up": "refund not showing up",
    }
    with pytest.raises(DatasetError, match="collide"):
        _as_words(["top_up", "top up"], "banking77 intents")


def test_nlupp(data):
    ds = load_dataset("nlupp", data)
    schema = compile_schema(ds.schema)
    onto = json.loads((data / "nlupp" / "ontology.json").read_text())["intents"]
    assert 10 <= len(schema.fields) <= 20
    assert all(f.kind == "boolean" for f in schema.fields)
    assert schema.field_names[0] == "transfer_payment_deposit"  # the most frequent flag
    for f in schema.fields:
        assert f.description.lower() == onto[f.name]["description"].lower()
    text, lab = ds.eval_split.examples[0]
    assert text == "How long does it usually take to get a new pin?"
    assert not any(lab.values())  # its flags (how_long, pin, ...) are not among the top 12
    assert len(ds.eval_split) + len(ds.calibration_split) == 2071
    _all_labels_valid(ds)


def test_mams(data):
    ds = load_dataset("mams", data)
    schema = compile_schema(ds.schema)
    assert len(schema.fields) == 8
    assert all(
        f.labels == ["positive", "negative", "neutral", "not_mentioned"] for f in schema.fields
    )
    assert len(ds.eval_split) == 400 and len(ds.calibration_split) == 400
    _, lab = ds.eval_split.examples[1]
    assert lab["food"] == "positive" and lab["service"] == "negative"
    assert lab["staff"] == "not_mentioned"
    _all_labels_valid(ds)


def test_sst2(data):
    ds = load_dataset("sst2", data)
    assert compile_schema(ds.schema).field_names == ["positive"]
    assert len(ds.eval_split) == 872
    assert ds.eval_split.examples[0] == (
        "it 's a charming and often affecting journey .",
        {"positive": True},
    )
    assert ds.eval_split.examples[1][1] == {"positive": False}


def test_sms_spam(data):
    ds = load_dataset("sms_spam", data)
    assert compile_schema(ds.schema).field_names == ["is_spam"]
    counts = Counter(lab["is_spam"] for _, lab in ds.eval_split.examples)
    assert counts == {False: 4827, True: 747}
    assert ds.eval_split.examples[0][0].startswith("Go until jurong point")


def test_every_adapter_is_registered_and_schemas_are_stable(data):
    assert sorted(DATASETS) == ["banking77", "clinc150", "mams", "nlupp", "sms_spam", "sst2"]
    fp1 = compile_schema(load_dataset("banking77", data).schema).fingerprint()
    fp2 = compile_schema(load_dataset("banking77", data).schema).fingerprint()
    assert fp1 == fp2  # calibration files depend on it


def test_eval_and_calibration_samples_are_disjoint_and_fixed(data):
    ds = load_dataset("sst2", data)
    a = ds.eval_sample(300, 0)
    assert a.ids == ds.eval_sample(300, 0).ids
    assert a.ids != ds.eval_sample(300, 1).ids
    cal = ds.calibration_sample(300, 1, eval_n=300, eval_seed=0)
    assert len(cal) == 300 and not set(cal.ids) & set(a.ids)
    with pytest.raises(DatasetError, match="no disjoint calibration data"):
        ds.calibration_sample(10, 0, eval_n=None)


def test_stratified_sample_keeps_proportions():
    strata = ["a"] * 60 + ["b"] * 30 + ["c"] * 10
    idx = stratified_sample(strata, 10, seed=3)
    assert Counter(strata[i] for i in idx) == {"a": 6, "b": 3, "c": 1}
    assert idx == stratified_sample(strata, 10, seed=3)
    assert idx == sorted(idx) and len(set(idx)) == 10
    # remainders: 7 * (0.6, 0.3, 0.1) = 4.2, 2.1, 0.7 -> c takes the spare slot
    assert Counter(strata[i] for i in stratified_sample(strata, 7, seed=0)) == {
        "a": 4,
        "b": 2,
        "c": 1,
    }
    assert stratified_sample(strata, None) == list(range(100))
    assert not set(stratified_sample(strata, 50, exclude=range(50))) & set(range(50))


def test_generic_csv_with_column_mapping(tmp_path):
    f = tmp_path / "tickets.csv"
    f.write_text("body,urgent,team\nServer down,yes,ops\nInvoice,no,billing\nHello,,ops\n")
    schema = {
        "is_urgent": {"type": "boolean", "description": "Whether it is urgent"},
        "team": {"type": "enum", "choices": ["ops", "billing"], "description": "Owner"},
    }
    sf = tmp_path / "schema.json"
    sf.write_text(json.dumps(schema))
    ds = from_file(f, str(sf), text="body", columns={"is_urgent": "urgent"})
    assert ds.name == "tickets"
    assert ds.eval_split.examples == [
        ("Server down", {"is_urgent": True, "team": "ops"}),
        ("Invoice", {"is_urgent": False, "team": "billing"}),
        ("Hello", {"team": "ops"}),  # an empty cell is unlabelled, not False
    ]


def test_generic_jsonl_and_module_schema(tmp_path):
    f = tmp_path / "reviews.jsonl"
    f.write_text(
        json.dumps({"text": "great", "positive": 1})
        + "\n"
        + json.dumps({"text": "bad", "positive": 0})
        + "\n"
    )
    ds = from_file(f, "pcd_tools.eval.datasets.builtin:MovieReviewSentence")
    assert [lab for _, lab in ds.eval_split.examples] == [{"positive": True}, {"positive": False}]


def test_generic_adapter_errors_name_what_is_accepted(tmp_path):
    f = tmp_path / "d.csv"
    f.write_text("text,team\nx,sales\n")
    schema = {"team": {"type": "enum", "choices": ["ops", "billing"]}}
    with pytest.raises(DatasetError, match=r"'sales' is not a choice of field 'team'.*ops"):
        from_file(f, schema)
    with pytest.raises(DatasetError, match="missing column"):
        from_file(f, schema, text="body")
    with pytest.raises(DatasetError, match="unknown field"):
        from_file(f, schema, columns={"nope": "team"})
    with pytest.raises(DatasetError, match="module:Class"):
        load_schema("not a schema")
    with pytest.raises(DatasetError, match="cannot import"):
        load_schema("pcd_tools.eval.datasets:NoSuchClass")
    with pytest.raises(DatasetError, match="unknown dataset"):
        load_dataset("imdb")


def test_data_dir_lookup(tmp_path, monkeypatch):
    monkeypatch.setenv("PCD_DATA_DIR", str(tmp_path))
    assert data_dir() == tmp_path
    with pytest.raises(DataNotFoundError, match="tried"):
        data_dir(tmp_path / "missing")


def test_split_sample_excludes_ids():
    s = Split("x", [(str(i), {}) for i in range(10)], [f"i{i}" for i in range(10)], [0] * 10)
    out = s.sample(5, 0, exclude_ids=["i0", "i1", "i2", "i3", "i4"])
    assert sorted(out.ids) == ["i5", "i6", "i7", "i8", "i9"]


def test_data_dir_default_is_beside_the_repository(tmp_path, monkeypatch):
    # the default is looked up from the package's own location, not the working directory
    expected = ROOT.parent / "shared" / "data"
    if not expected.is_dir():
        pytest.skip(f"labelled data not found at {expected}")
    monkeypatch.delenv("PCD_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert data_dir() == expected
