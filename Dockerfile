# The operator image (also what init containers and preparation Jobs run triton-runtime from):
# `docker build -t ghcr.io/triton-operator/triton-operator:0.1.0 .`
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY runtime ./runtime
# triton-runtime too: init containers write model repositories with it, preparation Jobs download
# with it, and it is copied from here into NVIDIA's stock image where a GPU is needed.
RUN pip install --no-cache-dir --prefix=/install . "./runtime[hf,s3,gs]"

FROM python:3.11-slim
COPY --from=build /install /usr/local
# A fixed unprivileged user; the chart runs with readOnlyRootFilesystem and /tmp as an emptyDir.
USER 65532:65532
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
EXPOSE 8080 8081
ENTRYPOINT ["triton-operator"]
CMD ["run"]
