"""`kvops explain`: where a vLLM engine's GPU memory went, what its KV cache holds now, and the one next action."""

from __future__ import annotations

import click

from kvops.cli.options import deployment_options, engine_options, json_option, print_json, running_version


def explain_options(function):
    return engine_options(function, model_required=False, engine=False)


@click.command()
@click.option(
    "--metrics",
    "metrics_url",
    metavar="URL",
    help="A live vLLM /metrics: KV usage now, the cache config, requests running and waiting.",
)
@click.option(
    "--vllm-log",
    "log_path",
    metavar="FILE",
    help="The engine's log (startup, or the traceback of a failed start): the memory it measured, or what ran out.",
)
@click.option(
    "--nvidia-smi",
    "smi_path",
    metavar="FILE",
    help="`nvidia-smi` output (its table, or --query-gpu=memory.total,memory.used --format=csv): device total and used.",
)
@click.option(
    "--gpu-index",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="The device in --nvidia-smi output the engine runs on (its rank 0).",
)
@click.option(
    "--prompt-tokens",
    type=click.IntRange(min=0),
    help="Planned prompt tokens per request (headroom in requests of this size).",
)
@click.option("--gen-tokens", type=click.IntRange(min=0), help="Planned generated tokens per request.")
@click.option(
    "--workload",
    type=click.Path(exists=True, dir_okay=False),
    help="JSONL of requests, as `kvops plan --workload` reads (sized at its p95).",
)
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(exists=True, dir_okay=False),
    help="Degrade policy for the level [default: the shipped one].",
)
@json_option
@click.pass_context
@explain_options
def explain(
    ctx: click.Context,
    metrics_url: str | None,
    log_path: str | None,
    smi_path: str | None,
    gpu_index: int,
    as_json: bool,
    **params,
) -> None:
    """Where the GPU memory of a running or failed vLLM engine went: weights, activation peak, non-torch, CUDA graphs
    and KV; KV in use and the headroom; the level that applies and the one next action.

    Terms come from what the engine reported (its log, its /metrics), the device total from nvidia-smi, and only
    the terms it did not report from the planner (give --model), each marked with its source.
    """
    from kvops.explain import explain as make_explanation
    from kvops.explain.read import plan_inputs, read_run
    from kvops.policy import load_policy
    from kvops.render.explain import explanation_text

    if not (metrics_url or log_path):
        raise click.UsageError("give --metrics URL and/or --vllm-log FILE")
    options = deployment_options(ctx, params)
    if metrics_url:  # the release the running engine states at /version, unless --engine-version names one
        options = options.under(running_version(metrics_url))
    run = read_run(log_path, metrics_url, smi_path, gpu_index, options.device if "device" in options.given else None)
    inputs, notes = plan_inputs(run, options)
    result = make_explanation(run, inputs, load_policy(options.policy), notes)
    if as_json:
        print_json(result.to_dict())
    else:
        click.echo(explanation_text(result))
