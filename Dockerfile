# The kvops image: the sidecar (`kvops watch --proxy`, the entrypoint's default use in `kvops manifests`) and the
# init step that copies kvops and kvops_vllm into a volume the official vLLM image puts on its PYTHONPATH.
#   docker build -t kvops:0.1.0 .      (the tag `kvops manifests --kvops-image` names by default)
FROM python:3.12-slim
COPY pyproject.toml README.md /src/
COPY kvops /src/kvops
COPY plugins /src/plugins
RUN pip install --no-cache-dir /src && rm -rf /src \
    && mkdir -p /opt/kvops/python && chown 65532:65532 /opt/kvops/python
# /opt/kvops/python: owned by the image's user, so a new compose volume mounted there starts writable for the init step.
# Numeric, so Kubernetes can check runAsNonRoot.
USER 65532:65532
ENTRYPOINT ["kvops"]
CMD ["--help"]
