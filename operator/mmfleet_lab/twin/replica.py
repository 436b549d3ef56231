"""One vLLM-style replica: the calibrated step-time model, KV capacity and batch limits (``ReplicaParams``).

What is calibrated, fitted, assumed and derived (see also ``docs/twin.md``):

- **Calibrated** on kernels (H200, Qwen2.5-VL-7B, bf16, TP1): the GPU time of one engine step, the
  least-squares fit to ``tests/data/h200_qwen25vl7b.csv`` (method in ``tests/data/README.md``):
  ``T_dense(N)`` knots, ``a_dec`` = 12.49 ns per cached token read by a decode, ``a_pre`` = 0.843 us
  per causal query-key pair of a prompt chunk, ``b_lm`` = 0.44 us per sampled row, and the windowed
  vision encoder ``1.089 + 3.597 P/1000 + 0.042 (P/1000)^2`` ms. ``tests/unit/lab/test_twin_calibration.py``
  replays every decode, prefill, mixed and vision row.
- **Image encoder as vLLM runs it**: eagerly. vLLM compiles and graph-captures only the text model
  unless ``--compilation-config`` sets ``compile_mm_encoder`` / ``cudagraph_mm_encoder`` (both
  default False: ``vllm/config/compilation.py`` in vllm-project/vllm @002284db; the encoder CUDA
  graph of Qwen2.5-VL came in PR 40830 as an opt-in), and mmfleet sets neither. In the kernel table an eager
  call takes at least ``15.97 + 1.83 n`` ms for n images (the rows ``vision_window_eager``: 17.8 ms for one
  image, where the kernels take 4.8 ms in a graph); in the real server more, so the engine charges the launch
  fitted there (``ENCODER_LAUNCH_MS``) on top of the kernels.
- **Fitted** on a real vLLM 0.33.0 server on one H200 (``tests/data/vllm_h200_*.csv``, described in
  ``tests/data/README.md``; ``tests/unit/lab/test_twin_real_server.py`` replays it):
  ``HOST_MS_BASE`` from the batch-1 decode (4.75 ms per token against 4.57 ms of modelled GPU time);
  ``HOST_MS_PER_SEQ`` and ``REQUEST_OVERHEAD_S`` by least squares on the open-loop runs (TTFT
  medians and P90s at 2-10 req/s, e2e medians and P90s at all six rates). The per-sequence term is
  whatever grows with the batch in the real server and not in the kernel table (host work per
  request, paged attention over mixed lengths); the data cannot tell which.
  ``calibrate.py`` refits them on part of the data and holds out the rest: the refit fails held out at
  20 req/s and is not applied.
- **Images** on the real server with images (``calibrate_mm.py``): one batched encoder call per engine step, its
  launch time fitted (``ENCODER_LAUNCH_MS``); the CPU preprocessing per image measured (``IMAGE_CPU_MS``), queued
  on each API server process, one request at a time; then the request waits for the next point of its API process's
  pass grid, spaced per running request as fitted with the launch (``API_PASS_MS``): a phenomenological wait, not a
  model of the process's CPU work.
- **Assumed**: the activation reserve; nothing we have measured it.
- **Derived**, not measured: the H100 profile (``H100_QWEN25VL7B``), scaled from the H200 fit by
  datasheet ratios (see ``derive_profile``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

import numpy as np

# --- calibrated constants (the fit to tests/data/h200_qwen25vl7b.csv, its 73 decode/prefill/mixed rows) ---
DENSE_TOKENS: Final = (1.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
DENSE_MS_H200: Final = (4.566, 4.694, 5.215, 7.227, 12.772, 22.731, 44.620, 88.696, 170.916, 328.316)
A_DEC_MS: Final = 12.4896e-6  # ms per cached KV token read by a decode (= 12.49 ns)
A_PRE_MS: Final = 0.8431e-6  # ms per causal query-key pair of a prompt chunk
B_LM_MS: Final = 0.00044  # ms per sequence that samples a token (logits row)
VISION_WINDOW_MS: Final = (1.089, 3.597, 0.042)  # v0, per 1000 patches, per (1000 patches)^2 of each image
VISION_FULL_MS: Final = (0.955, 3.535, 0.412)  # all-full-attention variant (an upper bound, not Qwen's layout)
# Our fit to the vision_window_eager rows: an eagerly launched encoder takes at least this long.
VISION_EAGER_FLOOR_MS: Final = (15.97, 1.83)  # base, per image
KV_BYTES_PER_TOKEN: Final = 57_344  # 28 layers x K,V x 4 heads x 128 x 2 bytes (Qwen2.5-7B's config)
WEIGHTS_BYTES: Final = 16.6e9  # text 15.2 GB + vision 1.35 GB (the parameter counts x 2 bytes)
GIB: Final = 1024.0**3

# --- FITTED on the real vLLM 0.33.0 server (tests/data/vllm_h200_*.csv; see the module docstring) ---
HOST_MS_BASE: Final = 0.18  # per engine step: batch-1 decode 4.75 ms/token measured - 4.57 ms modelled GPU time
HOST_MS_PER_SEQ: Final = 0.015  # per sequence in the step (least squares over the six open-loop rates)
REQUEST_OVERHEAD_S: Final = 0.0225  # per request before it can be scheduled (TTFT at 2-10 req/s)
# --- FITTED on the real vLLM 0.33.0 server with images (``calibrate_mm.py``; docs/twin.md, "Images") ---
# One batched encoder call per step costs, besides its kernels (``VISION_WINDOW_MS`` over all the step's images),
# this much to launch eagerly, added to the step: base, per image (ms).
ENCODER_LAUNCH_MS: Final = (50.0, 5.0)
# The API pass, ms per request running on the API process: a request with images goes to the engine at the next point
# of a grid of this spacing x running requests per process, so it waits half a pass on average and requests ready
# within one pass reach the engine, and share its encoder call, together. Fitted, not event-loop CPU work: the real API
# process used 0.13-0.46 core at 2-20 req/s. Fitted where ~70 requests ran on the one process on average (peaks ~130);
# beyond, it extrapolates (hundreds running give passes of hundreds of ms; docs/twin.md, Limits).
API_PASS_MS: Final = 2.0
# --- MEASURED: CPU preprocessing per image on the API server process (decode, processor, hashing), ms ---
# base + per image token: the 448x448 JPEG repeat's in-server increment (11.2 ms, no encoder call, no image prefill)
# and the slope of decode + processor with text between 448x448 and 1280x720 JPEG outside the server (6.0 -> 19.9 ms
# for 256 -> 1,196 tokens): tests/data/vllm_h200_preprocess_cpu.csv and tests/data/README.md.
IMAGE_CPU_MS: Final = (7.41, 0.01479)
ENCODER_BUDGET_TOKENS: Final = 16_384  # vLLM's encoder compute budget as the real server set it (one max_pixels image)
# --- ASSUMED constants (nothing we have measured them) ---
ACTIVATION_RESERVE_BYTES: Final = 4.0 * GIB  # activations, CUDA graphs, encoder cache: assumed
DEFAULT_IMAGE_TOKENS: Final = 360  # tokens per image when a trace gives only a count (ServeGen mm-image median)


@dataclass(frozen=True)
class ReplicaParams:
    """The latency and capacity model of one replica for one (model, GPU, vLLM settings).

    Frozen and hashable so that ``capacity_at_slo`` can cache on it.
    """

    name: str
    dense_tokens: tuple[float, ...] = DENSE_TOKENS
    dense_ms: tuple[float, ...] = DENSE_MS_H200
    kv_read_ms: float = A_DEC_MS
    prefill_pair_ms: float = A_PRE_MS
    logits_row_ms: float = B_LM_MS
    vision_ms: tuple[float, float, float] = VISION_WINDOW_MS
    vision_eager: bool = True  # vLLM runs the encoder without CUDA graphs: each call pays its launch
    vision_eager_floor_ms: tuple[float, float] = VISION_EAGER_FLOOR_MS  # the kernel table's (vision_call_ms)
    host_ms_base: float = HOST_MS_BASE
    host_ms_per_seq: float = HOST_MS_PER_SEQ
    request_overhead_s: float = REQUEST_OVERHEAD_S
    encoder_launch_ms: tuple[float, float] = ENCODER_LAUNCH_MS
    image_cpu_ms: tuple[float, float] = IMAGE_CPU_MS
    api_pass_ms: float = API_PASS_MS  # per request running on the API process (image requests wait for the grid)
    api_server_count: int = 1  # API server processes, each preprocessing one request at a time (vLLM's default: 1)
    encoder_budget_tokens: int = ENCODER_BUDGET_TOKENS
    kv_bytes_per_token: int = KV_BYTES_PER_TOKEN
    gpu_memory_bytes: float = 139.8 * GIB  # usable memory of one H200, as the GPU reported it (tests/data/README.md)
    gpu_memory_utilization: float = 0.92  # vLLM 0.33.0's default, as the real server ran (tests/data/README.md)
    weights_bytes: float = WEIGHTS_BYTES
    reserve_bytes: float = ACTIVATION_RESERVE_BYTES
    # vLLM 0.33.0's defaults on an H200 when unset, as the real server ran (tests/data/README.md).
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192

    @property
    def kv_capacity_tokens(self) -> int:
        """KV-cache tokens that fit: memory x utilisation - weights - reserve, per token."""
        free = self.gpu_memory_bytes * self.gpu_memory_utilization - self.weights_bytes - self.reserve_bytes
        return max(int(free // self.kv_bytes_per_token), 0)

    def dense_ms_at(self, n: float) -> float:
        """``T_dense(N)``: linear between knots; proportional beyond the last one (about 20 us per token)."""
        if n >= self.dense_tokens[-1]:
            return self.dense_ms[-1] * n / self.dense_tokens[-1]
        return float(np.interp(n, self.dense_tokens, self.dense_ms))

    def dense_ms_vec(self, n: np.ndarray) -> np.ndarray:
        """Vectorised ``dense_ms_at``."""
        out = np.interp(n, self.dense_tokens, self.dense_ms)
        big = n > self.dense_tokens[-1]
        if np.any(big):
            out[big] = self.dense_ms[-1] * n[big] / self.dense_tokens[-1]
        return np.asarray(out)

    def host_ms(self, seqs: float) -> float:
        """What a real server adds to the modelled GPU time of a step with ``seqs`` sequences (fitted)."""
        return self.host_ms_base + self.host_ms_per_seq * seqs

    def vision_graph_ms(self, patches: list[float] | np.ndarray) -> float:
        """GPU time of one encoder call over images of ``patches`` patches each (calibrated fit)."""
        p = np.asarray(patches, dtype=float) / 1000.0
        if p.size == 0:
            return 0.0
        v0, v1, v2 = self.vision_ms
        return float(v0 + v1 * p.sum() + v2 * (p * p).sum())

    def vision_call_ms(self, patches: list[float] | np.ndarray) -> float:
        """Encoder time as the kernel table measured it: eager launches cannot go below its launch floor."""
        n = len(patches)
        if n == 0:
            return 0.0
        t = self.vision_graph_ms(patches)
        if self.vision_eager:
            a, b = self.vision_eager_floor_ms
            t = max(t, a + b * n)
        return t

    def encoder_alone_ms(self, kernel_ms: float, images: float) -> float:
        """A request's encoder call on an idle replica (``Workload.vis_ms``, its images): what its trace shows."""
        if images <= 0:
            return 0.0
        a, b = self.encoder_launch_ms if self.vision_eager else (0.0, 0.0)
        return self.vision_ms[0] + kernel_ms + a + b * images

    def step_gpu_ms(
        self,
        decode_contexts: list[int] | np.ndarray,
        chunks: list[tuple[int, int]] = (),  # type: ignore[assignment]
        sampling_prefills: int | None = None,
    ) -> float:
        """GPU time of one step (the calibrated formula), without host overhead or vision.

        ``decode_contexts``: context of each decode *before* this step (it attends over context + 1).
        ``chunks``: (new tokens Tc, tokens of the same prompt already cached Cp) per prompt chunk.
        ``sampling_prefills``: chunks that finish their prompt and so sample a token (default: all).
        """
        ctx = np.asarray(decode_contexts, dtype=float)
        n_dec = int(ctx.size)
        n_tok = n_dec + sum(tc for tc, _ in chunks)
        pairs = sum(tc * (cp + (tc + 1) / 2.0) for tc, cp in chunks)
        rows = n_dec + (len(chunks) if sampling_prefills is None else sampling_prefills)
        kv = float((ctx + 1.0).sum())
        return self.dense_ms_at(n_tok) + self.kv_read_ms * kv + self.prefill_pair_ms * pairs + self.logits_row_ms * rows


