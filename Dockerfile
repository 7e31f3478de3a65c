# syntax=docker/dockerfile:1
# One image, two entry points:
#   aggapi apiserver   Deployment: runs as 65532 (the image default), read-only root filesystem
#   aggapi agent       DaemonSet: the pod spec runs it as root, privileged, hostPID
# It holds the server only: aggapi with its "server" extra (no test harness, no
# aggapi[plugins] extra, no compilers), and the agent's compiled copy loops built in the
# compile stage.
#
# Two ways to build it:
# - docker/podman, from the public Python base (PYTHON_IMAGE below) and a plain checkout:
#     docker build -t aggapi:dev .
#   pip downloads aggapi's dependencies from the package index inside the build stage.
# - hack/build-image.sh (no Docker engine, no Docker Hub): buildah builds this file with
#   PYTHON_IMAGE set to a Debian trixie base made by mmdebstrap, from a context that also
#   holds wheels/, a wheelhouse built on the host (aggapi and its dependencies). When
#   wheels/ is there the build stage installs from it with --no-index: no network, and no
#   need for the host's CA in the build (which is never copied into the image).
# Both bases have python3 (the Debian one has no `python`), so the RUN steps use python3.
#
# Base pinned by digest (python:3.13-slim-trixie: Python 3.13 as in hack/build-image.sh's
# Debian 13 base). Docker Hub was unreachable where this was written, so the digest (as
# other projects pin it) could not be checked there: confirm (and to move it, take) the
# index digest with
#   docker buildx imagetools inspect python:3.13-slim-trixie
# tests/manifests/test_image.py builds the image with hack/build-image.sh and runs it
# under containerd.
ARG PYTHON_IMAGE=docker.io/library/python:3.13-slim-trixie@sha256:9d2e5553305c7c7b0097999bb17187c69b921ccd6bc9d40e4bb5ebe652c00285
# The compile stage's base: the same Python with a C compiler. hack/build-image.sh passes
# a Debian base of the same suite with gcc and python3-dev; docker's python image has the
# headers, and gets gcc from apt in that stage.
ARG COMPILE_IMAGE=${PYTHON_IMAGE}

# ---- compile: the agent's compiled copy loops, for the image's Python ----------------
# aggapi.agent.copy._fastuntar (a tar upload's plain files), aggapi.agent.copy._fastwalk (a
# directory download's plain small files) and aggapi.tar._fastheader (the tar writer's
# header blocks, a directory download's). All optional: the agent logs
# which path it takes, and without them runs its Python paths. Only the built .so files
# leave this stage: no compiler and no headers in the image.
FROM ${COMPILE_IMAGE} AS compile
WORKDIR /src
COPY aggapi/agent/copy/_fastuntar.c aggapi/agent/copy/_fastwalk.c aggapi/agent/copy/
COPY aggapi/tar/_fastheader.c aggapi/tar/_ustar.h aggapi/tar/
RUN if ! command -v gcc >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev; fi \
 && py() { python3 -c "import sys, sysconfig; print($1)"; } \
 && site="/out/opt/aggapi/lib/python$(py '"%d.%d" % sys.version_info[:2]')/site-packages" \
 && for c in aggapi/agent/copy/_fastuntar.c aggapi/agent/copy/_fastwalk.c \
      aggapi/tar/_fastheader.c; do \
      mkdir -p "$site/${c%/*}" \
      && gcc -O2 -Wall -shared -fPIC -I"$(py 'sysconfig.get_paths()["include"]')" "$c" \
           -o "$site/${c%.c}$(py 'sysconfig.get_config_var("EXT_SUFFIX")')" || exit 1; \
    done \
 && cd "$site" && python3 -c "import aggapi.agent.copy._fastuntar, aggapi.agent.copy._fastwalk, \
      aggapi.tar._fastheader"

# ---- build: a self-contained virtualenv with aggapi and its dependencies ------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VENV=/opt/aggapi
WORKDIR /src
# Only what the wheel needs (see .dockerignore: pyproject.toml, README.md, aggapi/ and,
# from hack/build-image.sh, wheels/); the gRPC stubs are committed.
COPY . ./
RUN python3 -m venv "$VENV"
# The servers' dependencies only (the "server" extra, not "plugins"). pip byte-compiles
# while installing: the read-only root filesystem gets its .pyc files.
RUN if [ -d wheels ]; then set -- --no-index --find-links wheels "aggapi[server]"; \
    else set -- ".[server]"; fi \
 && "$VENV/bin/pip" install "$@" \
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
COPY --from=compile /out/opt/aggapi /opt/aggapi
ENV PATH=/opt/aggapi/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Non-root by default (the apiserver); the agent's pod spec sets runAsUser: 0.
USER 65532:65532
WORKDIR /
ENTRYPOINT ["aggapi"]
CMD ["apiserver"]
