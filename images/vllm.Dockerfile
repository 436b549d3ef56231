# vLLM, pinned to the version mmfleet's flags were checked against, with a non-root user so the
# pod can run under runAsNonRoot (HOME and the HF cache live on the /cache volume).
FROM vllm/vllm-openai:v0.33.0
RUN useradd --uid 1000 --create-home --home-dir /home/vllm vllm
USER 1000:1000
ENV HOME=/cache HF_HOME=/cache/huggingface
