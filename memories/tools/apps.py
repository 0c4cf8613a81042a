from django.apps import AppConfig


class MemoryToolsConfig(AppConfig):
    name = "memories.tools"
    label = "memory_tools"
    verbose_name = "Memory tools"
    key_limits = {"tools": "memories.tools.registry.tools_unknown"}
