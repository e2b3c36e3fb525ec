"""What differs between serving engines, and only that: one package per engine.

Each holds how the engine turns memory into KV blocks (budget), its launch flags and their validation rules
(flags), the lines it logs at startup (logs) and the metrics it exports (metrics).
"""
