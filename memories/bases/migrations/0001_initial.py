"""MemoryBase, MemoryBaseSession and MemoryBaseJob (was ingestion.IngestionJob), moved
from ingestion: the state only; the ingestion_* tables were created there."""

import django.db.models.deletion
import uuid
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('ingestion', '0003_job_attempts'),
        ('conversations', '0001_initial'),
        ('knowledge', '0008_job_lifecycle_status'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    # The tables stay where they are (their db_table names are kept): only Django's
    # idea of which app owns the models changes.
    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.CreateModel(
                    name='MemoryBase',
                    fields=[
                        ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ('name', models.CharField(max_length=200)),
                        ('threshold', models.PositiveIntegerField(default=10)),
                        ('kb_name', models.CharField(max_length=200)),
                        ('auto_capture', models.BooleanField(default=True)),
                        ('preprocess', models.BooleanField(default=False, help_text='Let an LLM distil each batch first.')),
                        ('preprocess_model', models.CharField(blank=True, default='', max_length=200)),
                        ('preprocess_instructions', models.TextField(blank=True, default='')),
                        ('preprocess_kill_phrase', models.CharField(blank=True, default='', help_text='If the LLM answers with this phrase, store nothing but advance the cursor.', max_length=200)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('flow', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='memory_bases', to='conversations.flow')),
                        ('knowledge_base', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='memory_base', to='knowledge.knowledgebase')),
                        ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='memory_bases', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'ingestion_memorybase',
                    },
                ),
                migrations.CreateModel(
                    name='MemoryBaseSession',
                    fields=[
                        ('id', models.BigAutoField(primary_key=True, serialize=False)),
                        ('session_id', models.CharField(max_length=255)),
                        ('cursor_message_id', models.BigIntegerField(blank=True, null=True)),
                        ('cursor_created_at', models.DateTimeField(blank=True, null=True)),
                        ('total_processed', models.PositiveIntegerField(default=0)),
                        ('last_sync_at', models.DateTimeField(blank=True, null=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('memory_base', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='sessions', to='memory_bases.memorybase')),
                    ],
                    options={
                        'db_table': 'ingestion_memorybasesession',
                    },
                ),
                migrations.CreateModel(
                    name='MemoryBaseJob',
                    fields=[
                        ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ('status', models.CharField(choices=[('queued', 'Queued'), ('running', 'Running'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('cancelled', 'Cancelled')], default='queued', max_length=16)),
                        ('error', models.TextField(blank=True, default='')),
                        ('attempts', models.PositiveSmallIntegerField(default=0)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('started_at', models.DateTimeField(blank=True, null=True)),
                        ('finished_at', models.DateTimeField(blank=True, null=True)),
                        ('trigger', models.CharField(choices=[('auto', 'Auto'), ('manual', 'Manual'), ('regenerate', 'Regenerate')], max_length=16)),
                        ('start_cursor_message_id', models.BigIntegerField(blank=True, null=True)),
                        ('start_cursor_created_at', models.DateTimeField(blank=True, null=True)),
                        ('last_message_id', models.BigIntegerField()),
                        ('last_message_created_at', models.DateTimeField()),
                        ('messages_processed', models.PositiveIntegerField(default=0)),
                        ('chunks_written', models.PositiveIntegerField(default=0)),
                        ('cancel_requested', models.BooleanField(default=False)),
                        ('task_id', models.CharField(blank=True, default='', max_length=64)),
                        ('memory_base', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='jobs', to='memory_bases.memorybase')),
                        ('session', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='jobs', to='memory_bases.memorybasesession')),
                    ],
                    options={
                        'db_table': 'ingestion_ingestionjob',
                    },
                ),
                migrations.AddConstraint(
                    model_name='memorybase',
                    constraint=models.UniqueConstraint(fields=('owner', 'name'), name='memorybase_unique_name_per_owner'),
                ),
                migrations.AddConstraint(
                    model_name='memorybase',
                    constraint=models.CheckConstraint(condition=models.Q(('threshold__gte', 1)), name='memorybase_threshold_positive'),
                ),
                migrations.AddConstraint(
                    model_name='memorybasesession',
                    constraint=models.UniqueConstraint(fields=('memory_base', 'session_id'), name='mbsession_unique'),
                ),
                migrations.AddConstraint(
                    model_name='memorybasesession',
                    constraint=models.CheckConstraint(condition=models.Q(models.Q(('cursor_created_at__isnull', True), ('cursor_message_id__isnull', True)), models.Q(('cursor_created_at__isnull', False), ('cursor_message_id__isnull', False)), _connector='OR'), name='mbsession_cursor_pair'),
                ),
                migrations.AddIndex(
                    model_name='memorybasejob',
                    index=models.Index(fields=['memory_base', 'status'], name='job_mb_status'),
                ),
                migrations.AddConstraint(
                    model_name='memorybasejob',
                    constraint=models.UniqueConstraint(condition=models.Q(('status__in', ['queued', 'running'])), fields=('session',), name='ingestionjob_one_active_per_session'),
                ),
            ],
        ),
    ]
