"""The owner in every unique key of the memory stores' tables (``docs/scaling.md``: a
table distributed by owner accepts no other; ``core.row_security.owner_in_unique``).
The models keep declaring the keys without it: ``owner_id`` is not a field of the
items and attachments (a trigger fills it), and a store's knowledge base is a
one-to-one field. The owner follows from the key's parent: the same rows are refused."""

from django.db import migrations

from core.row_security import owner_in_unique


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("memory_stores", "0006_owner_columns")]

    operations = [
        *owner_in_unique(
            "memory_stores_memorystore_knowledge_base_id_key",
            "memory_stores_memorystore",
            "knowledge_base_id",
        ),
        *owner_in_unique(
            "memoryitem_unique_summary", "memory_stores_memoryitem", "store_id, summary_hash"
        ),
        *owner_in_unique(
            "memoryattachment_unique_store",
            "memory_stores_memoryattachment",
            "flow_id, node_id, store_id",
        ),
    ]
