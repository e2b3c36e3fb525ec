"""What a prompt really costs in tokens, with the model's own tokenizer (local files, the `tokenizers` library).

Characters are a poor guide for RAG prompts: retrieved documents, markup and the chat template's own tokens all
count. A prompt's cost here is the tokenizer's count of exactly what the engine receives: the chat template
rendered over the system prompt and the messages (as Hugging Face's `apply_chat_template` renders it: jinja2
sandbox, trim_blocks, lstrip_blocks, add_generation_prompt) and encoded without adding special tokens again;
without a template, the text encoded with the tokenizer's own special tokens (BOS).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

from kvops.errors import ConfigError, UsageError
from kvops.files import DOCUMENT_LIMIT, LOG_LIMIT, load_json, read_json, read_text
from kvops.frozen import frozen
from kvops.workload import percentile


@frozen
class Prompt:
    """One request's prompt: where it came from and its chat messages (a bare text is one user message)."""

    source: str
    messages: tuple[dict[str, str], ...]


TOKENIZER_LIMIT = 512 << 20  # tokenizer.json: tens of MiB for the largest vocabularies


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
        text = read_text(file, "", TOKENIZER_LIMIT, ConfigError)  # a regular file: a FIFO is refused, not waited on
        try:
            self.tokenizer = Tokenizer.from_str(text)
        except Exception as exc:  # the tokenizers library raises a bare Exception on a bad file
            raise ConfigError(f"{file}: not a tokenizers file ({(str(exc).splitlines() or [''])[0]})") from None
        config_file = folder / "tokenizer_config.json"
        config = read_json(config_file, "", DOCUMENT_LIMIT, ConfigError) if config_file.exists() else {}
        if not isinstance(config, dict):
            raise ConfigError(f"{config_file}: not a JSON object of tokenizer settings")
        self.config: dict[str, Any] = config
        self.where = str(folder)

    def count(self, text: str, *, special_tokens: bool) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=special_tokens).ids)

    def special(self, name: str) -> str:
        value = self.config.get(name) or ""
        return str(value.get("content", "")) if isinstance(value, dict) else str(value)

    def chat_template(self) -> str:
        template = self.config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            named = [item for item in template if isinstance(item, dict) and item.get("name") == "default"]
            template = named[0].get("template") if named else None
        if not template:
            raise ConfigError(
                f"{self.where}: tokenizer_config.json has no chat_template; drop --chat-template or use the model's own tokenizer folder"
            )
        if not isinstance(template, str):
            raise ConfigError(
                f"{self.where}: tokenizer_config.json chat_template is not a template string (nor a list of "
                '{"name", "template"} objects with a "default" one)'
            )
        return template


def render_chat(tokenizer: LocalTokenizer, messages: list[dict[str, str]]) -> str:
    """The chat template over the messages, as the engine's OpenAI chat endpoint renders it."""
    from datetime import datetime

    from jinja2 import TemplateError

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    environment = _bounded_sandbox()(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    environment.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda form: datetime.now().strftime(form)
    environment.globals["range"] = _counted_range()
    template = tokenizer.chat_template()
    try:
        pieces = environment.from_string(template).generate(
            messages=messages,
            add_generation_prompt=True,
            bos_token=tokenizer.special("bos_token"),
            eos_token=tokenizer.special("eos_token"),
        )
        return _bounded_join(pieces)
    except TemplateError as exc:
        raise ConfigError(f"{tokenizer.where}: the chat template failed: {exc}") from None
    except TemplateLimit as exc:
        raise ConfigError(f"{tokenizer.where}: the chat template is refused: {exc}") from None
    except Exception as exc:  # a template is code the user gave: whatever it raises is its failure, in one line
        raise ConfigError(f"{tokenizer.where}: the chat template failed: {type(exc).__name__}: {exc}") from None


# What one chat template may do: a template is code from the tokenizer folder, run in jinja2's sandbox, and bounded
# here in time (range() items in all) and in memory (its output, and what one `*` or `**` may build).
TEMPLATE_OUTPUT_LIMIT = 16 << 20
TEMPLATE_RANGE_ITEMS = 1_000_000


def _bounded_join(pieces: Iterable[str]) -> str:
    out: list[str] = []
    size = 0
    for piece in pieces:
        size += len(piece)
        if size > TEMPLATE_OUTPUT_LIMIT:
            raise TemplateLimit(f"it renders more than {TEMPLATE_OUTPUT_LIMIT >> 20} MiB of prompt")
        out.append(piece)
    return "".join(out)


def _counted_range() -> Callable[..., Iterator[int]]:
    """range() that stops the template past TEMPLATE_RANGE_ITEMS items over the whole render (nested loops too)."""
    left = [TEMPLATE_RANGE_ITEMS]

    def counted(*args: int) -> Iterator[int]:
        for item in range(*args):
            left[0] -= 1
            if left[0] < 0:
                raise TemplateLimit(f"its loops run more than {TEMPLATE_RANGE_ITEMS:,} range() items")
            yield item

    return counted


@cache
def _bounded_sandbox() -> type:
    """jinja2's immutable sandbox, with `*` and `**` checked before they build a giant string, list or number."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "**" and not (_small(left, 1 << 32) and _small(right, 64)):
                raise TemplateLimit(f"{left!r} ** {right!r} is larger than a template needs")
            if operator == "*" and _sized(left, right) > TEMPLATE_OUTPUT_LIMIT:
                raise TemplateLimit(f"a {type(left).__name__} * {right!r} is larger than a template needs")
            return super().call_binop(context, operator, left, right)

    return BoundedSandbox


def _small(value: Any, limit: int) -> bool:
    return isinstance(value, (int, float)) and abs(value) <= limit


def _sized(left: Any, right: Any) -> float:
    """The length `left * right` would have when one side is a sequence and the other a count; 0 otherwise."""
    for items, count in ((left, right), (right, left)):
        if isinstance(items, (str, list, tuple)) and isinstance(count, int):
            return len(items) * count
    return 0


class TemplateLimit(Exception):
    """A chat template past the bounds above: the message says which."""


def prompt_tokens(tokenizer: LocalTokenizer, prompt: Prompt, *, chat_template: bool, system_prompt: str | None) -> int:
    messages = list(prompt.messages)
    if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
    if chat_template:
        return tokenizer.count(render_chat(tokenizer, messages), special_tokens=False)
    return tokenizer.count("\n".join(message["content"] for message in messages), special_tokens=True)


def read_prompts(path: Path) -> list[Prompt]:
    """A text file is one prompt; a .jsonl file holds one per line: {"prompt": "..."} or {"messages": [...]}."""
    text = read_text(path, "", LOG_LIMIT, UsageError)
    if path.suffix != ".jsonl":
        return [Prompt(str(path), ({"role": "user", "content": text},))]
    prompts = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        record = load_json(line, where, UsageError)
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
