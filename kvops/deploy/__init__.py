"""Deployment artifacts built from kvops' own outputs: Kubernetes manifests, a docker-compose stack, a Grafana dashboard.

The engine's launch comes from `kvops plan` (its `--format k8s` container), the alert rules from `kvops alerts`,
the sidecar's command line is `kvops watch --proxy`; this package only puts them together.
"""
