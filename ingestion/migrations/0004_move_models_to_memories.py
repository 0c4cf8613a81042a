"""Flow and Message move to memories.conversations, MemoryBase, MemoryBaseSession and
IngestionJob (now MemoryBaseJob) to memories.bases: state only, tables and rows stay."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('memory_bases', '0001_initial'),
        ('conversations', '0001_initial'),
        ('ingestion', '0003_job_attempts'),
    ]

    # The tables stay where they are (their db_table names are kept): only Django's
    # idea of which app owns the models changes.
    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.RemoveField(
                    model_name='memorybase',
                    name='flow',
                ),
                migrations.RemoveField(
                    model_name='message',
                    name='flow',
                ),
                migrations.RemoveField(
                    model_name='ingestionjob',
                    name='memory_base',
                ),
                migrations.RemoveField(
                    model_name='ingestionjob',
                    name='session',
                ),
                migrations.RemoveField(
                    model_name='memorybase',
                    name='knowledge_base',
                ),
                migrations.RemoveField(
                    model_name='memorybase',
                    name='owner',
                ),
                migrations.RemoveField(
                    model_name='memorybasesession',
                    name='memory_base',
                ),
                migrations.RemoveField(
                    model_name='message',
                    name='owner',
                ),
                migrations.RemoveField(
                    model_name='message',
                    name='parent',
                ),
                migrations.DeleteModel(
                    name='Flow',
                ),
                migrations.DeleteModel(
                    name='IngestionJob',
                ),
                migrations.DeleteModel(
                    name='MemoryBase',
                ),
                migrations.DeleteModel(
                    name='MemoryBaseSession',
                ),
                migrations.DeleteModel(
                    name='Message',
                ),
            ],
        ),
    ]
