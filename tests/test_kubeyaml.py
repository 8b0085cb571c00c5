"""The CLI reads YAML as kubectl does. Each row was checked against kubectl v1.36.3 (kubectl create
--dry-run=server -o json against a real API server, on a CRD with string and integer fields)."""

from __future__ import annotations

import pytest

from triton_operator.kubeyaml import MAX_DEPTH, KubeYAMLError, load_all


@pytest.mark.parametrize("text, value", [
    ("v: y", True),                       # go-yaml v2's booleans include y/n, unlike PyYAML
    ("v: N", False),
    ("v: 'y'", "y"),
    ("v: 2024-01-01", "2024-01-01"),      # timestamps stay strings
    ("v: 1:20", "1:20"),                  # no sexagesimal numbers
    ("v: '='", "="),
    ("v: 12abc", "12abc"),
    ("v: 1.0", 1),                        # Go's JSON encoder writes an integral float as an integer
    ("v: 1.5", 1.5),
    ("v: 1e3", 1000),                     # a YAML-style float without a dot
    ("v: 017", 15),                       # octal, as Go's ParseInt(s, 0, 64)
    ("v: 08", 8),                         # not octal: a float 8, sent as 8
    ("v: 0o17", 15),
    ("v: 0x1F", 31),
    ("v: 1_000", 1000),
    ("v: 18446744073709551615", 1.8446744073709552e19),  # beyond int64: the API server reads a float
])
def test_scalars_read_as_kubectl_reads_them(text, value):
    got = load_all(text)[0]["v"]
    assert got == value and type(got) is type(value)


def test_keys_become_strings_as_kubectl_sends_them():
    assert load_all("1: a\nn: b\n2.0: c") == [{"1": "a", "false": "b", "2": "c"}]
    # kubectl reads a stream that starts with "{" as JSON, where such keys are an error
    with pytest.raises(KubeYAMLError, match="not valid JSON"):
        load_all("{1: a}")


def test_json_streams_and_lists():
    assert load_all('{"a": 1.0, "b": "\\u007f"} {"c": [1.5]}') == [{"a": 1, "b": "\x7f"}, {"c": [1.5]}]
    assert load_all("apiVersion: v1\nkind: List\nitems: [{a: 1}, null, {b: 2}]") == [{"a": 1}, {"b": 2}]
    assert load_all('{"a": "x\\ud83dy"}') == [{"a": "x\ufffdy"}]  # a lone surrogate, as Go decodes it


@pytest.mark.parametrize("text, words", [
    ("&a [*a]", "nests deeper"),
    ("[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5), "nests deeper"),
    ("a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
     "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]",
     "more than"),
    ("v: !!binary aGVsbG8=", "binary"),
    ('{"a": NaN}', "NaN is not a JSON value"),
    ('{"a": ', "not valid JSON"),
])
def test_hostile_documents_are_refused_with_a_reason(text, words):
    with pytest.raises(KubeYAMLError, match=words):
        load_all(text)
