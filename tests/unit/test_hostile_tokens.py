"""`kvops tokens` with hostile tokenizer files (issue 23): a chat template is code from the tokenizer folder, run in
jinja2's sandbox and bounded here in loops, output and what one `*` or `**` builds; whatever it raises, and whatever
tokenizer_config.json holds, is one line naming the folder. A FIFO named tokenizer.json is refused, not waited on."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.support.hostile import deadline

pytest.importorskip("tokenizers", reason="kvops tokens needs tokenizers (pip install 'kvops[hub]')")
pytest.importorskip("jinja2", reason="kvops tokens needs jinja2 (pip install 'kvops[hub]')")

TEMPLATES = {
    "loops of 10**10 steps": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "a gigabyte string": "{{ 'x' * 1000000000 }}",
    "a power tower": "{{ 10 ** 10 ** 10 }}",
    "a list of a billion": "{{ [0] * 1000000000 }}",
    "a type error": "{{ messages + 1 }}",
    "a syntax error": "{% for %}",
    "a division by zero": "{{ 1 / 0 }}",
    "unbounded recursion": "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}",
    "a template that is a number": 5,
    "named templates of numbers": [{"name": "default", "template": 5}],
    "named templates that are not objects": [1, 2],
    "raise_exception": "{{ raise_exception('no system role') }}",
}


@pytest.fixture
def folder(tiny_model, tmp_path):
    copy = tmp_path / "tokenizer"
    shutil.copytree(tiny_model, copy)
    return copy


def with_template(folder, template):
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "chat_template": template}))


@pytest.mark.parametrize("template", list(TEMPLATES.values()), ids=list(TEMPLATES))
def test_a_hostile_chat_template_is_one_line(run_kvops, folder, tmp_path, template):
    with_template(folder, template)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("hello")
    with deadline(120):
        ran = run_kvops("tokens", "--tokenizer", str(folder), "--chat-template", str(prompt), expect=1)
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kvops: error: {folder}") and "Traceback" not in ran.stderr


def test_the_template_bounds_say_which(run_kvops, folder, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("hello")
    for template, message in [
        (TEMPLATES["loops of 10**10 steps"], "its loops run more than 1,000,000 range() items"),
        (TEMPLATES["a gigabyte string"], "a str * 1000000000 is larger than a template needs"),
        ("{% for i in range(20) %}{{ 'x' * 1000000 }}{% endfor %}", "it renders more than 16 MiB of prompt"),
    ]:
        with_template(folder, template)
        ran = run_kvops("tokens", "--tokenizer", str(folder), "--chat-template", str(prompt), expect=1)
        assert f"the chat template is refused: {message}" in ran.stderr


@pytest.mark.parametrize(
    "content",
    ["{", "[1]", '{"a":' * 100_000 + "1" + "}" * 100_000, '{"bos_token": ' + "9" * 5000 + "}"],
    ids=["not JSON", "a list", "nested 100000 deep", "a 5000-digit number"],
)
def test_a_hostile_tokenizer_config_is_one_line(run_kvops, folder, tmp_path, content):
    (folder / "tokenizer_config.json").write_text(content)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("hello")
    ran = run_kvops("tokens", "--tokenizer", str(folder), str(prompt), expect=1)
    assert len(ran.stderr.strip().splitlines()) == 1 and "tokenizer_config.json" in ran.stderr


def test_a_fifo_as_tokenizer_json_is_refused(run_kvops, folder, tmp_path):
    (folder / "tokenizer.json").unlink()
    os.mkfifo(folder / "tokenizer.json")
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("hello")
    with deadline(60):
        ran = run_kvops("tokens", "--tokenizer", str(folder), str(prompt), expect=1)
    assert "FIFO" in ran.stderr and len(ran.stderr.strip().splitlines()) == 1
