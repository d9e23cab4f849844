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
    "Labels",
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


def test_loading_a_gguf_model_never_imports_transformers():
    # mlx-lm's package __init__ imports its loader and generation, and with them
    # transformers (1.5-3 s of a 2-core load); a GGUF model needs mlx-lm's model modules only.
    code = (
        "import sys\n"
        "from pcd_tools import Decider\n"
        "d = Decider.load()\n"
        "assert d.decide({'ok': {'type': 'boolean'}}, 'fine').fields['ok'].value in (True, False)\n"
        "print('transformers' in sys.modules, type(sys.modules['mlx_lm']).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "_DeferredPackage"]


def test_mlx_lm_imported_after_a_gguf_load_is_the_whole_package():
    code = (
        "import sys\n"
        "from pcd_tools._lazy import mlx_lm_module\n"
        "qwen2 = mlx_lm_module('models.qwen2')\n"
        "assert 'transformers' not in sys.modules\n"
        "import mlx_lm, mlx_lm.models.qwen2\n"
        "from mlx_lm import generate, load\n"
        "from mlx_lm.utils import load as load2\n"
        "assert load is load2 and callable(generate)\n"
        "assert mlx_lm.models.qwen2 is qwen2 is sys.modules['mlx_lm.models.qwen2']\n"
        "assert mlx_lm.__version__ and type(mlx_lm).__name__ == 'module'\n"
        "print('transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
