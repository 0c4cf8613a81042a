"""Admin content types and permissions follow the models to their new apps.

The rows are renamed in place (same ids), so admin log entries, user and group
permissions keep pointing at them. On a new database there is nothing to rename:
Django creates them after migrating.
"""

from django.db import migrations

MOVES = [
    # (old app, old model, new app, new model, new verbose name)
    ("ingestion", "flow", "conversations", "flow", "flow"),
    ("ingestion", "message", "conversations", "message", "message"),
    ("ingestion", "memorybase", "memory_bases", "memorybase", "memory base"),
    ("ingestion", "memorybasesession", "memory_bases", "memorybasesession", "memory base session"),
    ("ingestion", "ingestionjob", "memory_bases", "memorybasejob", "memory base job"),
]
ACTIONS = ("add", "change", "delete", "view")


def forward(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    for old_app, old_model, new_app, new_model, verbose in MOVES:
        if ContentType.objects.filter(app_label=new_app, model=new_model).exists():
            continue
        ct = ContentType.objects.filter(app_label=old_app, model=old_model).first()
        if ct is None:
            continue
        ct.app_label, ct.model = new_app, new_model
        ct.save(update_fields=["app_label", "model"])
        for action in ACTIONS:
            Permission.objects.filter(content_type=ct, codename=f"{action}_{old_model}").update(
                codename=f"{action}_{new_model}", name=f"Can {action} {verbose}"
            )


def backward(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    for old_app, old_model, new_app, new_model, _ in MOVES:
        ct = ContentType.objects.filter(app_label=new_app, model=new_model).first()
        if ct is None:
            continue
        ct.app_label, ct.model = old_app, old_model
        ct.save(update_fields=["app_label", "model"])
        for action in ACTIONS:
            Permission.objects.filter(content_type=ct, codename=f"{action}_{new_model}").update(
                codename=f"{action}_{old_model}"
            )


class Migration(migrations.Migration):
    dependencies = [
        ("memory_bases", "0001_initial"),
        ("conversations", "0001_initial"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [migrations.RunPython(forward, backward)]
