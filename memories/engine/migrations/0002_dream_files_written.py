from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("memory_engine", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="dream",
            name="files_written",
            field=models.BooleanField(default=False),
        ),
        # Dreams made before this column wrote their files in the same call: counted as
        # written, so no run rewrites an old diary.
        migrations.RunSQL(
            "UPDATE memory_engine_dream SET files_written = true",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
