"""An end user made by a chat request that then fails is taken back (``end_user_unmake``)
only while it is still that request's: another use claims it first, and a row that
refers to it keeps it. (A first attempt deleted the end user a concurrent retry had just
found, whose turn was then dropped as erased.)"""

from __future__ import annotations

import uuid

import pytest

from memories.facts.models import FactLink, Scope
from memories.facts.scopes import end_user_ensure, end_user_unmake, scope_ensure
from memories.facts.services import FactIn, fact_add

pytestmark = pytest.mark.django_db(transaction=True)  # (the delete's foreign keys at commit)


def test_the_request_that_made_it_takes_it_back(alice):
    token = uuid.uuid4()
    made = end_user_ensure(owner=alice, external_id="u1", made_by=token)
    assert end_user_unmake(made, uuid.uuid4()) is False  # another request's token
    assert Scope.objects.filter(pk=made.pk).exists()
    assert end_user_unmake(made, token) is True
    assert not Scope.objects.filter(external_id="u1").exists()
    assert end_user_unmake(made, token) is False  # (twice: nothing more)


@pytest.mark.parametrize("door", ["chat", "api"])
def test_a_use_by_another_request_claims_it(alice, door):
    """The retry found the end user the failing request had made: it is the retry's
    now, and the failed request's take-back deletes nothing."""
    token = uuid.uuid4()
    made = end_user_ensure(owner=alice, external_id="u1", made_by=token)
    if door == "chat":
        found = end_user_ensure(owner=alice, external_id="u1", made_by=uuid.uuid4())
    else:
        found = scope_ensure(owner=alice, scope=("user", "u1"))
    assert found.pk == made.pk and found.made_by is None
    assert end_user_unmake(made, token) is False
    assert Scope.objects.get(pk=made.pk).made_by is None


def test_the_same_request_finds_its_own(alice):
    token = uuid.uuid4()
    made = end_user_ensure(owner=alice, external_id="u1", made_by=token)
    again = end_user_ensure(owner=alice, external_id="u1", made_by=token)
    assert again.pk == made.pk and again.made_by == token
    assert end_user_unmake(made, token) is True


def test_taken_back_before_the_other_use_it_is_made_again(alice):
    token = uuid.uuid4()
    made = end_user_ensure(owner=alice, external_id="u1", made_by=token)
    assert end_user_unmake(made, token) is True
    again = end_user_ensure(owner=alice, external_id="u1")
    assert again.pk != made.pk and again.made_by is None
    assert list(Scope.objects.values_list("external_id", flat=True)) == ["u1"]


def test_what_refers_to_it_keeps_it(alice, fixture_embedder):
    token = uuid.uuid4()
    made = end_user_ensure(owner=alice, external_id="u1", made_by=token)
    # (a fact added to the row itself, which does not claim it)
    fact_add(owner=alice, scope=made, facts=[FactIn("User drinks green tea every morning")])
    assert Scope.objects.get(pk=made.pk).made_by == token
    assert end_user_unmake(made, token) is False
    assert FactLink.objects.filter(scope=made).count() == 1
    assert Scope.objects.filter(pk=made.pk).exists()
