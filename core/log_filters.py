"""Logging filters the settings attach (``LOGGING``)."""

from __future__ import annotations

import logging


class ServiceUnavailableIsAWarning(logging.Filter):
    """``django.request`` logs every 5xx answer at ERROR. A 503 here is always one the
    service chose (no LLM configured, the database restarting, a provider down: the
    ``ServiceError`` family, answered in the JSON error shape), not a failure of the
    code: it is logged at WARNING. An unexpected exception is a 500 and stays an ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "status_code", None) == 503 and record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True
