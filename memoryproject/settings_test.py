"""Test settings: sealed providers, whatever the developer's shell exports.

Environment variables are forced before the main settings read them, so a local
``LLM_BASE_URL`` or ``EMBEDDING_PROVIDER`` never reaches a test.
"""

import os

os.environ["TESTING"] = "1"
# No .env file: a developer's local settings never reach a test, nor the processes the
# tests start (they inherit this).
os.environ["MEMORY_ENV_FILE"] = ""
os.environ["EMBEDDING_PROVIDER"] = "hashing"
for _name in (
    "EMBEDDING_BASE_URL",
    "EMBEDDING_API_KEY",
    "EMBEDDING_MODEL",
    "EMBEDDING_DIMENSIONS",
    "LLM_BASE_URL",
    "LLM_API_KEY",
    "LLM_MODEL",
):
    os.environ.pop(_name, None)
# Live-server threads must not keep connections open past a request (the test
# database could not be dropped at the end of the run).
os.environ["CONN_MAX_AGE"] = "0"
# The suite runs on two test processes beside PostgreSQL on two cores: numpy's BLAS
# threads (one per core in each process, spinning while they wait) only fight over them
# (the local model's tests took 2.3x as long). Read when numpy is first imported, which
# the apps do after these settings.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from memoryproject.settings import *  # noqa: E402,F403

# `manage.py serve`, which process tests start beside the in-process tests, rewrites
# STATIC_ROOT (collectstatic); WhiteNoise indexes STATIC_ROOT when a test first builds the
# middleware, and met files being replaced (FileNotFoundError). The in-process tests get a
# directory nobody writes (WhiteNoise serves them from the finders).
STATIC_ROOT = BASE_DIR / "test-artifacts" / "static-root"  # noqa: F405
STATIC_ROOT.mkdir(parents=True, exist_ok=True)

# Provider retries wait 0.5 s, doubling (a constant, not a variable): the tests of
# timeouts, 429 and 5xx wait 10 ms instead (they spent 30 s of the suite asleep).
RETRY_BACKOFF_SECONDS = 0.01
