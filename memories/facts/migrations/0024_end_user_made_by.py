"""``made_by`` on a scope: the chat request that made an end user and may yet fail, so
it takes back only an end user it made and nobody else has used since
(``memories.facts.scopes.end_user_unmake``). A nullable column with no default: no
rewrite of the table, a catalogue change only."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("memories", "0023_fact_half_plain")]

    operations = [
        migrations.AddField(
            model_name="scope",
            name="made_by",
            field=models.UUIDField(blank=True, editable=False, null=True),
        ),
    ]
