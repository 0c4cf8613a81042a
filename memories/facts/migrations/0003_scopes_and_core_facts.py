"""Personal memories generalised to scopes and core facts (issue 12).

- ``EndUser`` becomes a scope: ``scope`` (text[]), filled with ``["user", external_id]``
  for every existing end user; ``external_id`` is null for scopes that are not end users.
- ``Vector`` gets ``category``, ``confidence``, its source, ``updated_at``, and ``scope``:
  the one scope linking it (set here for every vector linked exactly once). Links of
  vectors linked more than once are marked ``shared``.
- ``search_vector``: a stored generated tsvector of the content plus one lexeme naming
  the fact's scope (``~scope:<id>``), so a scope's keyword search is one GIN lookup that
  intersects the query words with the scope (PostgreSQL has no btree_gin here). It lives
  in the table, not in the model (as ``knowledge_chunk.search_vector`` does).
"""

import django.contrib.postgres.fields
import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

CATEGORIES = ("preference", "knowledge", "context", "behavior", "goal", "correction")

FILL_SCOPES = "UPDATE memories_enduser SET scope = ARRAY['user', external_id]"
FILL_VECTOR_SCOPES = """
UPDATE memories_vector v SET scope_id = one.end_user_id
FROM (SELECT vector_id, min(end_user_id) AS end_user_id FROM memories_uservector
      GROUP BY vector_id HAVING count(*) = 1) one
WHERE v.id = one.vector_id;
UPDATE memories_uservector SET shared = true
WHERE vector_id IN (SELECT vector_id FROM memories_uservector
                    GROUP BY vector_id HAVING count(*) > 1);
"""
SEARCH_VECTOR = """
ALTER TABLE memories_vector ADD COLUMN search_vector tsvector GENERATED ALWAYS AS (
    to_tsvector('english'::regconfig, content)
    || array_to_tsvector(ARRAY['~scope:' || coalesce(scope_id::text, 'shared')])
) STORED;
CREATE INDEX vector_search_vector_gin ON memories_vector USING gin (search_vector);
"""
DROP_SEARCH_VECTOR = "ALTER TABLE memories_vector DROP COLUMN search_vector"


class Migration(migrations.Migration):
    dependencies = [("memories", "0002_globalmemory")]

    operations = [
        migrations.AlterField(
            model_name="enduser",
            name="external_id",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="enduser",
            name="scope",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(max_length=255), null=True, size=None
            ),
        ),
        migrations.RunSQL(FILL_SCOPES, migrations.RunSQL.noop),
        migrations.AlterField(
            model_name="enduser",
            name="scope",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(max_length=255), size=None
            ),
        ),
        migrations.AlterModelOptions(name="enduser", options={"verbose_name": "scope"}),
        migrations.AddConstraint(
            model_name="enduser",
            constraint=models.UniqueConstraint(
                fields=("owner", "scope"), name="enduser_scope_unique"
            ),
        ),
        migrations.AddConstraint(
            model_name="enduser",
            constraint=models.CheckConstraint(
                condition=models.Q(("external_id__isnull", True))
                | models.Q(("scope__0", "user"), ("scope__len", 2)),
                name="enduser_external_id_is_user_scope",
            ),
        ),
        migrations.AddField(
            model_name="vector",
            name="scope",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="memories.enduser",
            ),
        ),
        migrations.AddField(
            model_name="vector",
            name="category",
            field=models.CharField(
                choices=[(c, c) for c in CATEGORIES], default="context", max_length=16
            ),
        ),
        migrations.AddField(
            model_name="vector", name="confidence", field=models.FloatField(default=1.0)
        ),
        migrations.AddField(
            model_name="vector",
            name="source_kind",
            field=models.CharField(default="message", max_length=16),
        ),
        migrations.AddField(
            model_name="vector",
            name="source_ref",
            field=models.CharField(blank=True, default="", max_length=255),
        ),
        migrations.AddField(
            model_name="vector",
            name="updated_at",
            field=models.DateTimeField(auto_now=True, default=django.utils.timezone.now),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="uservector", name="shared", field=models.BooleanField(default=False)
        ),
        migrations.RunSQL(FILL_VECTOR_SCOPES, migrations.RunSQL.noop),
        migrations.AlterField(
            model_name="memoryupdate",
            name="action",
            field=models.CharField(
                choices=[
                    ("add", "Add"),
                    ("replace", "Replace"),
                    ("update", "Update"),
                    ("delete", "Delete"),
                    ("evict", "Evict"),
                ],
                max_length=16,
            ),
        ),
        migrations.AddIndex(
            model_name="vector",
            index=models.Index(
                fields=["scope"],
                include=[
                    "embedding",
                    "dimensions",
                    "embedding_model",
                    "observed_at",
                    "confidence",
                    "category",
                ],
                name="vector_scope_covering",
            ),
        ),
        migrations.AddIndex(
            model_name="uservector",
            index=models.Index(
                condition=models.Q(("shared", True)),
                fields=["end_user"],
                name="uservector_shared",
            ),
        ),
        migrations.AddConstraint(
            model_name="vector",
            constraint=models.CheckConstraint(
                condition=models.Q(("confidence__gte", 0), ("confidence__lte", 1)),
                name="vector_confidence_0_1",
            ),
        ),
        migrations.AddConstraint(
            model_name="vector",
            constraint=models.CheckConstraint(
                condition=models.Q(("category__in", CATEGORIES)), name="vector_category_valid"
            ),
        ),
        migrations.RunSQL(SEARCH_VECTOR, DROP_SEARCH_VECTOR),
    ]
