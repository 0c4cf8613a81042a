"""The owner in the messages' caller-id key (``docs/scaling.md``: a table distributed by
owner accepts no other unique key). Built concurrently in the database
(``core.row_security.owner_in_unique``); the model's constraint says the same."""

from django.db import migrations, models
from django.db.models import Q

from core.row_security import owner_in_unique

NAME = "message_unique_caller_id"


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("conversations", "0004_summary_plural")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=owner_in_unique(
                NAME,
                "ingestion_message",
                "flow_id, session_id, message_id",
                kind="index",
                where="message_id IS NOT NULL",
            ),
            state_operations=[
                migrations.RemoveConstraint(model_name="message", name=NAME),
                migrations.AddConstraint(
                    model_name="message",
                    constraint=models.UniqueConstraint(
                        fields=["flow", "session_id", "message_id", "owner"],
                        condition=Q(message_id__isnull=False),
                        name=NAME,
                    ),
                ),
            ],
        )
    ]
