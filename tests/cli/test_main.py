"""The `pcd` dispatcher through `main(argv)`: usage errors, help, missing extras, layout."""

from __future__ import annotations

import importlib

import pytest

from pcd_tools.cli import SUBCOMMANDS, build_parser, main
from pcd_tools.errors import InvalidArgumentError

pytestmark = pytest.mark.unit


def test_no_subcommand_is_a_usage_error(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "usage: pcd" in err and "Traceback" not in err


def test_unknown_subcommand_is_a_usage_error(capsys):
    assert main(["no-such-command"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'no-such-command'" in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["serve", "bench"])
def test_subcommand_help(command, capsys):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: pcd {command} [-h] [--model MODEL] [--json]")


def test_subcommands_in_order_with_their_help():
    names = [name for name, _, _ in SUBCOMMANDS]
    assert names == [
        "demo",
        "decide",
        "models",
        "bench",
        "serve",
        "mcp",
        "eval",
        "calibrate",
        "batch",
    ]
    choices = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert list(choices) == names
    for _, module, _ in SUBCOMMANDS:
        mod = importlib.import_module(module)
        assert isinstance(mod.HELP, str) and mod.HELP
        assert callable(mod.add_arguments) and callable(mod.run)


def test_calibration_option_where_today():
    parser = build_parser()
    with_cal = {"demo", "decide", "eval", "serve", "mcp", "batch"}
    choices = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name, sub in choices.items():
        opts = {o for a in sub._actions for o in a.option_strings}
        assert {"--model", "--json"} <= opts, name
        assert ("--calibration" in opts) == (name in with_cal), name


def test_library_error_exits_1(monkeypatch, capsys):
    import pcd_tools.cli.bench as cli_bench

    def boom(args):
        raise InvalidArgumentError("bad thing")

    monkeypatch.setattr(cli_bench, "run", boom)
    assert main(["bench"]) == 1
    assert capsys.readouterr().err == "error: InvalidArgumentError: bad thing\n"


def test_missing_extra_at_run_exits_2(monkeypatch, capsys):
    import pcd_tools.serve

    def no_uvicorn(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'uvicorn'", name="uvicorn")

    monkeypatch.setattr(pcd_tools.serve, "serve", no_uvicorn)
    assert main(["serve", "--port", "1"]) == 2
    assert capsys.readouterr().err == (
        "error: `pcd serve` needs 'uvicorn'; install it with `pip install 'pcd-tools[serve]'`.\n"
    )


def test_missing_extra_at_import_is_listed_and_exits_2(monkeypatch, capsys):
    real = importlib.import_module

    def fake(name, *args, **kwargs):
        if name == "pcd_tools.cli.serve":
            raise ModuleNotFoundError("No module named 'fastapi'", name="fastapi")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", fake)
    assert main(["--help"]) == 0
    assert "(unavailable: fastapi not installed)" in capsys.readouterr().out
    assert main(["serve"]) == 2
    assert "pip install 'pcd-tools[serve]'" in capsys.readouterr().err


def test_serve_refuses_bad_options_before_loading(monkeypatch, capsys):
    monkeypatch.delenv("PCD_API_KEY", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--port", "1"]) == 2
    assert "refusing to bind '0.0.0.0' without an API key" in capsys.readouterr().err
    assert main(["serve", "--max-queue", "0"]) == 2
    assert capsys.readouterr().err == "error: --max-queue must be >= 1; got 0.\n"
