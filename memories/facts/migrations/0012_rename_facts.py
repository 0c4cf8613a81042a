"""The facts room's models named for what they hold, their tables renamed in place
(every row kept, no table rewritten):

- ``EndUser`` -> ``Scope`` (``memories_enduser`` -> ``memories_scope``), its ``scope``
  column -> ``path``;
- ``Vector`` -> ``Fact`` (``memories_vector`` -> ``memories_fact``), and its 16-bit
  copies ``memories_vector_half`` -> ``memories_fact_half``;
- ``UserVector`` -> ``FactLink`` (``memories_uservector`` -> ``memories_factlink``),
  ``end_user_id`` -> ``scope_id``, ``vector_id`` -> ``fact_id``;
- ``MemoryUpdate`` -> ``FactChange`` (``memories_memoryupdate`` ->
  ``memories_factchange``), ``end_user_id`` -> ``scope_id``, ``old_vector_id`` /
  ``new_vector_id`` -> ``old_fact_id`` / ``new_fact_id``;
- their indexes and constraints (``vector_*`` -> ``fact_*``, ``enduser_*`` ->
  ``scope_*``...), the fact table's HNSW indexes (``vector_hnsw[_half]_<dim>`` ->
  ``fact_hnsw[_half]_<dim>``) and keyword index, renamed (``ALTER ... RENAME``: a
  catalog change).

Permissions follow their models (``view_vector`` -> ``view_fact``...): Django renames
the content types with the models, not the permissions' codenames.

The trigger functions of 0008 (the 16-bit copies), 0009 (each scope's link count) and
0010 (each scope's keyword statistics) name tables and columns in their bodies: they are
dropped before the renames and made again after them under the new names, in this
migration's one transaction (no write can happen in between). Both directions.
"""

import django.contrib.postgres.fields
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from core.triggers import half_copies_sql, statement_triggers
from knowledge.models import INDEXED_DIMENSIONS

CATEGORIES = ("preference", "knowledge", "context", "behavior", "goal", "correction")
HALF_MAX_DIMENSIONS = 1024
OPS = ("insert", "update", "delete", "truncate")
COPY_COLUMNS = "scope_id, id, dimensions, embedding_model, observed_at, confidence, category"

OLD = {
    "fact": "memories_vector", "half": "memories_vector_half", "scope": "memories_enduser",
    "link": "memories_uservector", "link_scope": "end_user_id",
    "half_fn": "memories_vector_half_sync", "half_trigger": "memories_vector_half",
    "half_old": "vector_old", "half_new": "vector_new",
    "count": "memories_uservector_count", "stats": "memories_vector_text_stats",
}  # fmt: skip
NEW = {
    "fact": "memories_fact", "half": "memories_fact_half", "scope": "memories_scope",
    "link": "memories_factlink", "link_scope": "scope_id",
    "half_fn": "memories_fact_half_sync", "half_trigger": "memories_fact_half",
    "half_old": "facts_old", "half_new": "facts_new",
    "count": "memories_factlink_count", "stats": "memories_fact_text_stats",
}  # fmt: skip

def _half(n: dict) -> tuple[str, str]:
    """0008's copies, kept by one function for every operation."""
    old, new = n["half_old"], n["half_new"]
    function, _ = half_copies_sql(
        table=n["fact"], copies=n["half"], function=n["half_fn"], columns=COPY_COLUMNS,
        keep=f"scope_id IS NOT NULL AND dimensions <= {HALF_MAX_DIMENSIONS}", old=old, new=new,
    )  # fmt: skip
    create, drop = statement_triggers(
        table=n["fact"], prefix=n["half_trigger"], functions=dict.fromkeys(OPS, n["half_fn"]),
        old=old, new=new,
    )
    return function + create, drop


def _count(n: dict) -> tuple[str, str]:
    """0009's link count of each scope."""
    col, scope = n["link_scope"], n["scope"]
    functions = [f"""
CREATE FUNCTION {n["count"]}_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {scope} SET fact_count = 0 WHERE fact_count <> 0;
    RETURN NULL;
END $$;
"""]
    for op in ("insert", "delete", "update"):
        changed = {
            "insert": f"SELECT {col}, 1 AS n FROM links_new",
            "delete": f"SELECT {col}, -1 AS n FROM links_old",
            "update": f"SELECT {col}, 1 AS n FROM links_new UNION ALL SELECT {col}, -1 FROM links_old",
        }[op]
        delta = f"SELECT {col}, sum(n) AS n FROM ({changed}) c GROUP BY {col} HAVING sum(n) <> 0"
        functions.append(f"""
CREATE FUNCTION {n["count"]}_{op}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The scopes' rows in id order first: two statements touching the same scopes
    -- queue instead of deadlocking.
    PERFORM 1 FROM {scope} WHERE id IN (SELECT {col} FROM ({delta}) d)
    ORDER BY id FOR NO KEY UPDATE;
    UPDATE {scope} e SET fact_count = e.fact_count + d.n FROM ({delta}) d
    WHERE e.id = d.{col};
    RETURN NULL;
END $$;
""")
    create, drop = statement_triggers(
        table=n["link"], prefix=n["count"], functions={op: f"{n['count']}_{op}" for op in OPS},
        old="links_old", new="links_new",
    )
    return "".join(functions) + create, drop


