# The operator image: the operator and the gateway, and triton-runtime, which init containers and
# download Jobs run and which is copied from here into NVIDIA's image where a GPU is needed.
#   docker build -t ghcr.io/triton-operator/triton-operator:0.1.0 .
#
# Python 3.13: supported with security fixes until October 2029, and every dependency ships
# wheels for it. (The tests run on the machine's Python, 3.11 or newer; triton-runtime also runs
# on NVIDIA's image's Python 3.12.)
#
# The base image is pinned by digest: python:3.13-slim as of 2026-09-28 (Python 3.13.15; the
# multi-platform index a public build log recorded that day; this project's machines cannot reach
# Docker Hub to resolve it). To move it, resolve the tag and rebuild:
#   docker buildx imagetools inspect python:3.13-slim --format '{{json .Manifest.Digest}}'
#   docker build --build-arg PYTHON_IMAGE=python:3.13-slim@sha256:<digest> .
# then put the digest here. Dependencies come from hash-checked lock files (make lock).
ARG PYTHON_IMAGE=python:3.13-slim@sha256:7c61056e61ac89e852de05f3dc6fa51a6dd2181797bceed46aa725dd7cb2cd3b

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY requirements/operator-image.lock requirements/runtime-image.lock ./requirements/
# Two environments: the Kubernetes client needs python-dateutil 3+, botocore (s3:// models)
# below 3, so the operator and triton-runtime cannot share one.
RUN python -m venv /opt/operator && python -m venv /opt/runtime \
 && /opt/operator/bin/pip install --no-cache-dir --require-hashes --no-deps -r requirements/operator-image.lock \
 && /opt/runtime/bin/pip install --no-cache-dir --require-hashes --no-deps -r requirements/runtime-image.lock
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY runtime ./runtime
RUN /opt/operator/bin/pip install --no-cache-dir --no-deps . \
 && /opt/runtime/bin/pip install --no-cache-dir --no-deps ./runtime

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/operator /opt/operator
COPY --from=build /opt/runtime /opt/runtime
ENV PATH=/opt/operator/bin:/opt/runtime/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# A fixed unprivileged user; the chart runs with readOnlyRootFilesystem and /tmp as an emptyDir.
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["triton-operator"]
CMD ["run"]
