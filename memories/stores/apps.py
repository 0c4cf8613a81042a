from django.apps import AppConfig


class MemoryStoresConfig(AppConfig):
    name = "memories.stores"
    label = "memory_stores"
    verbose_name = "Memory stores"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The built-in types register themselves on import; the check registers too.
        from memories.stores import backends, checks  # noqa: F401
