"""What kvops' middleware takes from the vLLM it runs in, read from the installed release's own code (0.32 in the
suite, 0.33 and 0.34 from their wheels by .ci/newer_vllm), so that a rename breaks CI rather than the users' engines:

- the KV usage: the middleware reads `vllm:kv_cache_usage_perc` from the API server's Prometheus registry, the
  gauge `PrometheusStatLogger` (vllm/v1/metrics/loggers.py) registers with a child per engine and sets in `record`
  from `SchedulerStats.kv_cache_usage` (vllm/v1/metrics/stats.py); with several data-parallel engines, the highest;
- how it is loaded: `--middleware` parsed by the release's own `vllm serve` parser into `args.middleware`, each
  class added with `app.add_middleware` after vLLM's own (vllm/entrypoints/serve/middleware/register.py,
  `init_entrypoints_middleware`), so that it is the outermost and built by Starlette after the stat logger exists.

The engine config is built for the tiny test model on this CPU (no kernel runs: the stat logger needs only its
config)."""

from __future__ import annotations

import pytest

from tests.engine.test_newer_release_kv import quiet, triton_cpu_waived  # noqa: F401 (autouse fixtures)
from tests.engine.test_plan_flags import parse_serve

pytestmark = pytest.mark.vllm
MIDDLEWARE = "kvops_vllm.middleware.KVOpsMiddleware"


@pytest.fixture
def stat_logger(tiny_model):
    """vLLM's Prometheus stat logger of a two-engine (data-parallel) API server, as the API server builds it."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.prometheus import unregister_vllm_metrics

    config = EngineArgs(model=str(tiny_model), load_format="dummy", max_model_len=256).create_engine_config()
    yield PrometheusStatLogger(config, engine_indexes=[0, 1])
    unregister_vllm_metrics()


def record(logger, engine: int, usage: float) -> None:
    from vllm.v1.metrics.stats import SchedulerStats

    logger.record(scheduler_stats=SchedulerStats(kv_cache_usage=usage), iteration_stats=None, engine_idx=engine)


def test_the_middleware_levels_on_the_usage_vllms_stat_logger_sets(stat_logger):
    from kvops_vllm.middleware import KVOpsMiddleware

    async def app(scope, receive, send):  # pragma: no cover - never called
        raise AssertionError

    record(stat_logger, 0, 0.10)
    record(stat_logger, 1, 0.72)
    middleware = KVOpsMiddleware(app)  # finds the gauge registered, as at vLLM's startup
    assert middleware.usage() == pytest.approx(0.72)  # the highest engine's
    record(stat_logger, 1, 0.20)
    assert middleware.usage() == pytest.approx(0.20)


def test_vllm_loads_the_middleware_as_the_outermost_class(stat_logger):
    from fastapi import FastAPI
    from vllm.entrypoints.serve.middleware.register import init_entrypoints_middleware

    from kvops_vllm.middleware import KVOpsMiddleware

    args, _ = parse_serve(["m", "--middleware", MIDDLEWARE])
    assert args.middleware == [MIDDLEWARE]
    app = FastAPI()
    init_entrypoints_middleware(args, app, ("generate",))
    assert app.user_middleware[0].cls is KVOpsMiddleware  # Starlette runs the last added first: the outermost
