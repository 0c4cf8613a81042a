"""The chunks of each (base, session), counted: ``knowledge_session_stats``.

Why: a search filtered to a session decides between ranking the session's chunks exactly
(its 16-bit copies, 0018) and walking the HNSW index by the session's size, and it had to
count the session's rows for that in its statement: 3 ms of a 12 ms search for a session
of 15,000 chunks among 1M (BENCHMARKS.md, "A million chunks: 16-bit copies"). The count
is now one row read, as the bases' (``knowledge_base_text_stats``, 0009) and the scopes'
(memories 0009) are.

Statement-level triggers on ``knowledge_chunk`` keep the counts in every chunk write's own
transaction (an insert, a delete, an update that moves a chunk to another session or
base, a truncate), whatever code path wrote. A session with no chunk has no row. The
owner is the chunks' (row-level security's column, in the key as a table distributed by
owner needs).

The existing chunks are counted under a lock that holds chunk writes back meanwhile (1M
chunks: about a second).
"""

from django.db import migrations

from core.triggers import statement_triggers

KEY = "knowledge_base_id, session_id, owner_id"
MATCH = (
    "s.knowledge_base_id = t.knowledge_base_id AND s.session_id = t.session_id "
    "AND s.owner_id = t.owner_id"
)

TRIGGERS, DROP_TRIGGERS = statement_triggers(
    table="knowledge_chunk", prefix="knowledge_chunk_sessions", old="chunk_old", new="chunk_new",
    functions=dict.fromkeys(["insert", "update", "delete", "truncate"], "knowledge_chunk_sessions"),
)  # fmt: skip

# Each (base, session, owner) appears once in ``t``: the three writes never meet on a row.
APPLY = f"""
        up AS (
            INSERT INTO knowledge_session_stats AS s ({KEY}, chunks)
            SELECT {KEY}, n FROM t WHERE n > 0 ORDER BY {KEY}
            ON CONFLICT ON CONSTRAINT knowledge_session_stats_pkey
            DO UPDATE SET chunks = s.chunks + EXCLUDED.chunks
        ),
        down AS (
            UPDATE knowledge_session_stats s SET chunks = s.chunks + t.n FROM t
            WHERE t.n < 0 AND {MATCH} AND s.chunks + t.n > 0
        )
        DELETE FROM knowledge_session_stats s USING t
        WHERE t.n < 0 AND {MATCH} AND s.chunks + t.n <= 0;"""

CREATE = f"""
LOCK TABLE knowledge_chunk IN SHARE MODE;
CREATE TABLE knowledge_session_stats (
    knowledge_base_id uuid NOT NULL,
    session_id varchar(255) NOT NULL,
    owner_id integer NOT NULL,
    chunks bigint NOT NULL CHECK (chunks > 0),
    CONSTRAINT knowledge_session_stats_pkey PRIMARY KEY ({KEY})
) WITH (fillfactor = 50);

CREATE FUNCTION knowledge_chunk_sessions() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        TRUNCATE knowledge_session_stats;
    ELSIF TG_OP = 'INSERT' THEN
        WITH t AS (SELECT {KEY}, count(*) AS n FROM chunk_new GROUP BY {KEY}),
        {APPLY}
    ELSIF TG_OP = 'DELETE' THEN
        WITH t AS (SELECT {KEY}, -count(*) AS n FROM chunk_old GROUP BY {KEY}),
        {APPLY}
    ELSE
        -- Only chunks that changed session, base or owner move a count.
        WITH m AS MATERIALIZED (
            SELECT o.knowledge_base_id AS ob, o.session_id AS os, o.owner_id AS oown,
                   n.knowledge_base_id AS nb, n.session_id AS ns, n.owner_id AS nown
            FROM chunk_old o JOIN chunk_new n USING (id)
            WHERE (o.knowledge_base_id, o.session_id, o.owner_id)
                  IS DISTINCT FROM (n.knowledge_base_id, n.session_id, n.owner_id)
        ),
        t AS (
            SELECT {KEY}, sum(sign) AS n FROM (
                SELECT nb AS knowledge_base_id, ns AS session_id, nown AS owner_id, 1 AS sign FROM m
                UNION ALL
                SELECT ob, os, oown, -1 FROM m
            ) d GROUP BY {KEY} HAVING sum(sign) <> 0
        ),
        {APPLY}
    END IF;
    RETURN NULL;
END $$;

{TRIGGERS}
-- The chunks already there (the lock above holds writes back until the commit).
INSERT INTO knowledge_session_stats ({KEY}, chunks)
SELECT {KEY}, count(*) FROM knowledge_chunk GROUP BY {KEY};
"""

DROP = DROP_TRIGGERS + "DROP TABLE IF EXISTS knowledge_session_stats;"


class Migration(migrations.Migration):
    dependencies = [("knowledge", "0018_chunk_half")]

    operations = [migrations.RunSQL(CREATE, DROP)]
