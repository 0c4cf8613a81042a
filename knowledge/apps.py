from django.apps import AppConfig

from core.metrics import Gauge
from core.schedules import ScheduleSpec


class KnowledgeConfig(AppConfig):
    name = "knowledge"
    verbose_name = "Knowledge bases"
    schedules = (
        # Ingestion queues the indexer after each commit; this covers a lost queueing
        # or a worker that died mid-run.
        ScheduleSpec(
            "index-pending-chunks", "knowledge.tasks.index_pending_chunks", "I", minutes=5
        ),
        ScheduleSpec("ingest-jobs-sweep", "knowledge.tasks.ingest_jobs_sweep", "I", minutes=5),
    )
    key_limits = {"knowledge_bases": "knowledge.selectors.knowledge_bases_not_owned"}
    metrics = (
        Gauge(
            "knowledge_chunks_index_pending",
            "Chunks waiting for the background HNSW indexer (searched exactly meanwhile).",
            "knowledge.services.knowledge_pending_count",
        ),
    )

    def ready(self) -> None:
        from knowledge import checks  # noqa: F401  (registers system checks)
