"""Four indexes every fact write paid for and no read needs: the foreign-key indexes
Django made on ``memories_fact.owner_id`` (``fact_owner_normalized`` leads with it),
``memories_factlink.scope_id`` (the primary key leads with it) and ``.fact_id``
(``factlink_fact`` is the same index), and ``memories_factchange.scope_id``
(``factchange_scope_time`` leads with it). ``DROP INDEX``: no table is rewritten."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('memories', '0014_fact_tokens'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name='fact',
            name='owner',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AlterField(
            model_name='factchange',
            name='scope',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='changes', to='memories.scope'),
        ),
        migrations.AlterField(
            model_name='factlink',
            name='fact',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='links', to='memories.fact'),
        ),
        migrations.AlterField(
            model_name='factlink',
            name='scope',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='links', to='memories.scope'),
        ),
    ]
