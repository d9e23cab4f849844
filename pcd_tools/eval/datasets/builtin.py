"""The built-in datasets: public labelled sets under `shared/data/`, each with its schema.

The adapters read `banking77`, `clinc150`, `nlupp`, `mams`, `sst2` and `sms_spam` in
place (see the data folder's README); nothing is copied. Where the source ships two
splits they are used (CLINC-150 test/val, MAMS test/val, NLU++ folds 0-9/10-19);
otherwise both come from one pool and the calibration sample excludes the evaluation
sample.
"""

from __future__ import annotations

import csv
import json
import os
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, create_model

from .base import DataNotFoundError, Dataset, DatasetError, Split

__all__ = [
    "DATASETS",
    "MovieReviewSentence",
    "TextMessage",
    "data_dir",
    "load_dataset",
]

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
        root = Path(__file__).resolve().parents[3]  # the repository, above pcd_tools/eval/datasets
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
