from django.apps import AppConfig


class MemoryStoresConfig(AppConfig):
    name = "memories.stores"
    label = "memory_stores"
    verbose_name = "Memory stores"
    key_limits = {"memory_stores": "memories.stores.selectors.memory_stores_not_owned"}
    key_limit_holders = {"memory_stores": "memories.stores.selectors.memory_stores_holding"}
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core.erasure import scope_erased

        # The built-in types register themselves on import; the check registers too.
        from memories.stores import backends, checks  # noqa: F401
        from memories.stores.erasure import scope_erase_store_items

        scope_erased.connect(scope_erase_store_items, dispatch_uid="stores-scope-erasure")
