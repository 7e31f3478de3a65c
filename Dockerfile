# syntax=docker/dockerfile:1
# One image, two entry points:
#   aggapi apiserver   Deployment: runs as 65532 (the image default), read-only root filesystem
#   aggapi agent       DaemonSet: the pod spec runs it as root, privileged, hostPID
#
# Base pinned by digest (python:3.11-slim-bookworm). Docker Hub was unreachable where this
# was written, so the digest could not be re-checked there: confirm (and to move it, take)
# the index digest with
#   docker buildx imagetools inspect python:3.11-slim-bookworm
# No Docker engine runs in CI: tests/manifests/test_image.py runs the build stage's RUN
# steps in a fresh virtualenv instead of building the image.
ARG PYTHON_IMAGE=docker.io/library/python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b

# ---- build: a self-contained virtualenv with aggapi and its dependencies ------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VENV=/opt/aggapi
WORKDIR /src
# Only what the wheel needs (see .dockerignore); the gRPC stubs are committed.
COPY pyproject.toml README.md ./
COPY aggapi ./aggapi
RUN python -m venv "$VENV"
# pip byte-compiles while installing: the read-only root filesystem gets its .pyc files.
RUN "$VENV/bin/pip" install . \
 && "$VENV/bin/aggapi" --help
RUN "$VENV/bin/pip" uninstall -y pip setuptools \
 && "$VENV/bin/aggapi" --version

# ---- runtime -------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="aggapi" \
      org.opencontainers.image.description="Aggregated API server (pods/imagepullprogress, pods/copy) and its node agent" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/aggapi/aggapi"
COPY --from=build /opt/aggapi /opt/aggapi
ENV PATH=/opt/aggapi/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Non-root by default (the apiserver); the agent's pod spec sets runAsUser: 0.
USER 65532:65532
WORKDIR /
ENTRYPOINT ["aggapi"]
CMD ["apiserver"]
