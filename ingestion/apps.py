from django.apps import AppConfig

from core.schedules import ScheduleSpec


class IngestionConfig(AppConfig):
    name = "ingestion"
    verbose_name = "Ingestion pipelines"
    schedules = (
        ScheduleSpec("node-memory-cleanup", "ingestion.tasks.node_memory_cleanup", "D"),
        ScheduleSpec(
            "memory-base-jobs-sweep", "ingestion.tasks.memory_base_jobs_sweep", "I", minutes=5
        ),
        ScheduleSpec(
            "engine-updates-sweep", "ingestion.tasks.engine_updates_sweep", "I", minutes=1
        ),
        ScheduleSpec("engine-dreams", "ingestion.tasks.engine_dreams_daily", "D"),
    )

    def ready(self) -> None:
        from core.erasure import scope_erased
        from ingestion.erasure import scope_erase_queued_turns

        scope_erased.connect(scope_erase_queued_turns, dispatch_uid="queue-scope-erasure")
