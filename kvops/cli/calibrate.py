"""`kvops calibrate`: an engine run's measured figures against the plan's, and the profile they make."""

from __future__ import annotations

import click

from kvops.cli.options import deployment_options, json_option, print_json, run_options, running_version, warn


@click.command()
@click.option(
    "--vllm-log",
    type=click.Path(exists=True, dir_okay=False),
    help="A vLLM startup log (any release: old and new wordings).",
)
@click.option(
    "--tgi-log", type=click.Path(exists=True, dir_okay=False), help="A TGI launcher log (plain or --json-output)."
)
@click.option(
    "--metrics", "metrics_url", metavar="URL", help="A live vLLM /metrics endpoint: its vllm:cache_config_info labels."
)
@click.option(
    "--save",
    "save_path",
    metavar="PROFILE",
    help="Write the measured terms as a profile (YAML, or JSON for *.json) for `kvops plan --profile`.",
)
@json_option
@click.pass_context
@run_options
def calibrate(
    ctx: click.Context,
    vllm_log: str | None,
    tgi_log: str | None,
    metrics_url: str | None,
    save_path: str | None,
    as_json: bool,
    **params,
) -> None:
    """Predicted against actual, term by term, for an engine run; save what it measured as a profile."""
    from kvops import engines
    from kvops.calibrate import calibrate_run
    from kvops.files import LOG_LIMIT, check_output_path, fetch_metrics, read_text, write_text
    from kvops.render.plan import calibration_text

    if tgi_log and (vllm_log or metrics_url):
        raise click.UsageError("--tgi-log cannot be combined with --vllm-log or --metrics (one engine per calibration)")
    if not (vllm_log or tgi_log or metrics_url):
        raise click.UsageError("give --vllm-log FILE, --tgi-log FILE or --metrics URL")
    if save_path:
        check_output_path(save_path, "--save")
    engine = engines.get("tgi" if tgi_log else "vllm")
    log_path = tgi_log or vllm_log
    source = " + ".join(str(item) for item in (vllm_log, tgi_log, metrics_url) if item)
    log_option = "--tgi-log" if tgi_log else "--vllm-log"
    log = engine.read_log(read_text(log_path, log_option, LOG_LIMIT), log_path) if log_path else None
    config = engine.run_config(fetch_metrics(metrics_url), metrics_url) if metrics_url else None
    options = deployment_options(ctx, params)
    if metrics_url:
        options = options.under(running_version(metrics_url))
    result, no_prediction = calibrate_run(engine, log, config, options, source)
    if no_prediction:
        warn(no_prediction)
    for message in result.warnings:
        warn(message)
    if as_json:
        print_json(result.to_dict())
    else:
        click.echo(calibration_text(result))
    if save_path:
        write_text(save_path, result.profile.to_text(save_path.endswith(".json")), "--save")
        if not as_json:
            click.echo(f"saved profile {save_path}: use it with kvops plan --profile {save_path}")
