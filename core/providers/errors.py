from __future__ import annotations

from core.errors import ServiceError


class ProviderError(ServiceError):
    """A provider call failed (after retries, where retrying made sense)."""

    status_code = 502
    code = "upstream_error"
    # Set by a call that failed in a way worth another try (a timeout, 429, 5xx), with
    # the delay the provider asked for: ``call_with_retries`` retries it.
    retryable = False
    retry_after: float | None = None


class ProviderNotConfigured(ProviderError):
    """A feature needs a provider that has no configuration; names the variable to set."""

    status_code = 503
    code = "not_configured"

    def __init__(self, variable: str, feature: str):
        self.variable = variable
        self.feature = feature
        super().__init__(
            f"{feature} needs a configured provider: set {variable}.",
            details={"variable": variable},
        )


class ProviderTimeout(ProviderError):
    status_code = 504
    code = "upstream_timeout"


class ProviderRateLimited(ProviderError):
    status_code = 429
    code = "upstream_rate_limited"


class ProviderBadResponse(ProviderError):
    status_code = 502
