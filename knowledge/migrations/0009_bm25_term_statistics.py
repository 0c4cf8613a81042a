"""Term statistics for BM25, kept exact by the database in the chunk write's transaction.

``knowledge_term_stats``: per knowledge base and lexeme (of ``search_vector``, so the
base's stemming and stop words), the number of chunks holding it (document frequency).
``knowledge_base_text_stats``: per base, the chunks and the sum of their lengths in
distinct lexemes (``length(search_vector)``), for the average length BM25 normalises by.

Statement-level triggers on ``knowledge_chunk`` read the transition tables of every
INSERT, UPDATE and DELETE, whichever code path issued it (ingestion, re-ingestion,
deletion of documents or sessions, a base's cascade), so the figures can never drift from
the rows and are written in the same transaction as them. Upserts run in lexeme order, so
two writers of one base queue on the same rows in the same order instead of deadlocking.
Pages are left part empty (fillfactor) so that a count's update stays on its page and
leaves the primary key alone (a HOT update). An UPDATE that leaves ``search_vector`` unchanged (the HNSW indexer clearing
``index_pending``, a re-ingestion of the same text) writes nothing. Rows whose count
falls to zero are removed, so a deleted base (its chunks deleted first) leaves none. No
foreign key: Django's test flush truncates the tables it knows, and a TRUNCATE of the
chunks empties both tables through its own trigger.
"""

from django.db import migrations

