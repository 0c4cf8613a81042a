"""Local settings in one place every process reads (issue 26): the project's ``.env``
(or ``MEMORY_ENV_FILE``), read by every ``manage.py`` command and ``make run``; a
variable of the environment wins over the file's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memoryproject.env import EnvError, read_env_file

ROOT = Path(__file__).resolve().parents[2]
READ = "from django.conf import settings; print(settings.API_THROTTLE_RATE, settings.LOG_LEVEL)"


def test_the_file_is_read_as_docker_compose_reads_it():
    text = (
        "# a comment\n\n"
        "API_THROTTLE_RATE=7/minute   # an inline comment\n"
        "export LOG_LEVEL=WARNING\n"
        "ADMIN_PASSWORD='s3cret # with a hash'\n"
        'LLM_MODEL="qwen 2.5"\n'
        "EMPTY=\n"
    )
    assert read_env_file(text) == {
        "API_THROTTLE_RATE": "7/minute", "LOG_LEVEL": "WARNING",
        "ADMIN_PASSWORD": "s3cret # with a hash", "LLM_MODEL": "qwen 2.5", "EMPTY": "",
    }  # fmt: skip
    with pytest.raises(EnvError, match="line 2"):
        read_env_file("A=1\nnot a setting\n")


def _command(tmp_path: Path, env_file: str | None, **extra: str) -> str:
    env = {k: v for k, v in os.environ.items()
           if k not in {"TESTING", "DJANGO_SETTINGS_MODULE", "MEMORY_ENV_FILE",
                        "API_THROTTLE_RATE", "LOG_LEVEL"}}  # fmt: skip
    if env_file is not None:
        env["MEMORY_ENV_FILE"] = env_file
    env.update(extra)
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", READ], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip().splitlines()[-1]


def test_a_management_command_reads_the_file_and_the_environment_wins(tmp_path):
    local = tmp_path / ".env"
    local.write_text("API_THROTTLE_RATE=7/minute\nLOG_LEVEL=WARNING\n")
    assert _command(tmp_path, str(local)) == "7/minute WARNING"
    assert _command(tmp_path, str(local), LOG_LEVEL="ERROR") == "7/minute ERROR"
    assert _command(tmp_path, "") == "6000/minute INFO"  # no file
    assert _command(tmp_path, str(tmp_path / "missing.env")) == "6000/minute INFO"


def test_blank_settings_with_a_note_are_blank_and_quotes_may_carry_a_note():
    """``NAME=   # a note`` is how ``.env.example`` writes its blank settings: the note
    was read as the value (the admin password among them), as was a quoted value's
    quotes when a note followed them."""
    text = 'A=   # a note\nB="quoted"  # a note\nC=value # a note\nD=a#b\nE=v\t# tab\nF=#s3cret\n'
    assert read_env_file(text) == {
        "A": "", "B": "quoted", "C": "value", "D": "a#b", "E": "v", "F": "#s3cret"
    }  # fmt: skip
    with pytest.raises(EnvError, match="line 1: a quoted value must end its line"):
        read_env_file('F="open\n')


def test_the_example_file_copied_as_it_is_gives_the_defaults(tmp_path):
    """The README and docs/operations.md say: copy .env.example to .env. Every command
    then failed (DATABASE_REPLICA_URLS read as its note)."""
    values = read_env_file((ROOT / ".env.example").read_text())
    assert [name for name, value in values.items() if "#" in value] == []
    env = {k: v for k, v in os.environ.items()
           if k not in {"TESTING", "DJANGO_SETTINGS_MODULE"} and k not in values}  # fmt: skip
    env["MEMORY_ENV_FILE"] = str(ROOT / ".env.example")
    read = ("import os; from django.conf import settings; print(repr((os.environ["
            "'ADMIN_PASSWORD'], settings.LLM_BASE_URL, settings.METRICS_TOKEN, "
            "settings.EMBEDDING_DIMENSIONS)))")  # fmt: skip
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "shell", "-c", read], cwd=tmp_path,
                          env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "('', '', '', 384)"


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("EMBEDDING_DIMENSIONS", "38a", "EMBEDDING_DIMENSIONS must be an integer, got '38a'"),
        ("API_THROTTLE_CACHE", "nope",
         "API_THROTTLE_CACHE must be one of default, throttle, got 'nope'"),
        ("DATABASE_URL", "notaurl", "DATABASE_URL is not a database URL (Scheme '://' is"),
        # (a logging ValueError that did not name it; the size, after a traceback)
        ("LOG_LEVEL", "bogus",
         "LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got 'BOGUS'"),
        ("EMBEDDED_DB_SHARED_BUFFERS", "lots", "EMBEDDED_DB_SHARED_BUFFERS must be a size with "
         "a unit (kB, MB, GB, TB), e.g. 512MB, got 'lots'"),
    ],
)  # fmt: skip
def test_a_bad_setting_stops_a_command_with_one_line_naming_it(tmp_path, name, value, said):
    """A bad value was a 30-line traceback (and DATABASE_URL's did not name it); an
    unknown API_THROTTLE_CACHE passed start-up, then every API request was a 500."""
    env = {k: v for k, v in os.environ.items() if k not in {"TESTING", "DJANGO_SETTINGS_MODULE"}}
    env.update({"MEMORY_ENV_FILE": "", name: value})
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.startswith(f"configuration error: {said}")
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_bad_port_stops_serve_even_its_help_with_one_line():
    """``PORT=abc manage.py serve --help`` was an int() traceback that did not name PORT."""
    env = {k: v for k, v in os.environ.items() if k not in {"TESTING", "DJANGO_SETTINGS_MODULE"}}
    env.update({"MEMORY_ENV_FILE": "", "PORT": "abc"})
    done = subprocess.run([sys.executable, "manage.py", "serve", "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (done.returncode, done.stderr) == (1, "configuration error: PORT must be an integer, "
                                                 "got 'abc'\n")  # fmt: skip


def test_a_database_that_cannot_be_reached_is_said_in_one_line():
    """A command with the database down was a 40-line OperationalError traceback."""
    env = {k: v for k, v in os.environ.items() if k not in {"TESTING", "DJANGO_SETTINGS_MODULE"}}
    env.update({"MEMORY_ENV_FILE": "", "DATABASE_URL": "postgres://u:p@127.0.0.1:9/db"})
    done = subprocess.run([sys.executable, "manage.py", "create_api_key", "someone"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        'database connection failed: connection to server at "127.0.0.1", port 9 '
        "failed: Connection refused (is the server running? DATABASE_URL)"
    )
    # --traceback still shows where
    done = subprocess.run([sys.executable, "manage.py", "create_api_key", "someone", "--traceback"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1 and "Traceback" in done.stderr


def test_a_relative_data_directory_is_the_projects_whatever_the_current_one(tmp_path):
    """``MEMORY_DATA_DIR=.data`` (.env.example's) was taken against the current directory:
    a desktop client starting ``manage.py mcp`` from elsewhere made a second data
    directory (a new secret key, a second empty database) there."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    relative = os.path.relpath(tmp_path / "data", ROOT)  # relative, to the project
    env = {k: v for k, v in os.environ.items() if k not in {"TESTING", "DJANGO_SETTINGS_MODULE"}}
    env.update({"MEMORY_ENV_FILE": "", "MEMORY_DATA_DIR": relative, "MEDIA_ROOT": "",
                "SECRET_KEY": "", "PYTHONPATH": str(ROOT)})  # fmt: skip
    read = "from django.conf import settings; print(settings.DATA_DIR, settings.MEDIA_ROOT)"
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "shell", "-c", read],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60,
                          check=True)  # fmt: skip
    data_dir, media = (Path(p).resolve() for p in done.stdout.strip().splitlines()[-1].split())
    real = (tmp_path / "data").resolve()
    assert (data_dir, media) == (real, real / "media")
    assert (tmp_path / "data" / "secret_key").exists() and not any(elsewhere.iterdir())


