from __future__ import annotations


class ProviderError(RuntimeError):
    """A provider call failed (after retries, where retrying made sense)."""

    status_code = 502


class ProviderNotConfigured(ProviderError):
    """A feature needs a provider that has no configuration; names the variable to set."""

    status_code = 503

    def __init__(self, variable: str, feature: str):
        self.variable = variable
        self.feature = feature
        super().__init__(f"{feature} needs a configured provider: set {variable}.")


class ProviderTimeout(ProviderError):
    status_code = 504


class ProviderRateLimited(ProviderError):
    status_code = 429


class ProviderBadResponse(ProviderError):
    status_code = 502
