from django.apps import AppConfig

from core.metrics import Counter, Gauge
from core.schedules import ScheduleSpec


class FactsConfig(AppConfig):
    name = "memories.facts"
    label = "memories"  # the label (tables, migrations) of its first home, kept
    verbose_name = "Facts"
    schedules = (
        # An import queues the indexer after its commit; this covers a lost queueing.
        ScheduleSpec("index-pending-facts", "memories.facts.tasks.index_pending_facts", "I",
                     minutes=5),
    )  # fmt: skip
    metrics = (
        Gauge("memory_total_count", "Active (scope, fact) links.", "memories.facts.selectors.links_count"),
        Gauge("memory_facts_count", "Stored facts, global memories included.", "memories.facts.selectors.facts_count"),
        Gauge("memory_scopes_count", "Scopes (an end user is the scope [\"user\", <id>]).", "memories.facts.selectors.scopes_count"),
        Gauge("memory_facts_index_pending", "Facts an import wrote, waiting for the background HNSW indexer (searched exactly meanwhile).", "memories.facts.selectors.facts_index_pending_count"),
        Counter("memory_additions_total", "Facts added (extraction, dreams, the APIs, the tools)."),
        Counter("memory_replacements_total", "Facts replaced after a contradiction or refinement."),
        Counter("memory_dedup_total", "Facts not added: the scope holds the same text or meaning."),
        Counter("memory_flipflop_total", "Replacements refused: they would undo a recent replacement without a higher confidence."),
        Counter("memory_evictions_total", "Facts trimmed from a scope full at ENGINE_MAX_FACTS."),
    )  # fmt: skip
