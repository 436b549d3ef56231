# The mmfleet operator: a small Python image running `mmfleet run`.
# Build from the repository root: docker build -f images/operator.Dockerfile -t mmfleet/operator:0.1.0 .
# Only the operator goes in: operator/mmfleet and no extra, so neither the lab (operator/mmfleet_lab)
# nor its dependencies (numpy, numba, matplotlib, cryptography) are installed.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/mmfleet ./operator/mmfleet
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin mmfleet
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 65532:65532
ENTRYPOINT ["mmfleet"]
CMD ["run"]