def _stats(n: dict) -> tuple[str, str]:
    """0010's keyword statistics of each scope."""
    scope = n["scope"]
    rows = "SELECT scope_id, {sign} AS n, {sign} * (length(search_vector) - 1) AS l FROM {table}"
    functions = [f"""
CREATE FUNCTION {n["stats"]}_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {scope} SET text_facts = 0, text_lexemes = 0
    WHERE text_facts <> 0 OR text_lexemes <> 0;
    RETURN NULL;
END $$;
"""]
    for op in ("insert", "delete", "update"):
        changed = {
            "insert": rows.format(sign=1, table="facts_new"),
            "delete": rows.format(sign=-1, table="facts_old"),
            "update": rows.format(sign=1, table="facts_new")
            + " UNION ALL "
            + rows.format(sign=-1, table="facts_old"),
        }[op]
        delta = (
            f"SELECT scope_id, sum(n) AS n, sum(l) AS l FROM ({changed}) c "
            "WHERE scope_id IS NOT NULL GROUP BY scope_id HAVING sum(n) <> 0 OR sum(l) <> 0"
        )
        functions.append(f"""
CREATE FUNCTION {n["stats"]}_{op}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The scopes' rows in id order first: two statements touching the same scopes
    -- queue instead of deadlocking (the link triggers lock them the same way).
    PERFORM 1 FROM {scope} WHERE id IN (SELECT scope_id FROM ({delta}) d)
    ORDER BY id FOR NO KEY UPDATE;
    UPDATE {scope} e
    SET text_facts = e.text_facts + d.n, text_lexemes = e.text_lexemes + d.l
    FROM ({delta}) d WHERE e.id = d.scope_id;
    RETURN NULL;
END $$;
""")
    create, drop = statement_triggers(
        table=n["fact"], prefix=n["stats"], functions={op: f"{n['stats']}_{op}" for op in OPS},
        old="facts_old", new="facts_new",
    )
    return "".join(functions) + create, drop


def _exists(schema_editor, name: str) -> bool:
    with schema_editor.connection.cursor() as cur:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
        return bool(cur.fetchone()[0])


def _drop_functions(n: dict):
    def run(apps, schema_editor):
        if _exists(schema_editor, n["half"]):
            schema_editor.execute(_half(n)[1])
        schema_editor.execute(_count(n)[1] + _stats(n)[1])

    return run


def _create_functions(n: dict):
    def run(apps, schema_editor):
        if _exists(schema_editor, n["half"]):  # (not on pgvector < 0.7: 0008)
            schema_editor.execute(_half(n)[0])
        schema_editor.execute(_count(n)[0] + _stats(n)[0])

    return run


# Database objects the model state does not name: (old, new) of each.
RAW_INDEXES = [
    ("vector_search_vector_gin", "fact_search_vector_gin"),
    ("memories_vector_half_scope", "memories_fact_half_scope"),
    ("memories_vector_half_pkey", "memories_fact_half_pkey"),
    ("memories_enduser_pkey", "memories_scope_pkey"),
    ("memories_vector_pkey", "memories_fact_pkey"),
    ("memories_uservector_pkey", "memories_factlink_pkey"),
    ("memories_memoryupdate_pkey", "memories_factchange_pkey"),
    *[(f"vector_hnsw_{d}", f"fact_hnsw_{d}") for d in INDEXED_DIMENSIONS],
    *[(f"vector_hnsw_half_{d}", f"fact_hnsw_half_{d}") for d in INDEXED_DIMENSIONS],
]
RAW_CONSTRAINTS = [  # the scope row's counters (0009, 0010), on the renamed table
    ("enduser_fact_count_not_negative", "scope_fact_count_not_negative"),
    ("enduser_text_facts_not_negative", "scope_text_facts_not_negative"),
    ("enduser_text_lexemes_not_negative", "scope_text_lexemes_not_negative"),
]


