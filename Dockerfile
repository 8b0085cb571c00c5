# The operator image: `docker build -t ghcr.io/triton-operator/triton-operator:0.1.0 .`
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
COPY --from=build /install /usr/local
# A fixed unprivileged user; the chart runs with readOnlyRootFilesystem and /tmp as an emptyDir.
USER 65532:65532
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
EXPOSE 8080 8081
ENTRYPOINT ["triton-operator"]
CMD ["run"]
