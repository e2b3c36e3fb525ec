"""The guard's pure functions on one body, as the proxy and the middleware call them: sites, apply_limits,
encode_body."""

from __future__ import annotations

import json

import pytest

from kvops.engines.tgi.api import ROUTES as TGI
from kvops.engines.vllm.api import ROUTES as VLLM
from kvops.policy import Level, load_policy
from kvops.watch.guard import BodyError, apply_limits, encode_body, parse_body, sites

POLICY = load_policy()


def test_each_instance_is_read_as_its_first_matching_variant():
    vertex = TGI.match("POST", "/vertex")
    body = {"instances": [{"inputs": "a", "parameters": {"max_new_tokens": 900}}, {"messages": []}, {"other": 1}]}
    found = sites(vertex, body)
    assert [site.fields for site in found] == [variant.fields for variant in vertex.variants]
    assert apply_limits(found, POLICY.limits(Level.WARN)) == ["max_tokens 900->512", "max_tokens unset->512"]
    assert body["instances"][0]["parameters"]["max_new_tokens"] == 512 and body["instances"][1]["max_tokens"] == 512


@pytest.mark.parametrize("instances", [None, {"inputs": "a"}, [{"inputs": "a"}, "b"]])
def test_instances_that_are_not_a_list_of_objects_are_refused(instances):
    with pytest.raises(BodyError, match='"instances" must be a list of JSON objects'):
        sites(TGI.match("POST", "/vertex"), {"instances": instances})


def test_a_clamped_body_is_compact_ascii_as_json_dumps_writes_it():
    body = parse_body(b'{"prompt": "caf\\u00e9 \\ud800", "max_tokens": 1024, "n": 3, "min_tokens": 800}')
    changes = apply_limits(sites(VLLM.match("POST", "/v1/completions"), body), POLICY.limits(Level.DEGRADE))
    assert changes == ["max_tokens 1024->512", "n 3->1", "min_tokens 800->512"]
    assert encode_body(body) == json.dumps(body, separators=(",", ":")).encode()
    assert encode_body(body) == b'{"prompt":"caf\\u00e9 \\ud800","max_tokens":512,"n":1,"min_tokens":512}'
