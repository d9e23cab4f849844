"""Every Python block of the README and of the guides in docs/ runs as written, and shows
what it really prints.

A line's `# -> text` comment (on the statement, or on comment lines right after it) is
the output that statement prints on the embedded model; the test runs each top-level
statement, captures what it prints and compares, line by line (`tests/docs/blocks.py`).
Each block is named by a `<!-- block: NAME -->` comment above its fence, and each test
below says which names it runs; a document with a block that no test runs fails
`test_every_python_block_of_the_document_is_run`. Some blocks cannot run exactly as
written here, and their test says how it bends them:

- the README's "real models" block loads model files that CI does not have: `Decider.load`
  is replaced by a stand-in that checks each call against the real signature and returns
  the embedded model;
- the guides' blocks continue the README's quick start: they get its `decider` (the
  session's embedded model) and the names it imported, or run after it;
- the server's `typesafe-sdk`, OpenAI-client and OpenAI Decisions blocks talk to
  `http://127.0.0.1:8000`: the test serves the embedded model on a free port and points
  that address there;
- the MCP LangGraph block starts `pcd mcp`: the test starts the same command through this
  interpreter.

The Ray Data block of docs/scale-out.md runs in `tests/ray/test_readme_scale_out.py`.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from examples.router import Route
from pcd_tools import Decider
from tests.docs.blocks import DOCUMENTS, all_named_blocks, block, fences, named_blocks, same_output
from tests.docs.blocks import run_checked as _run_checked
from tests.serve.live import live_server

pytestmark = pytest.mark.integration

# How many Python blocks each document holds (a document not listed holds none).
PYTHON_BLOCKS = {
    "README.md": 2,
    "docs/schemas.md": 2,
    "docs/probabilities.md": 2,
    "docs/agents.md": 7,
    "docs/server.md": 3,
    "docs/mcp.md": 2,
    "docs/scale-out.md": 1,
    "docs/labels.md": 3,
}
RUN_ELSEWHERE = {"ray-data": "tests/ray/test_readme_scale_out.py"}
RUN_HERE: set[str] = set()


def runs(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Marks a test as the one that runs these named blocks."""
    RUN_HERE.update(names)
    return lambda test: test


def src(name: str) -> str:
    return block(name).src


def run_checked(name: str, ns: dict[str, Any], source: str | None = None) -> list[str]:
    b = block(name)
    return _run_checked(b.src if source is None else source, ns, f"{b.doc} ({name})")


AGENTS = [
    "agents-schema",
    "agents-router",
    "agents-tool",
    "agents-guard",
    "agents-cascade",
    "agents-prediction-sets",
    "agents-fitted-cascade",
]


@pytest.mark.parametrize("doc", DOCUMENTS)
def test_every_python_block_of_the_document_is_run(doc):
    python = fences(doc)
    named = [b for b in named_blocks(doc).values() if b.lang == "python"]
    assert len(python) == PYTHON_BLOCKS.get(doc, 0), f"{doc}: {len(python)} Python blocks"
    assert len(named) == len(python), f"{doc}: a Python block without a <!-- block: --> name"
    unrun = [b.name for b in named if b.name not in RUN_HERE | set(RUN_ELSEWHERE)]
    assert unrun == [], f"{doc}: no test runs {unrun}"


def test_block_names_are_unique_and_every_name_a_test_runs_is_in_a_document():
    counts = Counter(b.name for b in all_named_blocks())
    assert [n for n, k in counts.items() if k > 1] == []
    assert sorted((RUN_HERE | set(RUN_ELSEWHERE)) - set(counts)) == []
    assert sum(PYTHON_BLOCKS.values()) == sum(len(fences(doc)) for doc in DOCUMENTS) == 22


def test_printed_numbers_match_to_float_noise_and_nothing_more():
    shown = "{'billing': 0.595776, 'engineering': 0.126916, 'sales': 0.277308}"
    assert same_output("{'billing': 0.595773, 'engineering': 0.126918, 'sales': 0.277309}", shown)
    assert not same_output(
        "{'billing': 0.595676, 'engineering': 0.126916, 'sales': 0.277308}", shown
    )
    assert not same_output("{'billing': 0.5958, 'engineering': 0.126916, 'sales': 0.277308}", shown)
    assert not same_output(
        "{'billing': 0.595776, 'engineering': 0.126916, 'support': 0.277308}", shown
    )
    assert same_output("P2_NORMAL 0.82", "P2_NORMAL 0.81")  # a rounding flip at 2 digits
    assert not same_output("P2_NORMAL 0.83", "P2_NORMAL 0.81")
    assert not same_output("P1_HIGH 0.81", "P2_NORMAL 0.81")


