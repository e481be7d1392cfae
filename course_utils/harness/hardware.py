"""The GPUs the course reasons about: the numbers of one GPU that the roofline needs (hardware
facts, no answer in them).

    Hardware(name, peak_flops, hbm_bandwidth, l2_bytes, num_sms, sram_per_sm, hbm_bytes)
    H100_SXM, A100   spec-sheet numbers
    H200             ceilings measured on the course's lent H200
    KiB, MiB, GiB    2**10, 2**20, 2**30 bytes
"""

from __future__ import annotations

from dataclasses import dataclass

from course_utils._validate import positive_int, positive_real

KiB, MiB, GiB = 2**10, 2**20, 2**30


@dataclass(frozen=True)
class Hardware:
    """The numbers of one GPU that the roofline needs.

    peak_flops: dense bf16 tensor-core FLOP/s.  hbm_bandwidth: HBM bytes/s.
    l2_bytes: L2 cache size.  num_sms: streaming multiprocessors.
    sram_per_sm: shared memory (SRAM) per SM, bytes.  hbm_bytes: HBM capacity (None if unknown).
    """

    name: str
    peak_flops: float
    hbm_bandwidth: float
    l2_bytes: int
    num_sms: int
    sram_per_sm: int
    hbm_bytes: float | None = None

    def __post_init__(self):
        positive_real(self.peak_flops, "peak_flops")
        positive_real(self.hbm_bandwidth, "hbm_bandwidth")
        for field in ("l2_bytes", "num_sms", "sram_per_sm"):
            positive_int(getattr(self, field), field)
        if self.hbm_bytes is not None:
            positive_real(self.hbm_bytes, "hbm_bytes")

    @property
    def ridge_point(self) -> float:
        """peak_flops / hbm_bandwidth, FLOP/byte: the intensity above which a kernel is
        compute-bound."""
        return self.peak_flops / self.hbm_bandwidth


H100_SXM = Hardware(
    name="H100 SXM",
    peak_flops=989e12,  # dense bf16, spec sheet
    hbm_bandwidth=3.35e12,
    l2_bytes=50 * MiB,
    num_sms=132,
    sram_per_sm=228 * KiB,
    hbm_bytes=80e9,
)
"""NVIDIA H100 SXM5, spec-sheet numbers: ridge point 989 / 3.35 = 295 FLOP/byte."""

A100 = Hardware(
    name="A100",
    peak_flops=312e12,  # dense bf16/fp16 tensor cores
    hbm_bandwidth=2.0e12,  # 80 GB SXM (2.04 TB/s); the 40 GB part has 1.55 TB/s
    l2_bytes=40 * MiB,
    num_sms=108,
    sram_per_sm=192 * KiB,  # L1 + shared memory per SM, 196,608 bytes
    hbm_bytes=80e9,
)
"""NVIDIA A100 (80 GB SXM), rounded: the textbook quotes 1.5-2 TB/s; ridge point 156 FLOP/byte."""

H200 = Hardware(
    name="H200 (measured)",
    peak_flops=797e12,  # measured: dense bf16 matmul
    hbm_bandwidth=4.26e12,  # measured: device-to-device copy, bytes read + written per second
    l2_bytes=50 * MiB,
    num_sms=132,
    sram_per_sm=228 * KiB,
    hbm_bytes=141e9,
)
"""NVIDIA H200 with ceilings MEASURED on the course's lent H200, not the spec sheet (989 TFLOP/s,
4.8 TB/s): 797 TFLOP/s for a large dense bf16 matmul and 4.26 TB/s for a device-to-device copy.
Ridge point 187 FLOP/byte. Use it to compare a measured kernel time with an attainable bound."""


__all__ = ["A100", "H100_SXM", "H200", "GiB", "Hardware", "KiB", "MiB"]
