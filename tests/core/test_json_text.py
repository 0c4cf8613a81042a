"""JsonText: edits splice the text; every byte an edit does not touch stays as it came."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.json_text import JsonText

BODY = (
    '{ "model" : "m",\n  "messages": [ {"role":"system","content":"Tu es bref. \\u00e9"},'
    '{"role":"user","content":"olá"} ],\t"tools":[], "x":{"a":"é"} }\n'
)


def test_extend_string_keeps_the_escapes_and_spacing():
    edited = JsonText(BODY).extend_string(("messages", 0, "content"), "\n\nmémoire")
    assert edited.text == BODY.replace('\\u00e9"', '\\u00e9\\n\\nmémoire"')
    assert edited.data["messages"][0]["content"] == "Tu es bref. é\n\nmémoire"


def test_insert_append_set_and_remove():
    text = JsonText(BODY)
    first = text.insert(("messages",), 0, {"role": "system", "content": "é"})
    assert first.text == BODY.replace(
        '[ {"role":"system"', '[ {"role":"system","content":"é"},{"role":"system"'
    )
    assert text.append(("tools",), {"a": 1}, 2).text == BODY.replace(
        '"tools":[]', '"tools":[{"a":1},2]'
    )
    assert text.append(("messages",), 1).text == BODY.replace('"olá"} ]', '"olá"},1 ]')
    assert text.set(("model",), "n").text == BODY.replace('"m"', '"n"')
    assert text.set(("memories",), []).text == BODY.replace('"é"} }\n', '"é"},"memories":[] }\n')
    assert text.set(("x", "a"), 1).text == BODY.replace('"a":"é"', '"a":1')
    assert JsonText("{}").set(("a",), 1).text == '{"a":1}'
    assert text.remove(("model",)).text == BODY.replace('"model" : "m",\n  ', "")
    assert text.remove(("x",)).text == BODY.replace(',\t"tools":[], "x":{"a":"é"}', ',\t"tools":[]')
    assert text.remove(("nothing",)).text == BODY
    assert text.remove(("messages", 1)).text == BODY.replace(',{"role":"user","content":"olá"}', "")
    assert JsonText('{"a":1}').remove(("a",)).text == "{}"
    # an item is removed once: the one after it moves into its place and stays
    assert JsonText('{"a":[1,2,3]}').remove(("a", 0)).text == '{"a":[2,3]}'
    assert JsonText('{"a":[1,2,3]}').remove(("a", 1)).text == '{"a":[1,3]}'
    assert JsonText('{"a":[1,2,3]}').remove(("a", -1)).text == '{"a":[1,2]}'
    assert JsonText('{"a":[1,2,3]}').remove(("a", 3)).text == '{"a":[1,2,3]}'
    assert JsonText('{"a":1,"b":2,"a":3}').remove(("a",)).text == '{"b":2}'
    assert JsonText('{"a":1,"a":3}').set(("a",), 4).text == '{"a":1,"a":4}'  # the last wins
    with pytest.raises(KeyError):
        text.set(("messages", 5), 1)
    with pytest.raises(KeyError):
        text.extend_string(("model", "x"), "y")


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(st.dictionaries(st.text(max_size=4), values, max_size=4), st.text(max_size=3), values,
       st.sampled_from([None, 0, 2]), st.booleans())  # fmt: skip
def test_edits_match_the_same_edits_on_the_parsed_value(doc, key, value, indent, ascii_):
    text = JsonText(json.dumps(doc, indent=indent, ensure_ascii=ascii_))
    expected = {**doc, key: value}
    assert json.loads(text.set((key,), value).text) == expected
    assert json.loads(text.remove((key,)).text) == {k: v for k, v in doc.items() if k != key}
    listed = JsonText(json.dumps({"l": [doc, value]}, indent=indent, ensure_ascii=ascii_))
    assert json.loads(listed.append(("l",), key).text) == {"l": [doc, value, key]}
    assert json.loads(listed.insert(("l",), 0, key).text) == {"l": [key, doc, value]}
    assert json.loads(listed.insert(("l",), 1, key).text) == {"l": [doc, key, value]}
