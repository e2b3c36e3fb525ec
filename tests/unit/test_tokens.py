"""`kvops tokens` against the tokenizer's own count (transformers' AutoTokenizer on the same local files)."""

from __future__ import annotations

import json

import pytest

from kvops.workload import percentile

transformers = pytest.importorskip("transformers")

SYSTEM = "You answer only from the retrieved documents."
PROMPTS = [
    "the cache grows with every token",
    "memory pressure preemption queue scheduler block page layer head window latent budget plan " * 20,
    "Résumé: naïve café — 東京 ✓",
]


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model):
    return transformers.AutoTokenizer.from_pretrained(str(tiny_model))


def hf_count(tokenizer, text: str, *, chat: bool, system: str | None) -> int:
    if not chat:
        return len(tokenizer(text)["input_ids"])
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return len(
        tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True)[
            "input_ids"
        ]
    )


@pytest.mark.parametrize("chat, system", [(False, None), (True, None), (True, SYSTEM)])
def test_counts_match_the_tokenizer_template_included(run_kvops, tiny_model, hf_tokenizer, tmp_path, chat, system):
    files = []
    for index, text in enumerate(PROMPTS):
        path = tmp_path / f"prompt{index}.txt"
        path.write_text(text)
        files.append(str(path))
    args = ["tokens", "--tokenizer", str(tiny_model), "--json", *files]
    if chat:
        args.insert(3, "--chat-template")
    if system:
        args[3:3] = ["--system-prompt", system]
    document = json.loads(run_kvops(*args).stdout)
    assert [row["prompt_tokens"] for row in document["prompts"]] == [
        hf_count(hf_tokenizer, text, chat=chat, system=system) for text in PROMPTS
    ]


def test_chat_jsonl_and_workload_file(run_kvops, tiny_model, hf_tokenizer, tmp_path):
    conversation = [
        {"role": "user", "content": "plan the budget"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "now watch it"},
    ]
    source = tmp_path / "requests.jsonl"
    source.write_text(
        json.dumps({"messages": conversation}) + "\n\n" + json.dumps({"prompt": "the engine serves requests"}) + "\n"
    )
    workload = tmp_path / "workload.jsonl"
    out = run_kvops(
        "tokens",
        "--tokenizer",
        str(tiny_model),
        "--chat-template",
        "--gen-tokens",
        "256",
        "--out",
        str(workload),
        str(source),
    ).stdout
    rows = [json.loads(line) for line in workload.read_text().splitlines()]
    expected = len(
        hf_tokenizer.apply_chat_template(conversation, tokenize=True, add_generation_prompt=True, return_dict=True)[
            "input_ids"
        ]
    )
    assert rows[0] == {"source": f"{source}:1", "prompt_tokens": expected, "gen_tokens": 256}
    assert len(rows) == 2 and f"kvops plan --workload {workload}" in out


def test_percentiles_are_observed_values():
    values = list(range(1, 101))
    assert (percentile(values, 50), percentile(values, 95), percentile([7], 95)) == (50, 95, 7)


@pytest.mark.parametrize(
    "content, fragment",
    [("{nope\n", "not valid JSON"), ('{"text": "x"}\n', '"prompt": "text" or "messages"')],
)
def test_bad_prompt_files(run_kvops, tiny_model, tmp_path, content, fragment):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    result = run_kvops("tokens", "--tokenizer", str(tiny_model), str(path), expect=2)
    assert fragment in result.stderr and f"{path}:1" in result.stderr and result.stderr.count("\n") == 1


def test_no_template_and_not_a_tokenizer(run_kvops, tmp_path, tiny_model):
    (tmp_path / "p.txt").write_text("x")
    assert (
        "no tokenizer.json"
        in run_kvops("tokens", "--tokenizer", str(tmp_path), str(tmp_path / "p.txt"), expect=1).stderr
    )
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_text((tiny_model / "tokenizer.json").read_text())
    assert (
        "no chat_template"
        in run_kvops("tokens", "--tokenizer", str(bare), "--chat-template", str(tmp_path / "p.txt"), expect=1).stderr
    )
