from django.apps import AppConfig


class MemoryEngineConfig(AppConfig):
    name = "memories.engine"
    label = "memory_engine"
    verbose_name = "Memory engine"
    # /healthz sections (core.health.app_health): per owner, how formation goes.
    health_sections = {"formation": "memories.engine.health.formation_health"}

    def ready(self) -> None:
        from core.erasure import scope_erased
        from memories.engine.erasure import scope_erase_engine_data

        scope_erased.connect(scope_erase_engine_data, dispatch_uid="engine-scope-erasure")