@runs("quick-start", "real-models")
def test_quick_start_runs_as_written(real, monkeypatch):
    ns: dict[str, Any] = {"__name__": "readme"}
    checked = run_checked("quick-start", ns)
    assert len(checked) >= 5
    assert ns["d"].fields["priority"].label in {"P0_CRITICAL", "P1_HIGH", "P2_NORMAL", "P3_LOW"}

    # The "real models" block: each load must be a valid call of the real `Decider.load`.
    signature = inspect.signature(Decider.load.__func__)
    loads: list[inspect.BoundArguments] = []

    def stand_in(cls: type, *args: Any, **kwargs: Any) -> Decider:
        loads.append(signature.bind(cls, *args, **kwargs))
        return real

    monkeypatch.setattr(Decider, "load", classmethod(stand_in))
    run_checked("real-models", ns)
    sources = [b.arguments["source"] for b in loads]
    assert len(sources) == 3
    assert sources[0].endswith(".gguf") and sources[2].endswith(".gguf")
    assert sources[1].startswith("mlx-community/")
    assert loads[2].arguments["calibration"] == "cal.json"
    assert ns["d"].orders == 2


@runs("schemas-intake")
def test_schemas_section_runs_as_written(real):
    ns: dict[str, Any] = {"__name__": "readme", "decider": real}
    checked = run_checked("schemas-intake", ns)
    assert len(checked) == 4
    table = ns["d"].joint[("category", "subcategory")]
    assert sum(table.values()) == pytest.approx(1.0)


@runs("labels-zones", "labels-taxonomy", "labels-ranked")
def test_labels_guide_runs_as_written(real):
    ns: dict[str, Any] = {"__name__": "readme", "decider": real}
    assert len(run_checked("labels-zones", ns)) == 2
    f = ns["f"]
    assert f.search.fallback is False and f.probability_bounds[0] <= f.probability
    assert len(run_checked("labels-taxonomy", ns)) == 3
    f = ns["f"]
    assert (
        abs(f.path[0].probability * f.path[1].probability * f.path[2].probability - f.probability)
        < 1e-9
    )
    assert len(run_checked("labels-ranked", ns)) == 2
    f = ns["f"]  # the chosen labels, most probable first, each over the threshold
    shares = [f.distribution[v] for v in f.value]
    assert shares == sorted(shares, reverse=True) and min(shares) >= f.spec.threshold
    assert f.probability == pytest.approx(sum(shares))


@runs("schemas-free-text")
def test_free_text_section_runs_as_written(real):
    from typing import Literal

    from pydantic import BaseModel, Field

    ns: dict[str, Any] = {
        "__name__": "readme",
        "decider": real,
        "BaseModel": BaseModel,
        "Field": Field,
        "Literal": Literal,
    }
    checked = run_checked("schemas-free-text", ns)
    assert len(checked) == 4
    d = ns["d"]
    assert len(d.value.reasoning) <= 80 and len(d.value.reply_draft) <= 80
    total = d.prefill_ms + d.suffix_eval_ms + d.generate_ms
    assert total == pytest.approx(d.elapsed_ms, rel=0.05)


@runs("pruning")
def test_pruning_section_runs_as_written(real):
    from pydantic import BaseModel, Field

    ns: dict[str, Any] = {"__name__": "readme", "decider": real, "BaseModel": BaseModel}
    ns["Field"] = Field
    checked = run_checked("pruning", ns)
    assert len(checked) == 1
    f = ns["d"].fields["minutes"]
    whole = real.decide(
        ns["Meeting"], "Standup took 15 minutes today.", scoring="constrained", pruning="off"
    )
    lo, hi = f.probability_bounds
    assert lo - 1e-4 <= whole.fields["minutes"].probability <= hi + 1e-4
    assert whole.fields["minutes"].value == f.value


@runs("without-labels")
def test_without_labels_section_runs_as_written(real):
    # the README's quick start defines Triage, decider and tickets; run it on the session's model
    ns: dict[str, Any] = {"__name__": "readme", "real": real}
    quick = src("quick-start").replace("pcd_tools.Decider.load()", "real")
    assert quick != src("quick-start")
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(quick, "README.md (quick-start)", "exec", dont_inherit=True), ns)
    checked = run_checked("without-labels", ns)
    assert len(checked) == 3


