# Two commands do all the set-up on a fresh machine:
#   make demo   run the harvester on the embedded default (SQLite + the embedded broker)
#   make test   run lint, docs and the test matrix (tox; environments chosen by .ci/envs)

PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test lint docs clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "pyharvest needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip setuptools wheel
	$(VENV)/bin/python -m pip install --quiet -e '.[test,embedded,postgresql,mysql]'
	@touch $@

demo: $(STAMP)
	$(VENV)/bin/reaper demo $(ARGS)

test: $(STAMP)
	bash .ci/services
	rm -rf .tox/junit
	$(VENV)/bin/tox run -e "$$(bash .ci/envs)" -- $(ARGS)
	$(VENV)/bin/python .ci/summarize.py .tox/junit

clean:
	rm -rf $(VENV) .tox build dist *.egg-info