def derive_profile(
    base: ReplicaParams,
    name: str,
    *,
    bandwidth_ratio: float,
    flops_ratio: float,
    gpu_memory_bytes: float,
    memory_bound_tokens: float = 64.0,
) -> ReplicaParams:
    """A profile for another GPU, DERIVED (not measured) from ``base`` by datasheet ratios.

    ``bandwidth_ratio`` / ``flops_ratio`` are base-GPU over target-GPU (>1: the target is slower).
    The dense part is treated as a roofline: up to ``memory_bound_tokens`` tokens a step is bound by
    reading the weights (the decode rows: up to about 64 sequences), so it scales by bandwidth; beyond, the
    larger of the bandwidth-scaled floor and the FLOPs-scaled time. KV reads scale by bandwidth,
    prompt attention and the vision encoder by FLOPs.
    """
    floor = base.dense_ms_at(memory_bound_tokens) * bandwidth_ratio
    dense = []
    for n, t in zip(base.dense_tokens, base.dense_ms, strict=True):
        if n <= memory_bound_tokens:
            dense.append(t * bandwidth_ratio)
        else:
            dense.append(max(floor, t * flops_ratio))
    v0, v1, v2 = base.vision_ms
    return replace(
        base,
        name=name,
        dense_ms=tuple(dense),
        kv_read_ms=base.kv_read_ms * bandwidth_ratio,
        prefill_pair_ms=base.prefill_pair_ms * flops_ratio,
        vision_ms=(v0, v1 * flops_ratio, v2 * flops_ratio),
        gpu_memory_bytes=gpu_memory_bytes,
    )


