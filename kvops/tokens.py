"""What a prompt really costs in tokens, with the model's own tokenizer (local files, the `tokenizers` library).

Characters are a poor guide for RAG prompts: retrieved documents, markup and the chat template's own tokens all
count. A prompt's cost here is the tokenizer's count of exactly what the engine receives: the chat template
rendered over the system prompt and the messages (as Hugging Face's `apply_chat_template` renders it: jinja2
sandbox, trim_blocks, lstrip_blocks, add_generation_prompt) and encoded without adding special tokens again;
without a template, the text encoded with the tokenizer's own special tokens (BOS).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvops.errors import ConfigError, UsageError
from kvops.workload import percentile


@dataclass(frozen=True)
class Prompt:
    """One request's prompt: where it came from and its chat messages (a bare text is one user message)."""

    source: str
    messages: tuple[dict[str, str], ...]


class LocalTokenizer:
    """tokenizer.json (+ tokenizer_config.json for the chat template and special tokens) from a local folder."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer

        path = Path(path).expanduser()
        folder = path if path.is_dir() else path.parent
        file = folder / "tokenizer.json" if path.is_dir() else path
        if not file.exists():
            raise ConfigError(
                f"{file}: no tokenizer.json (kvops tokens reads a local Hugging Face tokenizer folder or its tokenizer.json)"
            )
        try:
            self.tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # the tokenizers library raises a bare Exception on a bad file
            raise ConfigError(f"{file}: not a tokenizers file ({str(exc).splitlines()[0]})") from None
        config_file = folder / "tokenizer_config.json"
        self.config: dict[str, Any] = json.loads(config_file.read_text()) if config_file.exists() else {}
        self.where = str(folder)

    def count(self, text: str, *, special_tokens: bool) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=special_tokens).ids)

    def special(self, name: str) -> str:
        value = self.config.get(name) or ""
        return value.get("content", "") if isinstance(value, dict) else str(value)

    def chat_template(self) -> str:
        template = self.config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((item["template"] for item in template if item.get("name") == "default"), None)
        if not template:
            raise ConfigError(
                f"{self.where}: tokenizer_config.json has no chat_template; drop --chat-template or use the model's own tokenizer folder"
            )
        return template


def render_chat(tokenizer: LocalTokenizer, messages: list[dict[str, str]]) -> str:
    """The chat template over the messages, as the engine's OpenAI chat endpoint renders it."""
    from datetime import datetime

    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    environment.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda form: datetime.now().strftime(form)
    try:
        return environment.from_string(tokenizer.chat_template()).render(
            messages=messages,
            add_generation_prompt=True,
            bos_token=tokenizer.special("bos_token"),
            eos_token=tokenizer.special("eos_token"),
        )
    except TemplateError as exc:
        raise ConfigError(f"{tokenizer.where}: the chat template failed: {exc}") from None


def prompt_tokens(tokenizer: LocalTokenizer, prompt: Prompt, *, chat_template: bool, system_prompt: str | None) -> int:
    messages = list(prompt.messages)
    if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
    if chat_template:
        return tokenizer.count(render_chat(tokenizer, messages), special_tokens=False)
    return tokenizer.count("\n".join(message["content"] for message in messages), special_tokens=True)


def read_prompts(path: Path) -> list[Prompt]:
    """A text file is one prompt; a .jsonl file holds one per line: {"prompt": "..."} or {"messages": [...]}."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read ({exc.__class__.__name__})") from None
    if path.suffix != ".jsonl":
        return [Prompt(str(path), ({"role": "user", "content": text},))]
    prompts = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where}: not valid JSON ({exc.msg})") from None
        prompts.append(Prompt(where, _messages(record, where)))
    return prompts


def _messages(record: Any, where: str) -> tuple[dict[str, str], ...]:
    if isinstance(record, dict) and isinstance(record.get("prompt"), str):
        return ({"role": "user", "content": record["prompt"]},)
    messages = record.get("messages") if isinstance(record, dict) else None
    if (
        isinstance(messages, list)
        and messages
        and all(isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in messages)
    ):
        return tuple({"role": str(m["role"]), "content": m["content"]} for m in messages)
    raise UsageError(
        f'{where}: each line needs "prompt": "text" or "messages": [{{"role": ..., "content": "text"}}, ...]'
    )


def distribution(values: list[int]) -> dict[str, int]:
    return {
        "count": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "max": max(values),
        "total": sum(values),
    }
