"""Labelled datasets for evaluation and calibration, each with the schema a user would write.

Built-in adapters read the public sets under `shared/data/` (see its README): `banking77`,
`clinc150`, `nlupp`, `mams`, `sst2` and `sms_spam`. `from_file` adapts a user's own CSV,
TSV or JSONL file. Data is read in place and never copied.

An example is `(text, {field: label})` with JSON labels (`str`/`int` for enums, `bool` for
booleans). A field missing from an example's labels is not scored for that example (e.g.
CLINC-150's `intent` on out-of-scope queries).

Every dataset has an evaluation split and a calibration split. Where the source ships two
splits they are used (CLINC-150 test/val, MAMS test/val, NLU++ folds 0-9/10-19);
otherwise both come from one pool and the calibration sample excludes the evaluation
sample.
"""

from __future__ import annotations

import csv
import importlib
import json
import os
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field, create_model

from .errors import PcdToolsError
from .schema import FieldSpec, StructuredSchema, compile_schema

__all__ = [
    "DATASETS",
    "DataNotFoundError",
    "Dataset",
    "DatasetError",
    "Example",
    "Split",
    "add_data_arguments",
    "data_dir",
    "dataset_from_args",
    "from_file",
    "label_index",
    "load_dataset",
    "load_schema",
    "restrict_schema",
    "stratified_sample",
]

Example = tuple[str, dict[str, Any]]


class DatasetError(PcdToolsError, ValueError):
    """A dataset, its schema or its column mapping cannot be used."""


class DataNotFoundError(DatasetError, FileNotFoundError):
    """The labelled data is not where it was looked for."""


# --- sampling -------------------------------------------------------------------------------


def stratified_sample(
    strata: Sequence[Any], n: int | None, seed: int = 0, *, exclude: Sequence[int] = ()
) -> list[int]:
    """Indices of a fixed-seed sample whose strata keep their proportions.

    Each stratum gets `floor(n * share)` items and the remaining slots go to the largest
    remainders (ties broken by the seeded generator); items within a stratum are drawn
    without replacement.

    Args:
        strata: One stratum key per item.
        n: Sample size; `None` or at least the pool size returns the whole pool.
        seed: Seed of `numpy.random.default_rng`.
        exclude: Indices that may not be drawn.

    Returns:
        Sorted indices into `strata`.
    """
    banned = set(exclude)
    pool = [i for i in range(len(strata)) if i not in banned]
    if n is None or n >= len(pool):
        return pool
    if n < 0:
        raise DatasetError(f"sample size must be >= 0; got {n}.")
    rng = np.random.default_rng(seed)
    groups: dict[Any, list[int]] = {}
    for i in pool:
        groups.setdefault(strata[i], []).append(i)
    keys = list(groups)
    quota = np.array([n * len(groups[k]) / len(pool) for k in keys])
    take = np.floor(quota).astype(int)
    rest = n - int(take.sum())
    if rest:
        tiebreak = rng.random(len(keys))
        order = sorted(range(len(keys)), key=lambda j: (-(quota[j] - take[j]), tiebreak[j]))
        for j in order[:rest]:
            take[j] += 1
    out: list[int] = []
    for k, t in zip(keys, take):
        members = groups[k]
        out.extend(int(i) for i in rng.choice(members, size=int(t), replace=False))
    return sorted(out)


@dataclass
class Split:
    """Labelled examples with stable ids and sampling strata.

    Args:
        name: Where they came from (e.g. `"test"`).
        examples: `(text, {field: label})` pairs.
        ids: One stable id per example (recorded in calibration files).
        strata: One stratum key per example (stratified sampling).
    """

    name: str
    examples: list[Example]
    ids: list[str]
    strata: list[Any]

    def __len__(self) -> int:
        return len(self.examples)

    def sample(self, n: int | None, seed: int = 0, *, exclude_ids: Sequence[str] = ()) -> Split:
        """A stratified, fixed-seed subsample (see `stratified_sample`)."""
        banned = set(exclude_ids)
        idx = stratified_sample(
            self.strata, n, seed, exclude=[i for i, x in enumerate(self.ids) if x in banned]
        )
        return Split(
            self.name,
            [self.examples[i] for i in idx],
            [self.ids[i] for i in idx],
            [self.strata[i] for i in idx],
        )


