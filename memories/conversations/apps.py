from django.apps import AppConfig


class ConversationsConfig(AppConfig):
    name = "memories.conversations"
    label = "conversations"
    verbose_name = "Conversations and node memory"
    key_limits = {"flows": "memories.conversations.selectors.flows_not_owned"}
    default_auto_field = "django.db.models.BigAutoField"