def _raw_renames(forward: bool):
    def run(apps, schema_editor):
        pairs = RAW_INDEXES if forward else [(b, a) for a, b in RAW_INDEXES]
        for old, new in pairs:
            schema_editor.execute(f"ALTER INDEX IF EXISTS {old} RENAME TO {new}")
        # (backward, this runs before the models' renames are undone: the table is
        # still memories_scope)
        for old, new in RAW_CONSTRAINTS if forward else [(b, a) for a, b in RAW_CONSTRAINTS]:
            schema_editor.execute(f"ALTER TABLE memories_scope RENAME CONSTRAINT {old} TO {new}")
        half, other = ("memories_vector_half", "memories_fact_half")[:: 1 if forward else -1]
        if _exists(schema_editor, half):
            schema_editor.execute(f"ALTER TABLE {half} RENAME TO {other}")

    return run


# (old model, new model, new verbose name): the default permissions to rename.
PERMISSIONS = [
    ("enduser", "scope", "scope"),
    ("vector", "fact", "fact"),
    ("uservector", "factlink", "fact link"),
    ("memoryupdate", "factchange", "fact change"),
]
RENAME_PERMISSION = (
    "UPDATE auth_permission p SET codename = %s, name = %s FROM django_content_type ct "
    "WHERE p.content_type_id = ct.id AND ct.app_label = 'memories' AND ct.model = %s "
    "AND p.codename = %s AND NOT EXISTS (SELECT 1 FROM auth_permission q "
    "WHERE q.content_type_id = ct.id AND q.codename = %s)"
)


def _permissions(forward: bool):
    def run(apps, schema_editor):
        for old, new, verbose in PERMISSIONS:
            for action in ("add", "change", "delete", "view"):
                if forward:
                    args = [f"{action}_{new}", f"Can {action} {verbose}", new, f"{action}_{old}",
                            f"{action}_{new}"]  # fmt: skip
                else:
                    args = [f"{action}_{old}", f"Can {action} {old}", new, f"{action}_{new}",
                            f"{action}_{old}"]  # fmt: skip
                schema_editor.execute(RENAME_PERMISSION, args)

    return run


def _renamed_index(model: str, old: models.Index, new: models.Index):
    """An index renamed in the database (``ALTER INDEX``), its state redeclared."""
    return migrations.SeparateDatabaseAndState(
        state_operations=[
            migrations.RemoveIndex(model_name=model, name=old.name),
            migrations.AddIndex(model_name=model, index=new),
        ],
        database_operations=[
            migrations.RunSQL(
                f"ALTER INDEX {old.name} RENAME TO {new.name}",
                f"ALTER INDEX {new.name} RENAME TO {old.name}",
            )
        ],
    )


def _renamed_constraint(model: str, table: str, old, new):
    """A constraint renamed in the database (``ALTER TABLE ... RENAME CONSTRAINT``: a
    unique one's index with it), its state redeclared."""
    return migrations.SeparateDatabaseAndState(
        state_operations=[
            migrations.RemoveConstraint(model_name=model, name=old.name),
            migrations.AddConstraint(model_name=model, constraint=new),
        ],
        database_operations=[
            migrations.RunSQL(
                f"ALTER TABLE {table} RENAME CONSTRAINT {old.name} TO {new.name}",
                f"ALTER TABLE {table} RENAME CONSTRAINT {new.name} TO {old.name}",
            )
        ],
    )


