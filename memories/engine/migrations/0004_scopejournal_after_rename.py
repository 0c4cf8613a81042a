"""``ScopeJournal`` back, a proxy of ``memories.Scope`` (see 0003)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("memory_engine", "0003_scopejournal_before_rename"),
        ("memories", "0012_rename_facts"),
    ]

    operations = [
        migrations.CreateModel(
            name="ScopeJournal",
            fields=[],
            options={
                "verbose_name": "scope journal",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("memories.scope",),
        ),
    ]
