from django.apps import AppConfig
from django.db.models.signals import post_migrate

from core.metrics import Counter


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = "Accounts and platform"
    health_sections = {"row_security": "core.row_security.row_security_health"}
    metrics = (
        Counter("usage_deferred_total",
                "Background runs deferred to the next day: their owner's token budget was spent."),
    )  # fmt: skip

    def ready(self) -> None:
        from core import checks  # noqa: F401  (registers system checks)
        from core.schedules import register_schedules
        from core.tracing import tracing_start_from_settings

        tracing_start_from_settings()  # off unless the OTEL_* variables ask for it

        from django_q.signals import post_execute_in_worker, pre_execute

        from core.queue import task_ended, task_started

        # Each task runs as its owner, its maintenance bypass, or nobody (core.tenancy).
        pre_execute.connect(task_started, dispatch_uid="core.tenancy.task_started")
        post_execute_in_worker.connect(task_ended, dispatch_uid="core.tenancy.task_ended")

        from core.erasure import scope_erased
        from core.usage import scope_erase_usage

        scope_erased.connect(scope_erase_usage, dispatch_uid="usage-scope-erasure")

        # Once per migrate (the sender filter), after every app's migrations ran.
        post_migrate.connect(register_schedules, sender=self, dispatch_uid="core.schedules")
