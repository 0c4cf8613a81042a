from django.apps import AppConfig
from django.db.models.signals import post_migrate

from core.metrics import Counter


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = "Accounts and platform"
    metrics = (
        Counter("usage_deferred_total",
                "Background runs deferred to the next day: their owner's token budget was spent."),
    )  # fmt: skip

    def ready(self) -> None:
        from core import checks  # noqa: F401  (registers system checks)
        from core.schedules import register_schedules
        from core.tracing import tracing_start_from_settings

        tracing_start_from_settings()  # off unless the OTEL_* variables ask for it

        # Once per migrate (the sender filter), after every app's migrations ran.
        post_migrate.connect(register_schedules, sender=self, dispatch_uid="core.schedules")
