"""The public surface is small, pinned, and cheap to import."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pcd_tools

pytestmark = pytest.mark.unit

EXPECTED_ALL = [
    "ContextTooLongError",
    "Decider",
    "Decision",
    "FieldDefinition",
    "FieldResult",
    "ModelLoadError",
    "PcdToolsError",
    "SchemaError",
    "StructuredSchema",
    "decision",
    "run_parallel_generation",
]


def test_all_is_pinned():
    assert sorted(pcd_tools.__all__) == sorted(EXPECTED_ALL)


def test_every_public_name_resolves_and_comes_from_a_public_module():
    for name in pcd_tools.__all__:
        obj = getattr(pcd_tools, name)
        module = getattr(obj, "__module__", "")
        assert module.startswith("pcd_tools."), (name, module)
        assert not any(part.startswith("_") for part in module.split(".")), (name, module)


def test_unknown_attribute_raises_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        pcd_tools.nope  # noqa: B018


def test_import_is_light():
    code = (
        "import sys, pcd_tools\n"
        "heavy = [m for m in ('mlx', 'mlx.core', 'mlx_lm', 'langchain_core', 'langgraph', 'fastapi', "
        "'uvicorn', 'numpy', 'transformers') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_cli_import_is_light():
    code = (
        "import sys; from pcd_tools.cli import build_parser; build_parser()\n"
        "heavy = [m for m in ('mlx', 'mlx.core', 'langchain_core', 'fastapi', 'uvicorn', 'matplotlib') "
        "if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_errors_follow_the_builtin_mixins():
    from pcd_tools import errors

    assert issubclass(errors.UnsupportedFieldError, TypeError)
    assert issubclass(errors.TooManyChoicesError, ValueError)
    assert issubclass(errors.ContextTooLongError, ValueError)
    assert issubclass(errors.InvalidContextError, TypeError)
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.PcdToolsError)