class Migration(migrations.Migration):
    dependencies = [
        ("memories", "0011_metriccounter_to_core"),
        ("memory_engine", "0003_scopejournal_before_rename"),
        ("contenttypes", "0002_remove_content_type_name"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(_drop_functions(OLD), _create_functions(OLD)),
        # A proxy names its base: out of the state while the base is renamed.
        migrations.DeleteModel(name="GlobalMemory"),
        migrations.RenameModel(old_name="EndUser", new_name="Scope"),
        migrations.RenameModel(old_name="Vector", new_name="Fact"),
        migrations.RenameModel(old_name="UserVector", new_name="FactLink"),
        migrations.RenameModel(old_name="MemoryUpdate", new_name="FactChange"),
        migrations.RenameField(model_name="scope", old_name="scope", new_name="path"),
        migrations.AlterField(
            model_name="scope",
            name="path",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(max_length=255), blank=True, size=None
            ),
        ),
        migrations.AlterField(
            model_name="scope",
            name="owner",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="memory_scopes",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        # The link's columns are its composite primary key: renamed in the database,
        # the key redeclared in the state.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RenameField(model_name="factlink", old_name="end_user", new_name="scope"),
                migrations.RenameField(model_name="factlink", old_name="vector", new_name="fact"),
                migrations.AlterField(
                    model_name="factlink",
                    name="pk",
                    field=models.CompositePrimaryKey(
                        "scope_id", "fact_id", blank=True, editable=False, primary_key=True,
                        serialize=False,
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "ALTER TABLE memories_factlink RENAME COLUMN end_user_id TO scope_id;"
                    "ALTER TABLE memories_factlink RENAME COLUMN vector_id TO fact_id;",
                    "ALTER TABLE memories_factlink RENAME COLUMN scope_id TO end_user_id;"
                    "ALTER TABLE memories_factlink RENAME COLUMN fact_id TO vector_id;",
                )
            ],
        ),
        migrations.RenameField(model_name="factchange", old_name="end_user", new_name="scope"),
        migrations.RenameField(model_name="factchange", old_name="old_vector", new_name="old_fact"),
        migrations.RenameField(model_name="factchange", old_name="new_vector", new_name="new_fact"),
        migrations.AlterField(
            model_name="factchange",
            name="scope",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="changes",
                to="memories.scope",
            ),
        ),
        _renamed_index(
            "fact",
            models.Index(fields=["owner", "type"], name="vector_owner_type"),
            models.Index(fields=["owner", "type"], name="fact_owner_type"),
        ),
        _renamed_index(
            "fact",
            models.Index(fields=["owner", "normalized"], name="vector_owner_normalized"),
            models.Index(fields=["owner", "normalized"], name="fact_owner_normalized"),
        ),
        _renamed_index(
            "fact",
            models.Index(fields=["scope"], name="vector_scope"),
            models.Index(fields=["scope"], name="fact_scope"),
        ),
        _renamed_index(
            "factlink",
            models.Index(fields=["vector"], name="uservector_vector"),
            models.Index(fields=["fact"], name="factlink_fact"),
        ),
        _renamed_index(
            "factlink",
            models.Index(fields=["end_user"], condition=models.Q(shared=True), name="uservector_shared"),
            models.Index(fields=["scope"], condition=models.Q(shared=True), name="factlink_shared"),
        ),
        _renamed_index(
            "factchange",
            models.Index(fields=["end_user", "-created_at"], name="memoryupdate_user_time"),
            models.Index(fields=["scope", "-created_at"], name="factchange_scope_time"),
        ),
        _renamed_constraint(
            "scope",
            "memories_scope",
            models.UniqueConstraint(fields=["owner", "external_id"], name="enduser_unique_per_owner"),
            models.UniqueConstraint(fields=["owner", "external_id"], name="scope_external_id_unique"),
        ),
        _renamed_constraint(
            "scope",
            "memories_scope",
            models.UniqueConstraint(fields=["owner", "scope"], name="enduser_scope_unique"),
            models.UniqueConstraint(fields=["owner", "path"], name="scope_path_unique"),
        ),
        _renamed_constraint(
            "scope",
            "memories_scope",
            models.CheckConstraint(
                condition=models.Q(external_id__isnull=True) | models.Q(scope__len=2, scope__0="user"),
                name="enduser_external_id_is_user_scope",
            ),
            models.CheckConstraint(
                condition=models.Q(external_id__isnull=True) | models.Q(path__len=2, path__0="user"),
                name="scope_external_id_is_user_path",
            ),
        ),
        _renamed_constraint(
            "fact",
            "memories_fact",
            models.CheckConstraint(
                condition=models.Q(confidence__gte=0, confidence__lte=1), name="vector_confidence_0_1"
            ),
            models.CheckConstraint(
                condition=models.Q(confidence__gte=0, confidence__lte=1), name="fact_confidence_0_1"
            ),
        ),
        _renamed_constraint(
            "fact",
            "memories_fact",
            models.CheckConstraint(condition=models.Q(category__in=CATEGORIES), name="vector_category_valid"),
            models.CheckConstraint(condition=models.Q(category__in=CATEGORIES), name="fact_category_valid"),
        ),
        migrations.CreateModel(
            name="GlobalMemory",
            fields=[],
            options={
                "verbose_name": "global memory",
                "verbose_name_plural": "global memories",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("memories.fact",),
        ),
        migrations.RunPython(_raw_renames(True), _raw_renames(False)),
        migrations.RunPython(_create_functions(NEW), _drop_functions(NEW)),
        migrations.RunPython(_permissions(True), _permissions(False)),
    ]