def test_embedded_db_status_reports_a_stopped_server_and_starts_none(tmp_path):
    """``status`` ran what ``start`` runs: it started a stopped server (undoing a
    ``make db-stop`` before a cold copy) and never said "not running"."""
    env = {k: v for k, v in os.environ.items() if k not in {"TESTING", "DJANGO_SETTINGS_MODULE"}}
    env.update({"MEMORY_ENV_FILE": "", "MEMORY_DATA_DIR": str(tmp_path),
                "DATABASE_URL": "", "EMBEDDED_DB_NAME": "memory"})  # fmt: skip
    done = subprocess.run([sys.executable, "manage.py", "embedded_db", "status"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (done.returncode, done.stderr.strip()) == (1, "CommandError: not running")
    assert not (tmp_path / "pgdata").exists()


def _manage():
    """manage.py as a module (it is a script, not a package's)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("manage_py", ROOT / "manage.py")
    assert spec and spec.loader
    manage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(manage)
    return manage


def test_a_missing_service_role_is_said_with_what_to_do():
    """``migrate`` with DATABASE_OWNER_URL before the service's role exists ended in
    ``ProgrammingError: role "app2" does not exist`` (a traceback); any other error
    keeps its traceback."""
    from django.db import ProgrammingError

    said = _manage()._operator_message(ProgrammingError('role "app2" does not exist'))
    assert said == (
        "database error: the service's role 'app2' does not exist: make it first (manage.py "
        "ensure_service_role, as a role that may create roles; docs/operations.md, "
        "'Row-level security')"
    )
    assert _manage()._operator_message(ProgrammingError('relation "x" does not exist')) is None
    assert _manage()._operator_message(ValueError("anything")) is None


def test_connection_failures_say_which_in_one_line():
    """A host that does not resolve kept its traceback; a refused password was said to be
    a server not running."""
    from django.db import OperationalError

    said = _manage()._operator_message
    dns = OperationalError(
        "failed to resolve host 'db.invalid': [Errno -2] Name or service not known"
    )
    assert said(dns) == ("database connection failed: failed to resolve host 'db.invalid': "
                         "[Errno -2] Name or service not known (DATABASE_URL's host)")  # fmt: skip
    password = OperationalError('connection failed: connection to server at "10.0.0.5", port '
                                '5432 failed: FATAL:  password authentication failed for user "u"')  # fmt: skip
    assert said(password) == (
        'database connection failed: connection to server at "10.0.0.5", port 5432 failed: '
        'FATAL:  password authentication failed for user "u" (DATABASE_URL)'
    )
    assert said(OperationalError("could not serialize access")) is None
