"""Typed readers for environment variables that fail loudly on bad values.

Settings read every knob through these helpers so that a typo such as
``EMBEDDING_DIMENSIONS=38a`` stops the process at start-up with a message that
names the variable, instead of surfacing later as a confusing runtime error.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from typing import Any


class EnvError(ValueError):
    pass


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise EnvError(f"{name} must be a boolean (true/false/1/0), got {raw!r}")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise EnvError(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise EnvError(f"{name} must be >= {minimum}, got {value}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise EnvError(f"{name} must be a number, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise EnvError(f"{name} must be >= {minimum}, got {value}")
    return value


# A memory size the database server takes: a bare number means bytes to pg_size_bytes but
# 8kB pages to the server, so a unit is required.
SIZE_WITH_UNIT = re.compile(r"\d+(kB|MB|GB|TB)")


def env_size(name: str, default: str) -> str:
    """A memory size for the database server, with its unit (``512MB``: SIZE_WITH_UNIT)."""
    value = (os.environ.get(name) or default).strip()
    if not SIZE_WITH_UNIT.fullmatch(value):
        raise EnvError(
            f"{name} must be a size with a unit (kB, MB, GB, TB), e.g. 512MB, got {value!r}"
        )
    return value


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = os.environ.get(name) or default
    if value not in choices:
        raise EnvError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [part.strip() for part in raw.split(",") if part.strip()]


def read_env_file(text: str) -> dict[str, str]:
    """``KEY=value`` lines of a ``.env`` file (as docker compose reads one): blank lines
    and ``#`` comments skipped, an optional ``export``, values optionally in single or
    double quotes (kept as written inside; a comment may follow them), an unquoted
    value's comment (from a ``#`` after white space) dropped.
    A line that is none of these is an ``EnvError`` naming it."""
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").lstrip()
        name, sep, value = line.partition("=")
        name = name.strip()
        if not sep or not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise EnvError(f".env line {number} is not NAME=value: {raw!r}")
        values[name] = _env_value(value, number, raw)
    return values


def _env_value(text: str, number: int, raw: str) -> str:
    """A line's value (``text``: all after ``=``): in quotes, what they hold (a comment
    may follow them); else the text before a comment, which starts at a ``#`` after
    white space (``NAME=   # a note`` is empty, as ``.env.example`` writes its blank
    settings; ``NAME=#abc`` is ``#abc``)."""
    if re.match(r"\s+#", text):
        return ""
    value = text.strip()
    if value[:1] in ("'", '"'):
        end = value.find(value[0], 1)
        rest = value[end + 1 :].strip() if end > 0 else "?"
        if end < 0 or (rest and not rest.startswith("#")):
            raise EnvError(f".env line {number}: a quoted value must end its line: {raw!r}")
        return value[1:end]
    return re.split(r"\s#", value, maxsplit=1)[0].rstrip()


def load_env_file(path: str) -> list[str]:
    """Set the variables of the ``.env`` file at ``path`` that the environment does not
    set already (the environment wins); the names set. No file: nothing."""
    try:
        with open(path, encoding="utf-8") as fh:
            values = read_env_file(fh.read())
    except FileNotFoundError:
        return []
    loaded = [name for name in values if name not in os.environ]
    for name in loaded:
        os.environ[name] = values[name]
    return loaded


# Django's PostgreSQL backend with the owner settings of row-level security
# (core.db_backend; it starts the embedded server only for an entry that asks for it).
ENGINE = "core.db_backend"


def owner_credentials(url: str, *, name: str = "DATABASE_OWNER_URL") -> dict[str, str]:
    """The ``OWNER_USER`` / ``OWNER_PASSWORD`` of a database entry, from the user and
    password of ``url`` (empty: none, the entry's own role owns the tables)."""
    if not url:
        return {}
    userinfo, at, _ = urllib.parse.urlsplit(url).netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    if not at or not user:
        raise EnvError(f"{name} must name the tables' owner: postgresql://user:password@...")
    return {
        "OWNER_USER": urllib.parse.unquote(user),
        "OWNER_PASSWORD": urllib.parse.unquote(password),
    }


def database_from_url(url: str, *, conn_max_age: int, name: str = "DATABASE_URL") -> dict[str, Any]:
    """Django's ``DATABASES`` entry for ``DATABASE_URL``. libpq's multi-host form
    (``postgresql://user:pw@h1:5432,h2:5433/db?target_session_attrs=read-write``, which
    ``dj-database-url`` cannot parse) is read here: ``HOST`` and ``PORT`` become libpq's
    comma-separated lists (a host may be a percent-encoded socket directory), the query's
    parameters connection options, so a connection goes to whichever listed server answers
    as asked (after a failover, the promoted one). Any other URL: ``dj-database-url``."""
    import dj_database_url

    parts = urllib.parse.urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if "," not in hosts:
        try:
            return dict(dj_database_url.parse(url, conn_max_age=conn_max_age, engine=ENGINE))
        except ValueError as exc:  # (its errors name no variable: UnknownSchemeError...)
            raise EnvError(f"{name} is not a database URL ({exc})") from None
    if parts.scheme not in ("postgres", "postgresql"):
        raise EnvError(f"{name} with several hosts must be postgresql://, not {parts.scheme}://")
    names, ports = [], []
    for entry in hosts.split(","):
        host, colon, port = entry.rpartition(":") if not entry.endswith("]") else (entry, "", "")
        if not colon:
            host, port = entry, ""
        if not host or (port and not port.isdigit()):
            raise EnvError(f"{name}: {entry!r} is not host[:port]")
        names.append(urllib.parse.unquote(host).removeprefix("[").removesuffix("]"))
        ports.append(port or "5432")
    user, _, password = userinfo.partition(":") if at else ("", "", "")
    options = {k: v for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)}
    return {
        "ENGINE": ENGINE,
        "NAME": urllib.parse.unquote(parts.path.lstrip("/")),
        "USER": urllib.parse.unquote(user),
        "PASSWORD": urllib.parse.unquote(password),
        "HOST": ",".join(names),
        "PORT": ",".join(ports),
        "CONN_MAX_AGE": conn_max_age,
        "OPTIONS": options,
    }


_MEMORY_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def usable_memory(limits: tuple[str, ...] = _MEMORY_LIMITS) -> int:
    """Bytes of memory this process may use: the machine's, or its container's limit
    (cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``) when that is lower; 4 GiB
    where the system does not say (no ``sysconf``)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        total = 4 * 2**30
    for path in limits:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():  # ("max": no limit)
            total = min(total, int(text))
    return total


def shared_buffers_for(memory: int) -> str:
    """The embedded server's ``shared_buffers`` on ``memory`` bytes: a quarter of it (what
    PostgreSQL advises for a server of its own), from 128MB to 8GB. The HNSW index of a
    million chunks of 384 dimensions is 1.1 GB: with 1GB its walks read pages from the OS
    cache at every search (BENCHMARKS.md, "A million chunks: no parallel workers")."""
    megabytes = memory // 4 // 2**20
    return f"{min(max(megabytes, 128), 8192)}MB"
