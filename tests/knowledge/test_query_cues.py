"""What a query names lifts the rows it points at (issue 25): the periods read out of a
question lift the turns said then (and an end user's facts observed then), the one speaker
it names lifts their turns; a document base is never lifted."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from django.db import connection, transaction

from core import tenancy
from knowledge import search
from knowledge.models import Chunk
from knowledge.retrieval import dates
from knowledge.retrieval.dates import periods
from knowledge.search import SearchRequest, search_chunks
from memories.facts.scopes import end_user_ensure
from memories.facts.search import fact_search
from tests.knowledge.factories import ingest, make_kb
from tests.memories.facts.seed import seed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("When did Melanie go camping in June?", [(0, 6, 0)]),
        ("What did she show him on October 13, 2023?", [(2023, 10, 13)]),
        ("What did Gina find on 1 February, 2023?", [(2023, 2, 1)]),
        ("the 13th of October", [(0, 10, 13)]),
        ("Oct. 13th and Sept 2, 2024", [(0, 10, 13), (2024, 9, 2)]),
        ("What setback did she face in October 2023?", [(2023, 10, 0)]),
        ("How often did he go to the beach in 2023?", [(2023, 0, 0)]),
        ("on 2023-05-23", [(2023, 5, 23)]),
        ("in mid-July, and again in July", [(0, 7, 0)]),  # once each
        ("between March 3 and in 2024", [(0, 3, 3), (2024, 0, 0)]),
        ("February 29, 2024", [(2024, 2, 29)]),
        ("in December 2022", [(2022, 12, 0)]),
        # Not dates: a modal verb, a name, a count, a day no month has.
        ("May I ask what June said about March?", []),
        ("I ate 2000 calories", []),
        ("a diet of 2000 calories", []),
        ("In June, where did we go?", [(0, 6, 0)]),
        ("IN 2023 and during 2024", [(2023, 0, 0), (2024, 0, 0)]),
        ("on 2023-00-05", []),
        ("on 2023-10-00 or 2023-13-01", []),
        ("October 0", []),
        ("February 29, 2023", []),
        ("The 2023 report", []),
        ("February 30, 2023", []),
        ("", []),
    ],
)
def test_the_periods_a_query_names(text, expected):
    assert periods(text) == expected


def _turns(kb, turns: list[tuple[str, str, str]]) -> None:
    """One session a turn (no neighbour lends it context): (key, text, ISO time)."""
    ingest(kb, *((k, text, {"session_id": k, "timestamp": at}) for k, text, at in turns))


def _scores(kb, **request) -> dict[str, float]:
    hits = search_chunks(bases=[kb], request=SearchRequest(top_k=20, **request))
    return {h.metadata["source_key"].split("#")[0]: h.score for h in hits}


def _lifted(plain: dict[str, float], keys: set[str], lift: float = 0.3) -> dict[str, float]:
    return {k: (s + lift * (1 - s) if k in keys else s) for k, s in plain.items()}


TURNS = [
    ("june", "Mel: we went camping by the lake, lovely", "2023-06-27T10:00:00+00:00"),
    ("july", "Mel: we went camping by the lake, it was lovely again", "2023-07-03T10:00:00+00:00"),
    ("august", "Mel: we went camping by the lake, it was lovely", "2023-08-14T10:00:00+00:00"),
    ("other", "Mel: the pottery class starts tomorrow", "2023-06-20T10:00:00+00:00"),
]


def test_a_month_lifts_the_turns_said_in_it_or_in_the_week_after(alice):
    kb = make_kb(alice)
    _turns(kb, TURNS)
    query = "Did we go camping in June?"
    plain = _scores(kb, query=query, query_cues=False)
    lifted = _scores(kb, query=query)
    # June's turns, and July's 3rd (within 7 days of June's end), are lifted to exactly
    # s + 0.3 x (1 - s) of their own scores; August's is not.
    assert lifted == pytest.approx(_lifted(plain, {"june", "july", "other"}), abs=1e-12)
    assert lifted["august"] == plain["august"]
    assert next(iter(lifted)) in ("june", "july")
    assert all(0.0 <= s <= 1.0 for s in lifted.values())


def test_a_day_with_its_year_lifts_only_that_day_and_the_days_after(alice):
    kb = make_kb(alice)
    _turns(
        kb,
        [
            ("best", "Ann: my painting, the painting of the sunset", "2023-09-01T08:00:00+00:00"),
            ("before", "Ann: the painting of the sunset, pink", "2023-10-12T23:59:00+00:00"),
            ("day", "Ann: the painting of the sunset, gold", "2023-10-13T08:00:00+00:00"),
            ("week", "Ann: the painting of the sunset, red", "2023-10-20T08:00:00+00:00"),
            ("later", "Ann: the painting of the sunset, blue", "2023-10-21T08:00:00+00:00"),
            ("year", "Ann: the painting of the sunset, grey", "2022-10-13T08:00:00+00:00"),
        ],
    )
    query = "What painting was shown on October 13, 2023?"
    plain = _scores(kb, query=query, query_cues=False)
    lifted = _scores(kb, query=query)
    moved = {k for k in plain if lifted[k] != plain[k]}
    assert moved == {"day", "week"}
    # Without its year the day matches in any year.
    query = "What painting was shown on October 13?"
    plain = _scores(kb, query=query, query_cues=False)
    any_year = _scores(kb, query=query)
    assert {k for k in plain if any_year[k] != plain[k]} == {"day", "week", "year"}


@pytest.mark.parametrize(
    ("query", "lifted"),
    [
        # up to 7 days after: January 6 is the 7th day after December 30
        ("the fireworks on December 30", {"dec30", "jan5", "jan6"}),
        ("the fireworks in December", {"dec1", "dec30", "jan5", "jan6", "jan7"}),
        ("the fireworks in 2023", {"nov", "dec1", "dec30", "jan5", "jan6", "jan7"}),
        ("the fireworks in December 2022", set()),
        ("the fireworks on January 6", {"jan6", "jan7"}),
    ],
)
def test_the_days_after_a_period_reach_into_the_next_year(alice, query, lifted):
    kb = make_kb(alice)
    _turns(
        kb,
        [
            ("dec1", "Ann: fireworks, the first", "2023-12-01T08:00:00+00:00"),
            ("dec30", "Ann: fireworks, the best", "2023-12-30T08:00:00+00:00"),
            ("jan5", "Ann: fireworks, what a show", "2024-01-05T08:00:00+00:00"),
            ("jan6", "Ann: fireworks again, a late one", "2024-01-06T08:00:00+00:00"),
            ("jan7", "Ann: fireworks, the last ones", "2024-01-07T08:00:00+00:00"),
            ("nov", "Ann: fireworks, early", "2023-11-20T08:00:00+00:00"),
        ],
    )
    plain = _scores(kb, query=query, query_cues=False)
    lifted_now = _scores(kb, query=query)
    assert len(plain) == 6
    assert lifted_now == pytest.approx(_lifted(plain, lifted), abs=1e-12)


def test_the_lift_can_change_the_order(alice):
    kb = make_kb(alice)
    _turns(
        kb,
        [
            ("close", "Mel: we went camping, camping is the best", "2023-08-14T10:00:00+00:00"),
            ("june", "Mel: a weekend by the lake with a tent", "2023-06-27T10:00:00+00:00"),
            ("lake", "Mel: the lake was cold", "2023-09-27T10:00:00+00:00"),
            ("other", "Mel: pottery class starts tomorrow", "2023-05-20T10:00:00+00:00"),
        ],
    )
    query = "camping by the lake in June"
    assert list(_scores(kb, query=query, query_cues=False)) == ["close", "lake", "june", "other"]
    assert list(_scores(kb, query=query)) == ["close", "june", "lake", "other"]


def test_documents_are_never_lifted(alice):
    """A chunk without a session is a document's: its timestamp, given or its ingestion
    time, is not when its text was said."""
    kb = make_kb(alice)
    ingest(
        kb,
        ("report", "The annual report for 2023 lists revenue by region."),
        (
            "plan",
            "The plan for June covers the office move.",
            {"timestamp": "2023-06-02T00:00:00Z"},
        ),
        ("now", "The plan for this year covers hiring."),
    )
    year = Chunk.objects.get(knowledge_base=kb, source_key="now#0").source_timestamp.year
    for query in ("the report in 2023", "the plan in June", f"the plan in {year}"):
        assert _scores(kb, query=query) == _scores(kb, query=query, query_cues=False)


@pytest.mark.parametrize("extra", [{"rrf_k": 60}, {"mode": "vector"}, {"mode": "keyword"}])
def test_no_lift_where_scores_are_no_fusions(alice, extra):
    kb = make_kb(alice)
    _turns(kb, TURNS)
    query = "Did we go camping in June?"
    assert _scores(kb, query=query, **extra) == _scores(kb, query=query, query_cues=False, **extra)


def test_the_lift_is_a_constant_of_the_engine(alice, monkeypatch):
    kb = make_kb(alice)
    _turns(kb, TURNS)
    query = "Did we go camping in June?"
    plain = _scores(kb, query=query, query_cues=False)
    monkeypatch.setattr(dates, "LIFT", 0.5)
    lifted = _scores(kb, query=query)
    assert lifted["june"] == pytest.approx(plain["june"] + 0.5 * (1 - plain["june"]), abs=1e-12)
    # The lift is applied before context: a turn lends its lifted score.
    monkeypatch.setattr(dates, "LIFT", 0.3)
    with monkeypatch.context() as m:
        m.setattr(search, "CHUNKS", replace(search.CHUNKS, event_time=""))
        assert _scores(kb, query=query) == plain


def test_a_lifted_turn_lends_its_lifted_score_to_its_neighbours(alice):
    kb = make_kb(alice)
    ingest(
        kb,
        (
            "q",
            "Ann: how was the trip?",
            {"session_id": "s", "timestamp": "2023-06-27T10:00:00+00:00"},
        ),
        (
            "a",
            "Mel: camping by the lake",
            {"session_id": "s", "timestamp": "2023-06-27T10:00:01+00:00"},
        ),
        (
            "x",
            "Mel: camping at the lake",
            {"session_id": "t", "timestamp": "2023-09-01T10:00:00+00:00"},
        ),
    )
    query = "camping lake in June"
    plain = _scores(kb, query=query, query_cues=False)
    lifted = _scores(kb, query=query)
    assert lifted["q"] > plain["q"]  # (lifted itself, and lent more by its lifted neighbour)
    assert lifted["x"] == plain["x"]


def test_the_api_takes_query_cues_as_a_boolean(alice, alice_client):
    kb = make_kb(alice)
    _turns(kb, TURNS)
    url = f"/api/v1/knowledge-bases/{kb.pk}/search"
    body = {"query": "Did we go camping in June?", "top_k": 4}
    on = alice_client.post(url, body, format="json").json()["results"]
    off = alice_client.post(url, {**body, "query_cues": False}, format="json").json()["results"]
    assert {r["metadata"]["source_key"][:-2]: r["score"] for r in on} == pytest.approx(
        _scores(kb, query=body["query"])
    )
    assert [r["score"] for r in off] == sorted(
        _scores(kb, query=body["query"], query_cues=False).values(), reverse=True
    )
    chunks = Chunk.objects.filter(knowledge_base=kb).count()
    response = alice_client.post(url, {**body, "query_cues": "yes"}, format="json")
    assert response.status_code == 400
    assert "query_cues" in response.json()["error"]["details"]
    assert Chunk.objects.filter(knowledge_base=kb).count() == chunks


def test_a_chat_stored_with_senders_through_the_api(alice, alice_client):
    """As an application stores a chat: each message a document with its sender and
    session in metadata, no name in its text; the question names one sender."""
    kb = make_kb(alice)
    url = f"/api/v1/knowledge-bases/{kb.pk}"
    documents = [
        {"text": text, "source_key": key, "metadata": {"sender": who, "session_id": "chat-1"}}
        for key, text, who in [
            ("m1", "I finally booked the cabin by the lake", "Ann"),
            ("m2", "I booked a cabin by the lake last year too", "Bob"),
            ("m3", "The pottery class is on Tuesday", "Ann"),
        ]
    ]
    response = alice_client.post(f"{url}/documents", {"documents": documents}, format="json")
    assert response.status_code == 201, response.json()
    body = {"query": "What did Ann book by the lake?", "top_k": 3}
    on = alice_client.post(f"{url}/search", body, format="json").json()["results"]
    off = alice_client.post(f"{url}/search", {**body, "query_cues": False}, format="json")
    off_scores = {r["metadata"]["source_key"][:-2]: r["score"] for r in off.json()["results"]}
    on_scores = {r["metadata"]["source_key"][:-2]: r["score"] for r in on}
    assert [r["metadata"]["source_key"][:-2] for r in on][:1] == ["m1"]
    assert on_scores["m1"] == off_scores["m1"] == 1.0  # (the best of both legs: 1 lifted is 1)
    assert on_scores["m3"] > off_scores["m3"]  # Ann's other turn, lifted
    assert on_scores["m2"] == off_scores["m2"]  # Bob's: not lifted (its best donor is m1)


def test_a_date_lifts_the_facts_observed_then(alice, monkeypatch):
    """Facts are a collection of the same engine: their ``observed_at`` is when they were
    said."""
    user = end_user_ensure(owner=alice, external_id="u1")
    seed(user, "User went sailing near Lisbon", observed_at=datetime(2023, 3, 10, tzinfo=UTC))
    seed(user, "User went sailing with friends", observed_at=datetime(2023, 8, 1, tzinfo=UTC))
    seed(user, "User bought a violin", observed_at=datetime(2023, 3, 20, tzinfo=UTC))

    def scores() -> dict[str, float]:
        query = "Where did I go sailing in March?"
        found = fact_search(owner=alice, scope=user, query=query, half_life_days=0)
        return {h.content: h.score for h in found.hits}

    lifted = scores()
    monkeypatch.setattr(dates, "LIFT", 0.0)
    plain = scores()
    assert set(lifted) == set(plain) and len(plain) == 3
    for content in ("User went sailing near Lisbon", "User bought a violin"):
        assert lifted[content] == pytest.approx(plain[content] + 0.3 * (1 - plain[content]))
    assert lifted["User went sailing with friends"] == plain["User went sailing with friends"]


def test_the_windows_the_engine_tests():
    d = dates.Dated(((2023, 12, 0), (0, 6, 0), (0, 10, 13), (2024, 2, 29), (2022, 0, 0)))
    assert d.windows() == (
        "{[2022-01-01,2023-01-08),[2023-12-01,2024-01-08),[2024-02-29,2024-03-08)}",
        [6],
        [(10, 13)],
    )
    with pytest.raises(ValueError):
        dates.Dated(((0, 6, 0),), grace=28)


CHAT = [
    ("a1", "Ann: we went camping by the lake", "2023-06-27T10:00:00+00:00"),
    ("b1", "Bob: camping sounds lovely, where was it?", "2023-06-27T10:00:01+00:00"),
    ("a2", "Ann: the lake is two hours north", "2023-06-27T10:00:02+00:00"),
    ("b2", "Bob: I went camping in the hills last year", "2023-07-20T10:00:00+00:00"),
    ("a3", "Ann: pottery class starts tomorrow", "2023-07-20T10:00:01+00:00"),
    ("b3", "Bob: good luck with the pottery", "2023-07-20T10:00:02+00:00"),
]


def _chat(kb) -> None:
    """``CHAT``, each turn a session of its own: no turn lends another context."""
    _turns(kb, CHAT)


def test_the_one_speaker_a_query_names_lifts_their_turns(alice):
    kb = make_kb(alice)
    _chat(kb)
    query = "Where has Ann gone camping?"
    plain = _scores(kb, query=query, query_cues=False)
    assert len(plain) == 6
    assert _scores(kb, query=query) == pytest.approx(_lifted(plain, {"a1", "a2", "a3"}), abs=1e-12)
    # Both speakers named: neither is lifted.
    query = "Where have Ann and Bob gone camping?"
    assert _scores(kb, query=query) == _scores(kb, query=query, query_cues=False)


def test_a_speaker_and_a_date_combine(alice):
    kb = make_kb(alice)
    _chat(kb)
    query = "Where did Ann go camping in June?"
    plain = _scores(kb, query=query, query_cues=False)
    both = 1 - (1 - 0.3) * (1 - 0.3)
    expected = _lifted(_lifted(plain, {"a3"}), {"b1"})  # (one of the two each)
    expected |= {k: s + both * (1 - s) for k, s in plain.items() if k in ("a1", "a2")}
    assert _scores(kb, query=query) == pytest.approx(expected, abs=1e-12)


def test_a_turns_sender_is_its_speaker(alice):
    kb = make_kb(alice)
    turns = [
        ("n1", "Note: Ann went camping by the lake", "ann"),
        ("n2", "Note: Ann asked Bob about camping", "bob"),
        ("n3", "Note: pottery class for Ann", "bob"),
    ]
    ingest(
        kb,
        *(
            (k, text, {"session_id": "s", "sender": sender, "timestamp": f"2023-06-0{i}T10:00:00Z"})
            for i, (k, text, sender) in enumerate(turns, 1)
        ),
    )
    query = "Where did Ann go camping?"
    plain = _scores(kb, query=query, query_cues=False)
    assert _scores(kb, query=query) == pytest.approx(_lifted(plain, {"n1"}), abs=1e-12)


# A chat stored with its senders, as a memory base stores messages: no name in the text.
SENT = [
    ("a1", "we went camping by the lake", "Ann"),
    ("b1", "camping sounds lovely, where was it?", "bob"),
    ("a2", "the lake is two hours north", "Ann"),
    ("b2", "I went camping in the hills last year", "bob"),
    ("a3", "pottery class starts tomorrow", "Ann"),
    ("b3", "good luck with the pottery", "bob"),
]


def _sent(kb, *, session: bool = True) -> None:
    ingest(
        kb,
        *(
            (k, text, {"sender": sender, "timestamp": f"2023-06-0{i}T10:00:00Z"}
             | ({"session_id": k} if session else {}))
            for i, (k, text, sender) in enumerate(SENT, 1)
        ),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("query", "lifted"),
    [
        ("Where has Ann gone camping?", {"a1", "a2", "a3"}),
        ("Has Bob been camping?", {"b1", "b2", "b3"}),
    ],
)
def test_a_sender_the_query_names_is_its_speaker(alice, query, lifted):
    """The names are in no turn's text (so none is common): the sender makes the speaker,
    as the query writes the name or in lower case; the vector leg leaves it out too."""
    kb = make_kb(alice)
    _sent(kb)
    name = "Ann" if "Ann" in query else "Bob"
    assert search.query_names([kb], query) == search.Names(
        frozenset({name}), frozenset({name.lower()})
    )
    assert search.vector_text([kb], query) == " ".join(query.replace(name, "").split())
    plain = _scores(kb, query=query, query_cues=False)
    assert len(plain) == 6
    assert _scores(kb, query=query) == pytest.approx(_lifted(plain, lifted), abs=1e-12)


@pytest.mark.parametrize("query", ["Where has ANN gone camping?", "Where has ann's tent gone?"])
def test_a_sender_in_other_capitals(alice, query):
    """A query word in capitals finds the capitalised sender (``Ann``), and a lower-case
    word is no name at all."""
    kb = make_kb(alice)
    _sent(kb)
    expected = search.Names(frozenset({"ANN"}), frozenset({"ann"})) if "ANN" in query else None
    assert search.query_names([kb], query) == (expected or search.NO_NAMES)


def test_two_senders_named_lift_neither(alice):
    kb = make_kb(alice)
    _sent(kb)
    query = "What did Ann tell Bob about camping?"
    assert search.query_names([kb], query).speakers == {"ann", "bob"}
    assert _scores(kb, query=query) == _scores(kb, query=query, query_cues=False)


def test_a_common_name_that_sends_nothing_is_no_speaker_beside_a_sender(alice):
    """In a chat about a shop, the shop's name is common (and left out of the vector
    query); the sender is the one speaker the query names."""
    kb = make_kb(alice)
    _sent(kb)
    ingest(
        kb,
        ("d1", "Decathlon has tents on sale", {"session_id": "d1", "sender": "bob"}),
        ("d2", "the Decathlon by the lake", {"session_id": "d2", "sender": "Ann"}),
    )
    query = "What did Ann buy at Decathlon?"
    names = search.query_names([kb], query)
    assert names == search.Names(frozenset({"Ann", "Decathlon"}), frozenset({"ann"}))
    plain = _scores(kb, query=query, query_cues=False)
    assert _scores(kb, query=query) == pytest.approx(
        _lifted(plain, {"a1", "a2", "a3", "d2"} & set(plain)), abs=1e-12
    )


def test_a_documents_sender_is_no_speaker(alice):
    kb = make_kb(alice)
    _sent(kb, session=False)  # (documents: no session)
    query = "Where has Ann gone camping?"
    assert search.query_names([kb], query) == search.NO_NAMES
    assert search.vector_text([kb], query) == query
    assert _scores(kb, query=query) == _scores(kb, query=query, query_cues=False)


def test_another_bases_sender_is_no_speaker(alice):
    kb, other = make_kb(alice), make_kb(alice, name="other")
    _sent(other)
    ingest(kb, ("k1", "we went camping by the lake", {"session_id": "s", "sender": "Cy"}))
    assert search.query_names([kb], "Where has Ann gone camping?") == search.NO_NAMES


def test_a_sender_is_looked_up_through_the_index(alice):
    """One index lookup per spelling of a name, under row-level security (which keeps an
    index on ``lower(sender)`` from serving it: ``lower`` is not leakproof): a first
    version read every turn of the base to answer no."""
    kb = make_kb(alice)
    ingest(kb, *((f"t{i}", f"turn {i}", {"session_id": "s", "sender": "bob"}) for i in range(300)))
    ids = [str(kb.pk)]
    params = [["Ann"], ids, ids, "english", ids]
    with connection.cursor() as cur:
        # The planner's figures as production has them: without them, its guess (or what
        # autovacuum happened to sample of other tests' rows) may pick the base's index.
        cur.execute("ANALYZE knowledge_chunk")
    with tenancy.as_owner(alice.pk), transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")  # (a test's table is small)
        cur.execute("EXPLAIN (ANALYZE, COSTS OFF) " + search._SHARES_SQL, params)
        plan = "\n".join(row[0] for row in cur.fetchall())
    chunk_scans = [block for block in plan.split("->") if " on knowledge_chunk c" in block]
    assert len(chunk_scans) == 1, plan
    assert "chunk_kb_turn_sender" in chunk_scans[0], plan
    assert "sender)::text = ANY (ARRAY[w.word" in chunk_scans[0].split("Filter")[0], plan
    assert "Rows Removed" not in chunk_scans[0], plan


def test_a_documents_opening_name_is_no_speaker(alice):
    kb = make_kb(alice)
    ingest(kb, *((k, text) for k, text, _ in CHAT))  # (no session: documents)
    query = "Where has Ann gone camping?"
    assert _scores(kb, query=query) == _scores(kb, query=query, query_cues=False)


TIMES = [
    ("weekend", "Ann: we went camping by the lake last weekend", "2023-06-27T10:00:00+00:00"),
    ("ago", "Bob: I went camping in the hills two years ago", "2023-06-28T10:00:00+00:00"),
    ("plain", "Ann: camping by the lake is my favourite", "2023-06-29T10:00:00+00:00"),
    ("next", "Bob: we go camping again next month", "2023-06-30T10:00:00+00:00"),
    ("other", "Ann: the pottery class was fun", "2023-07-01T10:00:00+00:00"),
]


@pytest.mark.parametrize(
    "query",
    [
        "When did we go camping?",
        "what year did we go camping",
        "How long ago was camping?",
        "In which month did we go camping?",
        "How many weeks ago did we go camping?",
    ],
)
def test_a_question_asking_when_lifts_the_turns_that_tell_a_time(alice, query):
    kb = make_kb(alice)
    _turns(kb, TIMES)
    plain = _scores(kb, query=query, query_cues=False)
    assert len(plain) == 5
    lifted = _lifted(plain, {"weekend", "ago", "next"}, lift=0.2)
    assert _scores(kb, query=query) == pytest.approx(lifted, abs=1e-12)


@pytest.mark.parametrize(
    "query",
    [
        "Where did we go camping?",
        "Whenever we go camping, who comes?",
        "How long have we gone camping for?",
    ],
)
def test_a_question_not_asking_when_lifts_no_time(alice, query):
    kb = make_kb(alice)
    _turns(kb, TIMES)
    assert _scores(kb, query=query) == _scores(kb, query=query, query_cues=False)


ASKING_WHEN = [
    "When did we go camping?",
    "  when is the party?",
    "What year did Ann move?",
    "In what year was it?",
    "In which month did Ann move?",
    "Which weekend did we hike?",
    "On what date did they marry?",
    "What time is the class?",
    "Since when has Bob painted?",
    "How long ago was camping?",
    "How many years ago did Bob start?",
]
NOT_ASKING_WHEN = [
    "Whenever we go camping, who comes?",
    "What did Ann say when we met?",  # (when, but not what the question asks)
    "What timeline do we have?",
    "Which days are open?",
    "Which months are warm?",
    "In what way did it help?",
    "How long has Bob painted?",  # (a duration: its answer tells none of TIME_WORDS)
    "Where did we go camping?",
    "Which week-long course did Ann take?",
    "What date-night idea did Bob like?",
    "What year's festival was the best?",
    "What season is her favourite?",
]


@pytest.mark.parametrize("query", ASKING_WHEN)
def test_the_forms_of_a_question_asking_when(query):
    assert search._ASKS_WHEN.search(query)


@pytest.mark.parametrize("query", NOT_ASKING_WHEN)
def test_questions_that_do_not_ask_when(query):
    assert not search._ASKS_WHEN.search(query)


def test_a_document_that_tells_a_time_is_not_lifted(alice):
    kb = make_kb(alice)
    ingest(kb, *((k, text) for k, text, _ in TIMES))
    query = "When did we go camping?"
    assert _scores(kb, query=query) == _scores(kb, query=query, query_cues=False)


@pytest.mark.django_db
def test_the_time_words_are_english_lexemes():
    """``TIME_WORDS`` is cast to a tsquery as written, so each word must be its own English
    stem ("morn", not "morning"), or it would match no turn."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT to_tsquery('english', %s)::text, %s::tsquery::text", [search.TIME_WORDS] * 2
        )
        stemmed, written = cur.fetchone()
    assert stemmed == written
