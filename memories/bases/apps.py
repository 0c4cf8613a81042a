from django.apps import AppConfig


class MemoryBasesConfig(AppConfig):
    name = "memories.bases"
    label = "memory_bases"
    verbose_name = "Memory bases"
    key_limits = {"memory_bases": "memories.bases.selectors.memory_bases_not_owned"}
    key_limit_holders = {"memory_bases": "memories.bases.selectors.memory_bases_holding"}

    def ready(self) -> None:
        from core.erasure import scope_erased
        from memories.bases.erasure import scope_erase_memory_base_chats

        scope_erased.connect(scope_erase_memory_base_chats, dispatch_uid="bases-scope-erasure")
