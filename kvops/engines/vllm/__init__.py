"""vLLM (V1 engine): memory budget, launch flags, startup log lines, /metrics names."""