@dataclass
class Dataset:
    """A labelled dataset and the decision schema it is evaluated with.

    Args:
        name: Dataset name.
        schema: The schema (a Pydantic model class or `StructuredSchema`).
        eval_split: Pool the evaluation sample is drawn from.
        calibration_split: Pool the calibration sample is drawn from (may be the same
            object as `eval_split`; then samples are kept disjoint by id).
        source: Files it was read from.
    """

    name: str
    schema: Any
    eval_split: Split
    calibration_split: Split
    source: list[str] = field(default_factory=list)

    def eval_sample(self, n: int | None, seed: int = 0) -> Split:
        """The stratified evaluation sample."""
        return self.eval_split.sample(n, seed)

    def calibration_sample(
        self, n: int | None, seed: int = 0, *, eval_n: int | None = None, eval_seed: int = 0
    ) -> Split:
        """A calibration sample disjoint from `eval_sample(eval_n, eval_seed)`."""
        if self.calibration_split is not self.eval_split:
            return self.calibration_split.sample(n, seed)
        held = self.eval_sample(eval_n, eval_seed).ids
        if len(held) >= len(self.eval_split):
            raise DatasetError(
                f"{self.name}: the evaluation sample (n={eval_n}) uses the whole pool of "
                f"{len(self.eval_split)} examples, so no disjoint calibration data is left; "
                "lower --eval-n."
            )
        return self.calibration_split.sample(n, seed, exclude_ids=held)

    def restrict(self, fields: Sequence[str]) -> Dataset:
        """The same data scored on some fields only (a narrower schema)."""
        schema = restrict_schema(self.schema, fields)

        def keep(s: Split) -> Split:
            # examples left with no label for any kept field cannot be scored: drop them
            rows = [
                (t, {k: v for k, v in lab.items() if k in fields}, i, st)
                for (t, lab), i, st in zip(s.examples, s.ids, s.strata)
            ]
            rows = [r for r in rows if r[1]]
            return Split(
                s.name,
                [(t, lab) for t, lab, _, _ in rows],
                [r[2] for r in rows],
                [r[3] for r in rows],
            )

        ev = keep(self.eval_split)
        cal = ev if self.calibration_split is self.eval_split else keep(self.calibration_split)
        return Dataset(self.name, schema, ev, cal, self.source)


def restrict_schema(schema: Any, fields: Sequence[str]) -> type[BaseModel]:
    """A Pydantic model with only `fields` of `schema` (same descriptions and docstring)."""
    compiled = compile_schema(schema)
    model = compiled.model
    unknown = [f for f in fields if f not in model.model_fields]
    if unknown or not fields:
        raise DatasetError(
            f"{compiled.name}: cannot restrict to {list(fields)!r}; accepted: a non-empty "
            f"subset of {compiled.field_names}."
        )
    kept = {f: (model.model_fields[f].annotation, model.model_fields[f]) for f in fields}
    return create_model(  # type: ignore[call-overload]
        model.__name__, __doc__=compiled.instructions or None, **kept
    )


# --- locating data --------------------------------------------------------------------------


