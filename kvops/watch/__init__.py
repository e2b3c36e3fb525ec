"""The watcher sidecar: metric sources, pressure signals, the poll loop, alerts, /kvops/* endpoints."""
