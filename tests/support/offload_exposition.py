"""Writes tests/support/data/vllm-0.32-offload-metrics.prom: the host KV tier's families exactly as vLLM 0.32.0
exposes them, rendered by vLLM's own code (`OffloadPromMetrics` of
vllm/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py, the CPU spec's metric definitions) fed the
stats its worker reports, into a prometheus_client registry.

vLLM's CPU build cannot run the tier (its native worker refuses non-CUDA devices, vllm/v1/kv_offload/cpu/spec.py),
so the tests serve this beside the recorded CPU exposition, as a stand-in replica with a tier. Regenerate with
`python -m tests.support.offload_exposition` (vLLM installed); tests set the values with `offload_exposition()`
in tests/support/metrics_server.py.
"""

from __future__ import annotations

import re

from tests.support.metrics_server import DATA

OFFLOAD_RECORDED = DATA / "vllm-0.32-offload-metrics.prom"
LABELS = ["model_name", "engine"], {0: ["tiny-llama", "0"]}


def render() -> str:
    import prometheus_client
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import metrics
    from vllm.v1.kv_offload.cpu.common import CPUOffloadingMetrics

    registry = prometheus_client.CollectorRegistry()
    kinds = {
        prometheus_client.Counter: lambda **kw: prometheus_client.Counter(registry=registry, **kw),
        prometheus_client.Gauge: lambda **kw: prometheus_client.Gauge(registry=registry, **kw),
        prometheus_client.Histogram: lambda **kw: prometheus_client.Histogram(registry=registry, **kw),
    }
    transfer = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both")
    prom = metrics.OffloadPromMetrics(VllmConfig(kv_transfer_config=transfer), kinds, *LABELS)
    stats = metrics.OffloadingConnectorStats()
    names = metrics._TransferMetricName
    for _ in range(3):  # three loads and one store of 2 MB, 8 ms each
        stats.increase_counter(names.LOAD_BYTES, 2_000_000)
        stats.increase_counter(names.LOAD_TIME, 0.008)
        stats.observe_histogram(names.LOAD_SIZE, 2_000_000)
    stats.increase_counter(names.STORE_BYTES, 2_000_000)
    stats.increase_counter(names.STORE_TIME, 0.008)
    stats.observe_histogram(names.STORE_SIZE, 2_000_000)
    stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC, 0.4)
    prom.observe(stats.data, 0)
    text = prometheus_client.generate_latest(registry).decode()
    return re.sub(r"^(\S+_created\{[^}]*\}) \S+$", r"\1 1.7961e+09", text, flags=re.M)  # fixed creation times


if __name__ == "__main__":
    OFFLOAD_RECORDED.write_text(render())
    print(f"wrote {OFFLOAD_RECORDED}")
