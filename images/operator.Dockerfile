# The mmfleet operator: a small Python image running `mmfleet run`. Build from the repository root:
#   docker build -f images/operator.Dockerfile --build-arg VERSION="$(cat VERSION)" -t "ghcr.io/mmfleet/operator:$(cat VERSION)" .
# The file VERSION is the one place the version is written: the wheel's version is read from it, and the tag, the
# chart's appVersion and the image the kustomize base and the chart run say the same
# (tests/contract/test_images.py checks all of them agree).
# Only the operator goes in: the mmfleet distribution (operator/mmfleet) and no extra, so neither the lab
# (mmfleet-lab, lab/pyproject.toml) nor its dependencies (numpy, numba, matplotlib, cryptography) are installed.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md VERSION ./
COPY operator/mmfleet ./operator/mmfleet
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ARG VERSION
LABEL org.opencontainers.image.title="mmfleet-operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# The Deployment runs this with readOnlyRootFilesystem and an emptyDir on /tmp: pip compiles the bytecode at
# install time, so nothing is written beside the code at run time, and HOME points at the writable /tmp.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
RUN useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin mmfleet
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# Numeric, so the kubelet can check runAsNonRoot without reading /etc/passwd; the Deployment's runAsUser.
USER 65532:65532
ENTRYPOINT ["mmfleet"]
CMD ["run"]
