from django.apps import AppConfig


class MemoryEngineConfig(AppConfig):
    name = "memories.engine"
    label = "memory_engine"
    verbose_name = "Memory engine"
