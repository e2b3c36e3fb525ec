"""The `KVOPS_*` environment variables kvops reads, in any of its processes: the KV guard's and the middleware's
(inside vLLM), the watcher's, and the benches' that may share vLLM's environment. Any other is a misspelling that
would leave its setting at the default, unsaid, so each process that reads them refuses it at start.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from kvops.errors import KvopsError, UsageError

SETTINGS = frozenset(
    {
        *("KVOPS_ADMISSION", "KVOPS_OUTPUT_QUANTILE", "KVOPS_OUTPUT_HISTORY", "KVOPS_OUTPUT_MIN_ENDS"),
        *("KVOPS_COLD_START", "KVOPS_HEADROOM_BLOCKS", "KVOPS_PAUSE_STEPS", "KVOPS_PREEMPT", "KVOPS_RESUME"),
        *("KVOPS_RESUME_WAIT_STEPS", "KVOPS_LEVELS", "KVOPS_POLICY_URL", "KVOPS_POLICY_POLL_SECONDS"),
        *("KVOPS_POLICY_TIMEOUT_SECONDS", "KVOPS_POLICY_MAX_AGE_SECONDS", "KVOPS_LOG_SECONDS"),
        *("KVOPS_POLICY", "KVOPS_TRUST_PRIORITY_FROM", "KVOPS_ADMIN_TOKEN", "KVOPS_BENCH_ARRIVALS"),
    }
)


def check_names(env: Mapping[str, str], error: type[KvopsError] = UsageError) -> None:
    """`error` naming the first KVOPS_* variable in `env` that no kvops process reads, with the nearest that one does."""
    unknown = sorted(name for name in env if name.startswith("KVOPS_") and name not in SETTINGS)
    if not unknown:
        return
    near = difflib.get_close_matches(unknown[0], SETTINGS, n=1, cutoff=0.8)
    hint = f"did you mean {near[0]}?" if near else f"valid: {', '.join(sorted(SETTINGS))}"
    raise error(f"{unknown[0]} is not a kvops setting (it would be ignored); {hint}")
