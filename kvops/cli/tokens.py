"""`kvops tokens`: what prompts really cost, as a workload file `kvops plan --workload` reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from kvops.cli.options import json_option, needs, print_json


@click.command()
@click.option(
    "--tokenizer",
    "tokenizer_path",
    required=True,
    type=click.Path(exists=True),
    help="Local tokenizer folder (tokenizer.json, tokenizer_config.json) or tokenizer.json.",
)
@click.option(
    "--chat-template",
    is_flag=True,
    help="Render each prompt through the tokenizer's chat template, as the chat endpoint does.",
)
@click.option("--system-prompt", metavar="TEXT", help="A system message put before every prompt.")
@click.option(
    "--system-prompt-file", type=click.Path(exists=True, dir_okay=False), help="The system message, from a file."
)
@click.option(
    "--gen-tokens", type=click.IntRange(min=1), help="Expected generated tokens per request, written into the workload."
)
@click.option(
    "--out",
    "-o",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the workload (JSON lines: prompt_tokens, gen_tokens) here.",
)
@json_option
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
def tokens(tokenizer_path, chat_template, system_prompt, system_prompt_file, gen_tokens, out, as_json, files):
    """Count prompt tokens with the model's own tokenizer: p50/p95/max, and a workload for `kvops plan`.

    FILES: text files (one prompt each) or .jsonl files with {"prompt": ...} or {"messages": [...]} per line.
    """
    needs("hub", "tokenizers", "jinja2")
    from kvops.files import check_output_path, read_text, write_text
    from kvops.tokens import LocalTokenizer, distribution, prompt_tokens, read_prompts

    if system_prompt and system_prompt_file:
        raise click.UsageError("give --system-prompt or --system-prompt-file, not both")
    if out and gen_tokens is None:
        raise click.UsageError(
            "--out writes a workload for kvops plan, which sizes each request by its prompt and its output: give "
            "--gen-tokens N too"
        )
    if out:
        check_output_path(out, "--out")
    system = read_text(system_prompt_file, "--system-prompt-file") if system_prompt_file else system_prompt
    tokenizer = LocalTokenizer(tokenizer_path)
    prompts = [prompt for file in files for prompt in read_prompts(Path(file))]
    if not prompts:
        raise click.UsageError("the files hold no prompts")
    counts = [prompt_tokens(tokenizer, prompt, chat_template=chat_template, system_prompt=system) for prompt in prompts]
    rows: list[dict[str, Any]] = [
        {"source": prompt.source, "prompt_tokens": count} | ({"gen_tokens": gen_tokens} if gen_tokens else {})
        for prompt, count in zip(prompts, counts)
    ]
    if out:
        write_text(out, "".join(json.dumps(row) + "\n" for row in rows), "--out")
    summary = distribution(counts)
    if as_json:
        print_json(
            {
                "tokenizer": tokenizer.where,
                "chat_template": chat_template,
                "system_prompt": bool(system),
                "prompt_tokens": summary,
                "prompts": rows,
                "workload": out,
            }
        )
        return
    width = max(len(row["source"]) for row in rows)
    if len(rows) <= 20:
        for row in rows:
            click.echo(f"{row['source']:<{width}}  {row['prompt_tokens']:>8} tokens")
        click.echo()
    template = "chat template" if chat_template else "no chat template"
    click.echo(
        f"{summary['count']} prompts ({template}{', system prompt' if system else ''}): p50 {summary['p50']}, p95 {summary['p95']}, max {summary['max']} tokens"
    )
    if out:
        click.echo(f"wrote {out}: kvops plan --workload {out}")