CREATE = """
CREATE TABLE knowledge_term_stats (
    knowledge_base_id uuid NOT NULL,
    lexeme text NOT NULL,
    df integer NOT NULL CHECK (df > 0),
    PRIMARY KEY (knowledge_base_id, lexeme)
) WITH (fillfactor = 70);
CREATE TABLE knowledge_base_text_stats (
    knowledge_base_id uuid PRIMARY KEY,
    chunks bigint NOT NULL CHECK (chunks > 0),
    lexemes bigint NOT NULL CHECK (lexemes >= 0)
) WITH (fillfactor = 50);

CREATE FUNCTION knowledge_chunk_stats() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed text;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        TRUNCATE knowledge_term_stats, knowledge_base_text_stats;
        RETURN NULL;
    ELSIF TG_OP = 'INSERT' THEN
        changed := 'SELECT knowledge_base_id, search_vector, 1 AS sign FROM chunk_new';
    ELSIF TG_OP = 'DELETE' THEN
        changed := 'SELECT knowledge_base_id, search_vector, -1 AS sign FROM chunk_old';
    ELSE
        IF NOT EXISTS (SELECT 1 FROM chunk_old o JOIN chunk_new n USING (id)
                       WHERE o.search_vector IS DISTINCT FROM n.search_vector) THEN
            RETURN NULL;
        END IF;
        changed := 'SELECT n.knowledge_base_id, n.search_vector, 1 AS sign
                      FROM chunk_old o JOIN chunk_new n USING (id)
                     WHERE o.search_vector IS DISTINCT FROM n.search_vector
                    UNION ALL
                    SELECT o.knowledge_base_id, o.search_vector, -1
                      FROM chunk_old o JOIN chunk_new n USING (id)
                     WHERE o.search_vector IS DISTINCT FROM n.search_vector';
    END IF;
    -- One (base, lexeme) row appears once in t, so the three writes below never touch
    -- the same row twice.
    EXECUTE format($q$
        WITH d AS MATERIALIZED (%s),
        t AS (
            SELECT d.knowledge_base_id, u.lexeme, sum(d.sign)::int AS n
            FROM d, unnest(d.search_vector) u
            GROUP BY 1, 2 HAVING sum(d.sign) <> 0
        ),
        up AS (
            INSERT INTO knowledge_term_stats AS s (knowledge_base_id, lexeme, df)
            SELECT knowledge_base_id, lexeme, n FROM t WHERE n > 0
            ORDER BY knowledge_base_id, lexeme
            ON CONFLICT (knowledge_base_id, lexeme) DO UPDATE SET df = s.df + EXCLUDED.df
        ),
        down AS (
            UPDATE knowledge_term_stats s SET df = s.df + t.n FROM t
            WHERE t.n < 0 AND s.knowledge_base_id = t.knowledge_base_id
              AND s.lexeme = t.lexeme AND s.df + t.n > 0
        ),
        gone AS (
            DELETE FROM knowledge_term_stats s USING t
            WHERE t.n < 0 AND s.knowledge_base_id = t.knowledge_base_id
              AND s.lexeme = t.lexeme AND s.df + t.n <= 0
        ),
        b AS (
            SELECT knowledge_base_id, sum(sign) AS chunks,
                   sum(sign * length(search_vector)) AS lexemes
            FROM d GROUP BY 1
            HAVING sum(sign) <> 0 OR sum(sign * length(search_vector)) <> 0
        ),
        b_up AS (
            INSERT INTO knowledge_base_text_stats AS s (knowledge_base_id, chunks, lexemes)
            SELECT * FROM b WHERE chunks > 0 ORDER BY 1
            ON CONFLICT (knowledge_base_id) DO UPDATE SET
                chunks = s.chunks + EXCLUDED.chunks, lexemes = s.lexemes + EXCLUDED.lexemes
        ),
        b_down AS (
            UPDATE knowledge_base_text_stats s
            SET chunks = s.chunks + b.chunks, lexemes = s.lexemes + b.lexemes FROM b
            WHERE b.chunks <= 0 AND s.knowledge_base_id = b.knowledge_base_id
              AND s.chunks + b.chunks > 0
        )
        DELETE FROM knowledge_base_text_stats s USING b
        WHERE b.chunks < 0 AND s.knowledge_base_id = b.knowledge_base_id
          AND s.chunks + b.chunks <= 0
    $q$, changed);
    RETURN NULL;
END $$;

CREATE TRIGGER knowledge_chunk_stats_insert AFTER INSERT ON knowledge_chunk
    REFERENCING NEW TABLE AS chunk_new
    FOR EACH STATEMENT EXECUTE FUNCTION knowledge_chunk_stats();
CREATE TRIGGER knowledge_chunk_stats_delete AFTER DELETE ON knowledge_chunk
    REFERENCING OLD TABLE AS chunk_old
    FOR EACH STATEMENT EXECUTE FUNCTION knowledge_chunk_stats();
CREATE TRIGGER knowledge_chunk_stats_update AFTER UPDATE ON knowledge_chunk
    REFERENCING OLD TABLE AS chunk_old NEW TABLE AS chunk_new
    FOR EACH STATEMENT EXECUTE FUNCTION knowledge_chunk_stats();
CREATE TRIGGER knowledge_chunk_stats_truncate AFTER TRUNCATE ON knowledge_chunk
    FOR EACH STATEMENT EXECUTE FUNCTION knowledge_chunk_stats();

-- The chunks already there.
INSERT INTO knowledge_term_stats (knowledge_base_id, lexeme, df)
SELECT c.knowledge_base_id, u.lexeme, count(*) FROM knowledge_chunk c, unnest(c.search_vector) u
GROUP BY 1, 2;
INSERT INTO knowledge_base_text_stats (knowledge_base_id, chunks, lexemes)
SELECT knowledge_base_id, count(*), sum(length(search_vector)) FROM knowledge_chunk GROUP BY 1;
"""

DROP = """
DROP TRIGGER IF EXISTS knowledge_chunk_stats_insert ON knowledge_chunk;
DROP TRIGGER IF EXISTS knowledge_chunk_stats_delete ON knowledge_chunk;
DROP TRIGGER IF EXISTS knowledge_chunk_stats_update ON knowledge_chunk;
DROP TRIGGER IF EXISTS knowledge_chunk_stats_truncate ON knowledge_chunk;
DROP FUNCTION IF EXISTS knowledge_chunk_stats();
DROP TABLE IF EXISTS knowledge_term_stats;
DROP TABLE IF EXISTS knowledge_base_text_stats;
"""


class Migration(migrations.Migration):
    dependencies = [("knowledge", "0008_job_lifecycle_status")]

    operations = [migrations.RunSQL(CREATE, DROP)]