def data_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The labelled-data folder: `path`, else `$PCD_DATA_DIR`, else `../shared/data`.

    `../shared/data` is looked up relative to the repository root, then to the working
    directory.

    Raises:
        DataNotFoundError: naming every place tried.
    """
    tried = []
    if path is not None:
        cands = [Path(path)]
    else:
        env = os.environ.get("PCD_DATA_DIR")
        root = Path(__file__).resolve().parents[1]
        cands = [Path(env)] if env else []
        cands += [root.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    for c in cands:
        tried.append(str(c))
        if c.is_dir():
            return c
    raise DataNotFoundError(
        f"labelled data not found; tried {tried}. Pass --data-dir or set PCD_DATA_DIR."
    )


def _need(p: Path) -> Path:
    if not p.exists():
        raise DataNotFoundError(f"expected data file {str(p)!r} is missing.")
    return p


def _enum_model(name: str, doc: str, spec: Mapping[str, tuple[Any, str]]) -> type[BaseModel]:
    fields = {k: (tp, Field(description=d)) for k, (tp, d) in spec.items()}
    return create_model(name, __doc__=doc, **fields)  # type: ignore[call-overload]


# --- the built-in adapters ------------------------------------------------------------------


def _as_words(labels: Sequence[str], what: str) -> dict[str, str]:
    """Dataset label -> the words the schema offers (`card_arrival` -> `card arrival`).

    Words read better than snake_case ids, and they tokenize shorter: banking77's trie
    drops from 541 to 387 tokens and clinc150's intent trie from 429 to 290, so the
    fields pass of a many-choice field shrinks by about 30%.
    """
    words = {lab: lab.replace("_", " ").strip().lower() for lab in labels}
    if len(set(words.values())) != len(words):
        raise DatasetError(f"{what}: labels collide once written as words: {sorted(labels)}.")
    return words


def banking77(root: Path) -> Dataset:
    """BANKING77 test set: one 77-way `intent` enum (labels written as words)."""
    labels = json.loads(_need(root / "banking77" / "categories.json").read_text())
    word = _as_words(labels, "banking77 intents")
    schema = _enum_model(
        "BankingQuery",
        "Classify a customer's message to a digital bank's support chat by what they need.",
        {
            "intent": (
                Literal[tuple(word[lab] for lab in labels)],
                "The customer's intent: what they want help with",
            )
        },
    )
    with _need(root / "banking77" / "test.csv").open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    ex = [(r["text"], {"intent": word[r["category"]]}) for r in rows]
    split = Split("test", ex, [f"test:{i}" for i in range(len(ex))], [r["category"] for r in rows])
    return Dataset("banking77", schema, split, split, [str(root / "banking77" / "test.csv")])


def clinc150(root: Path) -> Dataset:
    """CLINC-150: `domain` (10), `intent` (150) and `in_scope` on one query (labels as words)."""
    domains: dict[str, list[str]] = json.loads(
        _need(root / "clinc150" / "domains.json").read_text()
    )
    data = json.loads(_need(root / "clinc150" / "data_full.json").read_text())
    domain_of = {i: d for d, intents in domains.items() for i in intents}
    intents = [i for d in domains.values() for i in d]
    word = {
        **_as_words(list(domains), "clinc150 domains"),
        **_as_words(intents, "clinc150 intents"),
    }
    schema = _enum_model(
        "AssistantRequest",
        "Route a user's request to a virtual assistant. The assistant supports ten areas; "
        "some requests fall outside all of them.",
        {
            "domain": (
                Literal[tuple(word[d] for d in domains)],
                "The area of life the request is about",
            ),
            "intent": (
                Literal[tuple(word[i] for i in intents)],
                "The specific thing the user asks the assistant to do",
            ),
            "in_scope": (
                bool,
                "Whether the assistant supports this request (false if it fits none of its intents)",
            ),
        },
    )

    def split(name: str, parts: tuple[str, str]) -> Split:
        ex, ids, strata = [], [], []
        for part in parts:
            for i, (text, intent) in enumerate(data[part]):
                lab: dict[str, Any] = {"in_scope": intent != "oos"}
                if intent != "oos":
                    lab.update(domain=word[domain_of[intent]], intent=word[intent])
                ex.append((text, lab))
                ids.append(f"{part}:{i}")
                strata.append(intent)
        return Split(name, ex, ids, strata)

    src = [str(root / "clinc150" / "data_full.json")]
    return Dataset(
        "clinc150",
        schema,
        split("test", ("test", "oos_test")),
        split("val", ("val", "oos_val")),
        src,
    )


NLUPP_FLAGS = 12


def nlupp(root: Path, n_flags: int = NLUPP_FLAGS) -> Dataset:
    """NLU++ banking: the `n_flags` most frequent intent flags as booleans.

    Each field's description is the ontology's yes/no question.
    """
    onto = json.loads(_need(root / "nlupp" / "ontology.json").read_text())["intents"]
    folds: list[list[dict[str, Any]]] = []
    for k in range(20):
        folds.append(json.loads(_need(root / "nlupp" / "banking" / f"fold{k}.json").read_text()))
    freq = Counter(f for fold in folds for ex in fold for f in ex.get("intents", []))
    flags = [f for f, _ in sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))[:n_flags]]
    schema = _enum_model(
        "BankingUtterance",
        "Answer yes/no questions about one message a customer said to a bank's virtual "
        "assistant. Several answers can be yes.",
        {f: (bool, onto[f]["description"][:1].upper() + onto[f]["description"][1:]) for f in flags},
    )

    def split(name: str, ks: range) -> Split:
        ex, ids, strata = [], [], []
        for k in ks:
            for i, row in enumerate(folds[k]):
                have = set(row.get("intents", []))
                ex.append((row["text"], {f: f in have for f in flags}))
                ids.append(f"fold{k}:{i}")
                strata.append(next((f for f in flags if f in have), "none"))
        return Split(name, ex, ids, strata)

    src = [str(root / "nlupp" / "banking")]
    return Dataset(
        "nlupp", schema, split("folds0-9", range(10)), split("folds10-19", range(10, 20)), src
    )


MAMS_ASPECTS = {
    "food": "the food",
    "staff": "the staff",
    "miscellaneous": "anything else about the visit (miscellaneous)",
    "place": "the place itself",
    "service": "the service",
    "menu": "the menu",
    "price": "the prices",
    "ambience": "the ambience",
}
Polarity = Literal["positive", "negative", "neutral", "not_mentioned"]


def mams(root: Path) -> Dataset:
    """MAMS aspect-category sentiment: eight {positive, negative, neutral, not_mentioned}."""
    schema = _enum_model(
        "RestaurantReview",
        "Read one sentence from a restaurant review and give the sentiment it expresses "
        "about each aspect; use not_mentioned when the sentence does not talk about it.",
        {a: (Polarity, f"Sentiment about {what}") for a, what in MAMS_ASPECTS.items()},
    )

    def split(name: str) -> Split:
        path = _need(root / "mams" / f"acsa_{name}.xml")
        ex, ids, strata = [], [], []
        for i, s in enumerate(ET.parse(path).getroot().iter("sentence")):
            lab = dict.fromkeys(MAMS_ASPECTS, "not_mentioned")
            for ac in s.iter("aspectCategory"):
                lab[ac.get("category", "")] = ac.get("polarity", "")
            text = (s.findtext("text") or "").strip()
            ex.append((text, lab))
            ids.append(f"{name}:{i}")
            strata.append(next(a for a in MAMS_ASPECTS if lab[a] != "not_mentioned"))
        return Split(name, ex, ids, strata)

    return Dataset("mams", schema, split("test"), split("val"), [str(root / "mams")])


class MovieReviewSentence(BaseModel):
    """Judge the sentiment of one sentence from a movie review."""

    positive: bool = Field(
        description="Whether the sentence expresses a positive opinion of the film"
    )


def sst2(root: Path) -> Dataset:
    """GLUE SST-2 dev: one boolean, `positive`."""
    path = _need(root / "sst2" / "dev.tsv")
    ex = []
    with path.open(encoding="utf-8") as fh:
        for row in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE):
            ex.append((row["text"].strip(), {"positive": row["label"].strip() == "1"}))
    split = Split(
        "dev", ex, [f"dev:{i}" for i in range(len(ex))], [lab["positive"] for _, lab in ex]
    )
    return Dataset("sst2", MovieReviewSentence, split, split, [str(path)])


class TextMessage(BaseModel):
    """Screen an incoming SMS text message."""

    is_spam: bool = Field(
        description="Whether the message is unsolicited spam: advertising, prizes, paid services or scams"
    )


def sms_spam(root: Path) -> Dataset:
    """UCI SMS Spam Collection: one boolean, `is_spam`."""
    path = _need(root / "sms_spam" / "SMSSpamCollection")
    ex = []
    with path.open(encoding="utf-8") as fh:
        next(fh)  # the `Label\tSMS` header line
        for line in fh:
            label, _, text = line.rstrip("\n").partition("\t")
            if label in ("ham", "spam"):
                ex.append((text, {"is_spam": label == "spam"}))
    split = Split(
        "all", ex, [f"sms:{i}" for i in range(len(ex))], [lab["is_spam"] for _, lab in ex]
    )
    return Dataset("sms_spam", TextMessage, split, split, [str(path)])


DATASETS: dict[str, Callable[[Path], Dataset]] = {
    "banking77": banking77,
    "clinc150": clinc150,
    "nlupp": nlupp,
    "mams": mams,
    "sst2": sst2,
    "sms_spam": sms_spam,
}


def load_dataset(
    name: str, root: str | os.PathLike[str] | None = None, *, fields: Sequence[str] | None = None
) -> Dataset:
    """A built-in dataset by name.

    Args:
        name: One of `DATASETS`.
        root: The labelled-data folder (default: see `data_dir`).
        fields: Score only these fields.

    Raises:
        DatasetError: for an unknown name or field.
        DataNotFoundError: if the files are missing.
    """
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; accepted: {sorted(DATASETS)}.")
    ds = DATASETS[name](data_dir(root))
    return ds.restrict(fields) if fields else ds


# --- a user's own data ----------------------------------------------------------------------

_TRUE = {"1", "true", "yes", "y", "t"}
_FALSE = {"0", "false", "no", "n", "f"}


def load_schema(spec: str) -> Any:
    """A schema from `module:Class` or from a JSON file in the `StructuredSchema` dict form.

    Raises:
        DatasetError: naming what was given and the two accepted forms.
    """
    if spec.endswith(".json") or os.path.isfile(spec):
        try:
            obj = json.loads(Path(spec).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise DatasetError(f"cannot read schema file {spec!r}: {e}") from e
        if isinstance(obj, dict) and "fields" in obj:
            return StructuredSchema(
                obj["fields"],
                name=obj.get("name", "StructuredSchema"),
                instructions=obj.get("instructions", ""),
            )
        return StructuredSchema(obj)
    mod, sep, attr = spec.partition(":")
    if not sep or not mod or not attr:
        raise DatasetError(
            f"schema {spec!r} is neither a JSON file nor 'module:Class'; accepted: e.g. "
            "'myapp.schemas:Ticket' or 'ticket_schema.json'."
        )
    try:
        obj = importlib.import_module(mod)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise DatasetError(f"cannot import schema {spec!r}: {e}") from e
    return obj


def _coerce(spec: FieldSpec, raw: Any, where: str) -> Any:
    """A raw cell as the field's JSON label; `None` means unlabelled."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if spec.kind == "boolean":
        if isinstance(raw, bool):
            return raw
        s = str(raw).strip().lower()
        if s in _TRUE | _FALSE:
            return s in _TRUE
        raise DatasetError(
            f"{where}: {raw!r} is not a boolean label for field {spec.name!r}; accepted: "
            f"{sorted(_TRUE)} or {sorted(_FALSE)}."
        )
    for c in spec.choices:
        if c.label == raw or str(c.label) == str(raw).strip():
            return c.label
    raise DatasetError(
        f"{where}: {raw!r} is not a choice of field {spec.name!r}; accepted: {spec.labels}."
    )


