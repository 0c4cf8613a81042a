from django.apps import AppConfig


class PersonalMemoriesConfig(AppConfig):
    name = "memories.personal"
    label = "memories"  # the label (tables, migrations) of its first home, kept
    verbose_name = "Personal memories"
