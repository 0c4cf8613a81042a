from django.apps import AppConfig

from core.metrics import Counter


class MemoryEngineConfig(AppConfig):
    name = "memories.engine"
    label = "memory_engine"
    verbose_name = "Memory engine"
    metrics = (
        Counter("engine_update_runs_total", "Debounced update runs (one extraction each)."),
        Counter("engine_updates_processed_total", "Flushes processed by the update runs."),
        Counter("engine_dreams_total", "Deep Dreams applied."),
        Counter("engine_dream_undos_total", "Deep Dreams undone."),
        Counter("engine_llm_calls_total", "LLM calls of the extraction and the dreams."),
        Counter("engine_llm_tokens_total", "LLM tokens of the extraction and the dreams."),
        Counter("engine_llm_malformed_total", "LLM answers that stayed malformed JSON after a retry."),
        Counter("engine_updates_gated_total", "Flushes done without an extraction: nothing to learn."),
    )  # fmt: skip
    # /healthz sections (core.health.app_health): per owner, how formation goes.
    health_sections = {"formation": "memories.engine.health.formation_health"}

    def ready(self) -> None:
        from core.erasure import everything_flushed, scope_erased
        from memories.engine.erasure import all_files_delete, scope_erase_engine_data

        scope_erased.connect(scope_erase_engine_data, dispatch_uid="engine-scope-erasure")
        everything_flushed.connect(all_files_delete, dispatch_uid="engine-flush")
