from django.apps import AppConfig


class MemoryBasesConfig(AppConfig):
    name = "memories.bases"
    label = "memory_bases"
    verbose_name = "Memory bases"
