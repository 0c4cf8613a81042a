from django.apps import AppConfig


class ConversationsConfig(AppConfig):
    name = "memories.conversations"
    label = "conversations"
    verbose_name = "Conversations and node memory"
    default_auto_field = "django.db.models.BigAutoField"
