"""kvops inside vLLM: the KV-guard scheduler (`--scheduler-cls kvops_vllm.scheduler.KVGuardScheduler`)."""
