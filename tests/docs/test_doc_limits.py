"""The documents stay readable: README.md within about 450 lines, each guide in docs/,
BENCHMARKS.md and EVAL.md within about 600, and every relative link in them points at a
file that exists (and, for a link into a Markdown file, at one of its headings)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.docs.blocks import DOCUMENTS, ROOT, text

pytestmark = pytest.mark.unit

REPORTS = ["BENCHMARKS.md", "EVAL.md"]
LIMITS = {"README.md": 470, **{doc: 620 for doc in DOCUMENTS if doc != "README.md"}}
LIMITS.update({doc: 620 for doc in REPORTS})

_FENCE = re.compile(r"^```.*?^```", flags=re.M | re.S)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(doc: str) -> str:
    """The document without its fenced code blocks and inline code."""
    return re.sub(r"`[^`\n]*`", "", _FENCE.sub("", text(doc)))


def anchors(doc: str) -> set[str]:
    """GitHub's anchors for the document's headings: lower case, punctuation dropped but
    `-` and `_`, spaces as `-`, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for line in _FENCE.sub("", text(doc)).splitlines():
        m = re.match(r"^#{1,6} (.*?)#*\s*$", line)
        if not m:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))  # a link's text
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(doc: str) -> list[str]:
    return [t for t in _LINK.findall(_prose(doc)) if not re.match(r"^[a-z][a-z+.-]*:", t)]


@pytest.mark.parametrize("doc", list(LIMITS))
def test_the_document_is_within_its_length(doc):
    lines = text(doc).count("\n")
    assert lines <= LIMITS[doc], f"{doc}: {lines} lines, the limit is {LIMITS[doc]}"


def test_the_limits_cover_the_readme_the_guides_and_the_reports():
    assert LIMITS["README.md"] == 470
    assert {"docs/models.md", "docs/agents.md", "BENCHMARKS.md", "EVAL.md"} <= set(LIMITS)
    assert all(limit == 620 for doc, limit in LIMITS.items() if doc != "README.md")


@pytest.mark.parametrize("doc", DOCUMENTS + REPORTS)
def test_every_relative_link_points_at_an_existing_file(doc):
    broken = []
    for target in links(doc):
        path, _, anchor = target.partition("#")
        file = (ROOT / doc).parent / unquote(path) if path else ROOT / doc
        if not file.resolve().exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md":
            rel = file.resolve().relative_to(ROOT).as_posix()
            if anchor not in anchors(rel):
                broken.append(f"{target}: no heading #{anchor} in {rel}")
    assert broken == [], f"{doc}: {broken}"


def test_the_link_check_sees_links_and_anchors():
    assert "docs/models.md#environment-switches" in links("README.md")
    assert "environment-switches" in anchors("docs/models.md")
    assert {"quick-start", "install"} <= anchors("README.md")
    assert Path(ROOT / "docs" / "models.md").exists()
