"""The owner in every unique key of the memory bases' tables (``docs/scaling.md``: a
table distributed by owner accepts no other; ``core.row_security.owner_in_unique``).
The models keep declaring the keys without it: ``owner_id`` is not a field of the
sessions and jobs (a trigger fills it), and a memory base's knowledge base is a
one-to-one field. The owner follows from the key's parent: the same rows are refused."""

from django.db import migrations

from core.row_security import owner_in_unique


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("memory_bases", "0005_owner_columns")]

    operations = [
        *owner_in_unique(
            "ingestion_memorybase_knowledge_base_id_key",
            "ingestion_memorybase",
            "knowledge_base_id",
        ),
        *owner_in_unique(
            "mbsession_unique", "ingestion_memorybasesession", "memory_base_id, session_id"
        ),
        *owner_in_unique(
            "ingestionjob_one_active_per_session",
            "ingestion_ingestionjob",
            "session_id",
            kind="index",
            where="status IN ('queued', 'running')",
        ),
    ]
