"""`kvops plan`: engine launch flags that keep the KV cache inside its budget."""

from __future__ import annotations

import click

from kvops.cli.config_file import file_option
from kvops.cli.options import deployment_options, json_option, launcher_words, warn, workload_options
from kvops.render.plan import FORMATS


@click.command()
@workload_options
@file_option
@click.option("--format", "out_format", type=click.Choice(FORMATS), default="text", show_default=True, help="Output.")
@click.option(
    "--launcher",
    metavar="COMMAND",
    help="What starts the engine, instead of `vllm serve` / `text-generation-launcher`, e.g. 'python -m vllm.entrypoints.openai.api_server' where the console script is missing.",
)
@click.option(
    "--explain",
    is_flag=True,
    help="Text: add every memory term with its source, the capacity in the engine's terms and the notes.",
)
@json_option
@click.pass_context
def plan(ctx: click.Context, out_format: str, launcher: str | None, explain: bool, as_json: bool, **params) -> None:
    """Engine launch flags that keep the KV cache inside its budget: the KV it gets and the requests it holds
    (--explain: every memory term and its source; --json: every figure).

    Exits 3 when the workload does not fit, with need against have and the ways out the planner computed.
    """
    from kvops.plan import PlanError
    from kvops.planner import plan as make_plan
    from kvops.render.plan import does_not_fit_message, guard_left_out, kubernetes_container, render

    result = make_plan(deployment_options(ctx, params, launcher_words(launcher)).plan_inputs())
    out_format = "json" if as_json else out_format
    if result.fits or out_format in ("json", "yaml"):
        if out_format == "k8s":
            from kvops.deploy.k8s import engine_container

            click.echo(kubernetes_container(engine_container(result)))
        else:
            click.echo(render(result, out_format, explain))
    if out_format != "text":
        for message in result.all_warnings:
            warn(message)
    else:  # the text shows the plan's own warnings; what the model's config.json left to a default is said here
        for message in result.inputs.spec.warnings:
            warn(message)
    if out_format in ("docker", "k8s") and result.fits:
        left_out = guard_left_out(result, out_format)
        if left_out:
            warn(left_out)
    if not result.fits:
        raise PlanError(does_not_fit_message(result))