@runs(*AGENTS)
@pytest.mark.langchain
def test_agents_section_runs_on_the_embedded_model(real, monkeypatch):
    # `Decider.load()` in the guide is the embedded model; reuse the session's copy.
    monkeypatch.setattr(Decider, "load", classmethod(lambda cls, *a, **k: real))
    ns: dict[str, Any] = {"__name__": "readme"}
    assert list(named_blocks("docs/agents.md")) == AGENTS  # in the guide's order
    for name in AGENTS:
        run_checked(name, ns)
    assert ns["out"]["pcd_decision"]["route"] in {"billing", "engineering", "accounts", "human"}
    assert ns["result"].value.topic in {"payment", "bug", "login"}


@runs("server-typesafe")
@pytest.mark.serve
def test_typesafe_client_block_against_a_live_server(real):
    pytest.importorskip("typesafe_sdk")
    from pcd_tools.serve.app import create_app

    with live_server(create_app(real, api_key="s3cret"), timeout=300) as url:
        source = src("server-typesafe").replace("http://127.0.0.1:8000", url)
        assert source != src("server-typesafe")
        checked = run_checked("server-typesafe", {"__name__": "readme"}, source)
    assert len(checked) == 2


@runs("server-openai-chat")
@pytest.mark.serve
@pytest.mark.langchain
def test_openai_client_block_against_a_live_server(real):
    pytest.importorskip("openai")
    pytest.importorskip("langchain_openai")
    from pcd_tools.serve.app import create_app

    with live_server(create_app(real, api_key="s3cret"), timeout=300) as url:
        source = src("server-openai-chat").replace("http://127.0.0.1:8000", url)
        assert source != src("server-openai-chat")
        checked = run_checked("server-openai-chat", {"__name__": "readme"}, source)
    assert len(checked) == 3


@runs("server-openai-decisions")
@pytest.mark.serve
@pytest.mark.langchain
def test_openai_decisions_block_against_a_live_server(real):
    pytest.importorskip("openai")
    pytest.importorskip("langchain_openai.decisions")
    from pcd_tools.serve.app import create_app

    with live_server(create_app(real, api_key="s3cret"), timeout=300) as url:
        source = src("server-openai-decisions").replace("http://127.0.0.1:8000", url)
        assert source != src("server-openai-decisions")
        ns: dict[str, Any] = {"__name__": "readme"}
        checked = run_checked("server-openai-decisions", ns, source)
    assert len(checked) == 6
    assert [a.type for a in ns["r"].answers] == ["predicate", "choice", "score"]


@runs("mcp-langgraph")
@pytest.mark.mcp
@pytest.mark.langchain
def test_mcp_langgraph_block_starts_pcd_mcp(real):
    # `pcd` is the console script; the test runs the same command through this interpreter.
    source = src("mcp-langgraph").replace(
        '"command": "pcd", "args": ["mcp",',
        f'"command": {sys.executable!r}, "args": ["-m", "pcd_tools", "mcp",',
    )
    assert source != src("mcp-langgraph")
    ns: dict[str, Any] = {"__name__": "readme"}
    checked = run_checked("mcp-langgraph", ns, source)
    assert len(checked) == 2
    d = real.decide(Route, "I was charged twice in March.")
    assert ns["result"]["value"]["team"] == d.value.team


@runs("mcp-python")
@pytest.mark.mcp
def test_mcp_python_block_runs_as_written(real, monkeypatch):
    monkeypatch.setattr(Decider, "load", classmethod(lambda cls, *a, **k: real))
    ns: dict[str, Any] = {"__name__": "readme"}
    assert len(run_checked("mcp-python", ns)) == 1
    assert callable(ns["app"])


@pytest.mark.mcp
@pytest.mark.parametrize("name", ["mcp-config", "mcp-config-readme"])
def test_mcp_client_config_snippet_is_valid_json(name):
    config = block(name)
    assert config.lang == "json"
    servers = json.loads(config.src)["mcpServers"]
    assert servers["pcd"]["command"] == "pcd" and servers["pcd"]["args"][0] == "mcp"
    assert servers["pcd-http"]["url"].endswith("/mcp")