H200_QWEN25VL7B: Final = ReplicaParams(name="h200-qwen2.5-vl-7b")
# vLLM 0.33.0's wake from sleep level 1 for this model on one H200 (POST /wake_up: the 16.5 GiB level 1 kept, weights
# and buffers, copied back from pinned CPU memory, and the 108.9 GiB KV cache mapped again), s: the median of the
# three wakes measured for this project (tests/data/vllm_h200_sleep_wake_0.33.0.csv, 1.06-1.08 s). The twin's
# ``wake`` (twin.fleet) for it; tests/unit/lab/test_twin_wake.py holds it to the data.
H200_QWEN25VL7B_WAKE_S: Final = 1.07
# DERIVED: datasheet figures (not read in this work, from general knowledge; treat as ASSUMED):
# H200 SXM 4.8 TB/s vs H100 SXM 3.35 TB/s HBM; the same 989 TFLOP/s dense bf16 and 132 SMs; 80 GB
# (about 79.2 GiB usable, assumed). Splitwise's A100->H100 profiles (splitwise_perf_model_a100_h100.csv)
# show real decode speed-ups of about 0.9x the bandwidth ratio, so this H100 decode is, if anything,
# slightly pessimistic; tests/unit/lab/test_twin_calibration.py checks it against Splitwise's H100 rows.
H100_QWEN25VL7B: Final = derive_profile(
    H200_QWEN25VL7B,
    "h100-qwen2.5-vl-7b (derived)",
    bandwidth_ratio=4.8 / 3.35,
    flops_ratio=1.0,
    gpu_memory_bytes=79.2 * GIB,
)
PROFILES: Final[dict[str, ReplicaParams]] = {"h200": H200_QWEN25VL7B, "h100": H100_QWEN25VL7B}
