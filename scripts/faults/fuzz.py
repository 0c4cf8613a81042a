"""Schemathesis over every operation of /api/schema/, with every check.

Used by ``tests/test_openapi_conformance.py`` (through the WSGI application, in the
test database) and by the fault suite's ``schemathesis`` section (against a served
instance). Each operation gets ``max_examples`` generated requests per mode (positive:
data the schema allows; negative: data it forbids); every answer goes through all of
schemathesis's checks (no 5xx, documented status codes, content types and headers,
bodies matching the documented schemas, valid data accepted (a 400/422 allowed: see
``fuzz``), invalid data rejected, ...). Failures are collected, not raised, so one run reports them all.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi import checks as openapi_checks

# The import endpoint takes JSON Lines (POST /api/v1/import): sent as text is.
schemathesis.serializer.alias("application/x-ndjson", "text/plain")

CHECKS = [
    not_a_server_error,
    openapi_checks.status_code_conformance,
    openapi_checks.content_type_conformance,
    openapi_checks.response_headers_conformance,
    openapi_checks.response_schema_conformance,
    openapi_checks.negative_data_rejection,
    openapi_checks.positive_data_acceptance,
    openapi_checks.missing_required_header,
    openapi_checks.unsupported_method,
    openapi_checks.use_after_free,
    openapi_checks.ensure_resource_availability,
    openapi_checks.ignored_auth,
]


@dataclass
class FuzzReport:
    operations: int = 0
    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: int = 0
    failures: dict[str, set[str]] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)  # a request per failure
    seconds: float = 0.0

    @property
    def failure_count(self) -> int:
        return sum(len(v) for v in self.failures.values())

    def figures(self) -> dict[str, Any]:
        kinds = Counter(
            title.split(":", 1)[0] for titles in self.failures.values() for title in titles
        )
        return {
            "operations": self.operations,
            "requests": self.requests,
            "statuses": dict(sorted(self.statuses.items())),
            "server_errors_5xx_not_503": self.server_errors,
            "unavailable_503": self.statuses.get(503, 0),
            "failures": self.failure_count,
            "failures_by_check": dict(kinds),
            "seconds": round(self.seconds, 1),
        }


def _flat(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, FailureGroup):
        return [e for inner in exc.exceptions for e in _flat(inner)]
    return [exc]


def _titles(exc: BaseException) -> list[str]:
    if isinstance(exc, FailureGroup):
        return [t for inner in exc.exceptions for t in _titles(inner)]
    if isinstance(exc, Failure):
        return [f"{exc.title}: {exc.message.strip().splitlines()[0] if exc.message else ''}"]
    return [f"{type(exc).__name__}: {exc}"]


def fuzz(
    schema: Any,
    *,
    headers: dict[str, str],
    max_examples: int = 10,
    modes: tuple[GenerationMode, ...] = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE),
    base_url: str | None = None,
    seed: int = 14,
    known_ids: dict[str, Any] | None = None,
    known_only: frozenset[str] = frozenset({"DELETE /api/v1/api-keys/{key_id}"}),
) -> FuzzReport:
    """``known_ids`` (path parameter -> an existing object's id) adds a positive pass in
    which every path names existing objects, so success answers get checked too (random
    ids mostly answer 404). Operations in ``known_only`` get that pass alone: random ids
    could name the caller's own key (a served instance's first key is id 1), and
    revoking it would turn every later answer into a 401."""
    report = FuzzReport()
    # "Valid data accepted" allows a 400/422 too: the schema cannot say what the API
    # checks beyond types and bounds (no NUL in any string, "query or vector", "content
    # or messages", chunk_overlap below chunk_size, a store config's own rules).
    # Every other check runs as schemathesis ships it.
    positive = schema.config.checks.positive_data_acceptance
    positive.expected_statuses = [*positive.expected_statuses, "400", "422"]
    # A 503 is a documented answer, not a crash: a provider that is not configured
    # (infer=true without LLM_BASE_URL) or a database outage, with Retry-After.
    server = schema.config.checks.not_a_server_error
    server.expected_statuses = [*server.expected_statuses, "503"]
    started = time.monotonic()
    for result in schema.get_all_operations():
        operation = result.ok()
        report.operations += 1
        for mode in modes if operation.label not in known_only else ():
            _fuzz_operation(operation, mode, headers, max_examples, base_url, seed, report)
        names = {p.name for p in operation.path_parameters}
        if known_ids and names and names <= set(known_ids):
            ids = {name: known_ids[name] for name in names}
            _fuzz_operation(
                operation,
                GenerationMode.POSITIVE,
                headers,
                max_examples,
                base_url,
                seed,
                report,
                ids,
            )
    report.seconds = time.monotonic() - started
    return report


def _fuzz_operation(
    operation: Any,
    mode: GenerationMode,
    headers: dict[str, str],
    max_examples: int,
    base_url: str | None,
    seed: int,
    report: FuzzReport,
    path_parameters: dict[str, Any] | None = None,
) -> None:
    strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters)

    @hypothesis.given(case=strategy)
    @hypothesis.settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @hypothesis.seed(seed)
    def run(case: Any) -> None:
        kwargs = {"base_url": base_url} if base_url else {}
        # The caller's headers (its valid key) replace what was generated: the case says
        # so, or a negative case whose invalid part was only its Authorization header
        # (never sent) would count as invalid data accepted.
        case.headers = {**(case.headers or {}), **headers}
        try:
            response = case.call(headers=headers, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a transport error is a finding too
            report.failures.setdefault(operation.label, set()).add(f"transport: {exc}")
            return
        report.requests += 1
        report.statuses[response.status_code] += 1
        if response.status_code >= 500 and response.status_code != 503:
            report.server_errors += 1
        try:
            case.validate_response(response, checks=CHECKS, headers=headers)
        except (Failure, FailureGroup) as exc:
            for title in _titles(exc):
                title = f"{title} [{mode.value}, {response.status_code}]"
                report.failures.setdefault(operation.label, set()).add(title)
                report.examples.setdefault(
                    f"{operation.label} {title}",
                    f"{' | '.join(str(e).strip() for e in _flat(exc))[:600]}\n"
                    f"    {case.as_curl_command(headers)}\n    -> {response.text[:300]}",
                )

    run()
