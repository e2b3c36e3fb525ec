"""Hugging Face TGI (v3): memory budget, launcher flags and validation, log lines, /metrics names."""
