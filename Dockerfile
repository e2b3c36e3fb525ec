# The kvops image: the sidecar (`kvops watch --proxy`, as `kvops manifests` runs it) and the init step that copies
# kvops and kvops_vllm into a volume the official vLLM image puts on its PYTHONPATH. Only the core is installed:
# the sidecar needs no extras (no pandas, matplotlib, huggingface_hub or tokenizers).
#   docker build -t kvops:$(python -c 'import kvops; print(kvops.__version__)') .
# The base is python:3.12-slim (Debian trixie) pinned by digest, as public Dockerfiles pinned it in September 2026.
ARG PYTHON_IMAGE=python:3.12-slim@sha256:78387bc3881b8273120a12ebe6c1ab22b018ccc2c9adf565ae1ac9b536e184ea

# Build the wheel apart, so the image holds no source tree and no build tools.
FROM ${PYTHON_IMAGE} AS build
COPY pyproject.toml README.md /src/
COPY kvops /src/kvops
COPY plugins /src/plugins
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels /src

FROM ${PYTHON_IMAGE}
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && mkdir -p /opt/kvops/python && chown 65532:65532 /opt/kvops/python
# /opt/kvops/python: owned by the image's user, so a new compose volume mounted there starts writable for the init step.
# Numeric, so Kubernetes can check runAsNonRoot.
USER 65532:65532
ENTRYPOINT ["kvops"]
CMD ["--help"]
