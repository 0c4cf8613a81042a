"""The live worker clusters and the broker rows each claimed, in the database
(``core.worker_claims``): any host's supervisor hands back a dead host's claims once its
cluster stops beating, instead of after ``Q_RETRY``. Two new, empty tables; no owner's
data (row-level security does not apply)."""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('core', '0012_scope_erasures_to_access_events'),
    ]

    operations = [
        migrations.CreateModel(
            name='WorkerCluster',
            fields=[
                ('name', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('host', models.CharField(max_length=255)),
                ('started_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('beat_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                'indexes': [models.Index(fields=['beat_at'], name='core_workercluster_beat')],
            },
        ),
        migrations.CreateModel(
            name='WorkerClaim',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('task_id', models.BigIntegerField(help_text='django_q_ormq.id')),
                ('lock', models.DateTimeField()),
                ('cluster', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='claims', to='core.workercluster')),
            ],
            options={
                'indexes': [models.Index(fields=['task_id'], name='core_workerclaim_task')],
                'constraints': [models.UniqueConstraint(fields=('cluster', 'task_id'), name='one_claim_per_task'), models.CheckConstraint(condition=models.Q(('task_id__gt', 0)), name='claim_task_id')],
            },
        ),
    ]