def _read_rows(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        with path.open(encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    if suffix == ".json":
        rows = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(rows, list):
            raise DatasetError(f"{path}: a .json data file must hold a list of objects.")
        return rows
    if suffix in (".csv", ".tsv"):
        with path.open(newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(fh, delimiter="\t" if suffix == ".tsv" else ","))
    raise DatasetError(
        f"{path}: unknown data format {suffix!r}; accepted: .csv, .tsv, .jsonl, .json."
    )


def from_file(
    path: str | os.PathLike[str],
    schema: Any,
    *,
    text: str = "text",
    columns: Mapping[str, str] | None = None,
    name: str | None = None,
) -> Dataset:
    """A dataset from a user's CSV/TSV/JSONL file.

    Args:
        path: The data file.
        schema: A schema object, or a string for `load_schema` (`module:Class` or JSON).
        text: The column holding the text to decide on.
        columns: Field name -> column; fields not named map to a column of the same name.
        name: Dataset name (default: the file stem).

    Raises:
        DatasetError: for a missing column or a label that is not one of a field's choices.
    """
    p = Path(path)
    if not p.is_file():
        raise DataNotFoundError(f"data file {str(p)!r} does not exist.")
    sch = load_schema(schema) if isinstance(schema, str) else schema
    compiled = compile_schema(sch)
    cols = dict(columns or {})
    unknown = set(cols) - set(compiled.field_names)
    if unknown:
        raise DatasetError(
            f"column mapping names unknown field(s) {sorted(unknown)}; fields: {compiled.field_names}."
        )
    rows = _read_rows(p)
    if rows:
        have = set(rows[0])
        want = [text, *(cols.get(f.name, f.name) for f in compiled.fields)]
        missing = [c for c in want if c not in have]
        if text in missing or len(missing) == len(want) - 1:
            raise DatasetError(
                f"{p}: missing column(s) {missing}; the file has {sorted(have)}. Map fields to "
                "columns with --map field=column and name the text column with --text-column."
            )
    ex, strata = [], []
    for i, row in enumerate(rows):
        lab = {}
        for f in compiled.fields:
            v = _coerce(f, row.get(cols.get(f.name, f.name)), f"{p.name} row {i + 1}")
            if v is not None:
                lab[f.name] = v
        ex.append((str(row[text]), lab))
        strata.append(json.dumps(lab.get(compiled.fields[0].name)))
    split = Split("file", ex, [f"row:{i}" for i in range(len(ex))], strata)
    return Dataset(name or p.stem, sch, split, split, [str(p)])


# --- command-line options shared by `pcd eval` and `pcd calibrate` ---------------------------


def add_data_arguments(parser: Any) -> None:
    """Adds the options that choose a dataset (built-in or a user's file)."""
    g = parser.add_argument_group("data")
    g.add_argument("--dataset", choices=sorted(DATASETS), help="a built-in labelled dataset")
    g.add_argument("--data", default=None, help="your own CSV/TSV/JSONL file instead")
    g.add_argument(
        "--schema", default=None, help="for --data: 'module:Class' or a JSON schema file"
    )
    g.add_argument("--text-column", default="text", help="for --data: the text column")
    g.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="FIELD=COLUMN",
        help="for --data: read FIELD's label from COLUMN (repeatable)",
    )
    g.add_argument("--data-dir", default=None, help="labelled-data folder (default ../shared/data)")
    g.add_argument("--fields", default=None, help="comma-separated fields to score (default all)")


def dataset_from_args(args: Any) -> Dataset:
    """The dataset the options of `add_data_arguments` describe.

    Raises:
        DatasetError: when neither or both of --dataset and --data are given, or when
            --data lacks --schema or a --map entry is malformed.
    """
    fields = [f.strip() for f in args.fields.split(",") if f.strip()] if args.fields else None
    if bool(args.dataset) == bool(args.data):
        raise DatasetError(
            "give exactly one of --dataset NAME (one of "
            f"{sorted(DATASETS)}) or --data FILE --schema SPEC."
        )
    if args.dataset:
        return load_dataset(args.dataset, args.data_dir, fields=fields)
    if not args.schema:
        raise DatasetError("--data needs --schema 'module:Class' or a JSON schema file.")
    cols = {}
    for m in args.map:
        key, sep, col = m.partition("=")
        if not sep or not key or not col:
            raise DatasetError(f"--map takes FIELD=COLUMN; got {m!r}.")
        cols[key] = col
    ds = from_file(args.data, args.schema, text=args.text_column, columns=cols)
    return ds.restrict(fields) if fields else ds


def label_index(spec: FieldSpec, label: Any) -> int:
    """The index of the candidate whose JSON value is `label`.

    Raises:
        DatasetError: naming the field, the label and the accepted labels.
    """
    lit = json.dumps(label, ensure_ascii=False)
    for i, c in enumerate(spec.choices):
        if c.literal == lit:
            return i
    raise DatasetError(
        f"label {label!r} is not a choice of field {spec.name!r}; accepted: {spec.labels}."
    )
