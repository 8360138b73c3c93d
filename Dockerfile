# syntax=docker/dockerfile:1
# The operator's image: `trainer run` as a non-root user, on a read-only root filesystem.
#
#   docker build -t trainer-operator:0.1.0 .
#
# BASE_IMAGE: pinned by tag and by the digest of that tag's multi-platform index, so a rebuilt tag
# never changes the image under us (update both together). Any Python 3.11 image with venv and
# `python` on PATH will do for builds where Docker Hub cannot be reached (scripts/cluster builds
# this file with buildah on a base made from Debian's packages). PIP_INDEX_URL and PIP_CERT: for
# builds behind a mirror or a TLS-inspecting proxy.
ARG BASE_IMAGE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

# Build stage: install the project and its dependencies into a virtual environment.
FROM ${BASE_IMAGE} AS build
ARG PIP_INDEX_URL
ARG PIP_CERT

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/trainer

WORKDIR /src
# The dependencies first, each pinned with its hashes: pip refuses any file that differs from what
# was locked (requirements.lock says how to regenerate it).
COPY requirements.lock ./
RUN /opt/trainer/bin/pip install --no-cache-dir --require-hashes --no-deps -r requirements.lock
# Only what the package is built from (see .dockerignore).
COPY pyproject.toml README.md ./
COPY trainer/ trainer/
COPY plugins/ plugins/
COPY runtimes/ runtimes/
COPY crds/ crds/
COPY examples/ examples/
# The project itself, with no dependency resolved here; then no installer is left in the venv.
RUN /opt/trainer/bin/pip install --no-cache-dir --no-deps . \
    && /opt/trainer/bin/pip uninstall -y setuptools pip \
    && /opt/trainer/bin/python -m compileall -q /opt/trainer/lib

# Run stage: the interpreter, the virtual environment, and nothing to build with.
FROM ${BASE_IMAGE}

LABEL org.opencontainers.image.title="trainer-operator" \
      org.opencontainers.image.description="Kubeflow Trainer v2 control plane (trainer.kubeflow.org/v1alpha1) in Python" \
      org.opencontainers.image.licenses="Apache-2.0"

# Bytecode is compiled at build time; nothing is written at run time except to /tmp (an emptyDir).
ENV PATH=/opt/trainer/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp

COPY --from=build /opt/trainer /opt/trainer
# No installer at run time: the base's pip (and the setuptools and wheel some bases carry) go.
# A base without pip has nothing to remove.
RUN (python -m pip uninstall -y pip setuptools wheel >/dev/null 2>&1 || true) \
    && ! python -m pip --version >/dev/null 2>&1

# A numeric user, so that Kubernetes can check runAsNonRoot.
USER 65532:65532
WORKDIR /tmp

ENTRYPOINT ["trainer"]
CMD ["run", "--all-namespaces"]
