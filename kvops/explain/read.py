"""Reading a vLLM run for `kvops explain`: its log, its live /metrics, nvidia-smi beside it; and the run as the
planner sees it."""

from __future__ import annotations

from kvops.deployment import DeploymentOptions
from kvops.engines.vllm.logs import VllmLog
from kvops.errors import KvopsError, MissingDevice, UsageError
from kvops.explain.memory import device_total
from kvops.explain.run import Run
from kvops.files import LOG_LIMIT, fetch_metrics, read_text
from kvops.model.refs import same_model
from kvops.nvidia_smi import SmiDevice
from kvops.plan import PlanInputs


def read_run(
    log_path: str | None, metrics_url: str | None, smi_path: str | None, gpu_index: int, device: str | None
) -> Run:
    run = Run(device_option=device)
    if log_path:
        run.log, run.log_source = read_log(log_path), log_path
    if metrics_url:
        run.labels, run.reading = read_metrics(metrics_url)
        run.metrics_source = metrics_url
    if smi_path:
        run.smi, run.smi_source = read_smi(smi_path, gpu_index), smi_path
    return run


def read_log(path: str) -> VllmLog:
    from kvops.engines.vllm.logs import parse_vllm_log

    text = read_text(path, "--vllm-log", LOG_LIMIT)
    if is_tgi_log(text):
        raise KvopsError(
            f"--vllm-log {path}: this is a TGI log, which explain does not read: run kvops calibrate --tgi-log {path} "
            "--gpu GPU to compare its KV pool and launch figures with a plan"
        )
    log = parse_vllm_log(text)
    if not log.facts and log.failure is None:
        raise KvopsError(
            f"--vllm-log {path}: no vLLM lines found (looked for 'Model loading took', 'Available KV cache memory', 'KV cache size', "
            "'non-default args', out-of-memory and KV-cache errors)"
        )
    return log


def is_tgi_log(text: str) -> bool:
    """A TGI launcher, router or shard log: its targets (`text_generation_launcher`, ...) or a line only TGI prints."""
    from kvops.engines.tgi.logs import parse_tgi_log

    if "text_generation_" in text:
        return True
    log = parse_tgi_log(text)
    return bool(log.facts or log.args)


def read_metrics(url: str):
    """The engine's cache config and its KV reading, from one scrape."""
    from kvops.engines.metrics import MetricsError, Samples
    from kvops.engines.vllm import metrics

    text = fetch_metrics(url)
    try:
        samples = Samples.from_exposition(text, only=(*metrics.SERIES, metrics.CACHE_CONFIG))
        reading = metrics.reading(samples)
    except MetricsError as exc:
        raise KvopsError(f"--metrics {url}: {exc}") from None
    config = metrics.cache_config(samples)
    if config is None:
        raise KvopsError(
            f"--metrics {url}: no vllm:cache_config_info sample (the KV pool's size); is this a vLLM /metrics endpoint?"
        )
    return config, reading


def read_smi(path: str, index: int) -> SmiDevice:
    from kvops.nvidia_smi import parse_nvidia_smi

    devices = parse_nvidia_smi(read_text(path, "--nvidia-smi"), f"--nvidia-smi {path}")
    for device in devices:
        if device.index == index:
            return device
    listed = ", ".join(str(device.index) for device in devices)
    raise KvopsError(f"--gpu-index {index}: not in --nvidia-smi {path} (devices: {listed})")


def _differences(options: DeploymentOptions, stated: DeploymentOptions) -> list[str]:
    """Options typed that the run states otherwise: the figures the run reports are its own, not what was typed."""
    notes = []
    for field in sorted(options.given & stated.given):
        typed, own = getattr(options, field), getattr(stated, field)
        if typed != own and not (field == "model" and same_model(str(typed), str(own))):
            notes.append(
                f"--{field.replace('_', '-')} {typed} is not the run's own ({own}): the figures the run reports are for "
                "its own; the planner's, where the run reports none, for what you typed"
            )
    return notes


def plan_inputs(run: Run, options: DeploymentOptions) -> tuple[PlanInputs | None, list[str]]:
    """The run as the planner sees it: what the user typed, else what the run states, its device total included.

    Without a device total the plan is for the run's own KV pool (when the run states one); a model named only by
    the run's own args that cannot be loaded here (an HF id not in the local cache) leaves the explanation without
    a plan. Either way it says so."""
    from kvops.engines.vllm.run import stated_options

    found: dict = {}
    total = device_total(run) if run.device == "gpu" else None
    if total:
        found["gpu_memory"] = total
    if run.device == "cpu":
        found["device"] = "cpu"
    stated = DeploymentOptions.stated(**found).under(stated_options(run.log, run.labels))
    workload = options.request_workload()
    differ = _differences(options, stated)
    try:
        return options.under(stated).plan_inputs(workload), differ
    except MissingDevice:
        pool = run.known_kv_pool
        if not pool:
            return None, ["no plan: no device total (give --gpu NAME, --gpu-memory SIZE or --nvidia-smi FILE)"]
        pinned = DeploymentOptions.stated(kv_cache_memory_bytes=pool).under(stated)
        return options.under(pinned).plan_inputs(workload), [
            f"no device total: the plan models the run's own KV pool ({pool} B); give --gpu NAME or --nvidia-smi FILE for the rest"
        ]
    except UsageError:
        raise
    except KvopsError as exc:
        if "model" in options.given:
            raise
        return None, [f"no plan: the run's model could not be loaded ({exc}); give --model"]
