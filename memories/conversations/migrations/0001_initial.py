"""Flow and Message, moved from ingestion: the state only; the tables
ingestion_flow / ingestion_message were created by ingestion 0001."""

import django.db.models.deletion
import django.utils.timezone
import uuid
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('ingestion', '0003_job_attempts'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    # The tables stay where they are (their db_table names are kept): only Django's
    # idea of which app owns the models changes.
    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.CreateModel(
                    name='Flow',
                    fields=[
                        ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ('name', models.CharField(max_length=200)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='flows', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'ingestion_flow',
                    },
                ),
                migrations.CreateModel(
                    name='Message',
                    fields=[
                        ('id', models.BigAutoField(primary_key=True, serialize=False)),
                        ('session_id', models.CharField(max_length=255)),
                        ('run_id', models.CharField(blank=True, default='', max_length=64)),
                        ('is_output', models.BooleanField(default=False)),
                        ('role', models.CharField(choices=[('user', 'User'), ('assistant', 'Assistant'), ('system', 'System'), ('tool', 'Tool')], max_length=16)),
                        ('sender', models.CharField(blank=True, default='', max_length=100)),
                        ('sender_name', models.CharField(blank=True, default='', max_length=200)),
                        ('text', models.TextField()),
                        ('content', models.JSONField(blank=True, default=list, help_text='Structured content blocks.')),
                        ('files', models.JSONField(blank=True, default=list, help_text='File references.')),
                        ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                        ('flow', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='messages', to='conversations.flow')),
                        ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to=settings.AUTH_USER_MODEL)),
                        ('parent', models.ForeignKey(blank=True, db_column='parent_message_id', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='children', to='conversations.message')),
                    ],
                    options={
                        'db_table': 'ingestion_message',
                    },
                ),
                migrations.AddConstraint(
                    model_name='flow',
                    constraint=models.UniqueConstraint(fields=('owner', 'name'), name='flow_unique_name_per_owner'),
                ),
                migrations.AddIndex(
                    model_name='message',
                    index=models.Index(condition=models.Q(('is_output', True)), fields=['flow', 'session_id', 'created_at', 'id'], name='message_pending_outputs'),
                ),
                migrations.AddIndex(
                    model_name='message',
                    index=models.Index(fields=['flow', 'session_id', 'created_at', 'id'], name='message_session_keyset'),
                ),
                migrations.AddIndex(
                    model_name='message',
                    index=models.Index(fields=['owner', 'created_at', 'id'], name='message_owner_keyset'),
                ),
            ],
        ),
    ]
