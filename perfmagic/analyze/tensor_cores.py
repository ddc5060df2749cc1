"""Whether a GPU kernel ran on tensor cores, as its name says (cuBLAS, cuDNN, CUTLASS naming).

A kernel's name holds the MMA instruction or shape it was built around: ``h884``/``s884``
(Volta's HMMA.884), ``h1688``, ``i8816`` (Turing), ``h16816``, ``i16832`` (Ampere),
``hmma``/``imma`` (cuDNN's and xmma's traits), ``gmma``/``wgmma`` (Hopper's warpgroup MMA),
``nvjet``/``smNN_xmma`` (cuBLAS's tensor-op kernels, Hopper and Blackwell). :data:`TENSOR_CORE_TABLE`
lists each token with the architecture and precision it stands for and a real kernel name that
holds it; ``docs/guide.md`` prints the table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class TensorCoreToken:
    """A piece of a kernel name that says tensor cores: what it stands for and a real name holding it."""

    pattern: str  # a regular expression over the lower-case name
    architecture: str  # the first GPU architecture with the instruction
    precision: str  # the inputs it multiplies
    example: str  # a kernel name that holds it (see EXAMPLES_FROM_SOURCE)


TENSOR_CORE_TABLE = (
    TensorCoreToken(
        r"[hs]884", "sm70 (Volta)", "FP16 (HMMA.884)",
        "volta_fp16_s884cudnn_fp16_128x128_ldg8_splitK_relu_f2f_exp_small_nhwc_tn_v1",
    ),
    TensorCoreToken(
        r"[dz]884", "sm80 (Ampere)", "FP64 (DMMA.884)", "cutlass_tensorop_z884herk_64x64_8x3_h_l_align1"
    ),
    TensorCoreToken(r"[hsc]1688", "sm75 (Turing)", "FP16, TF32 (HMMA.1688)", "turing_h1688gemm_128x128_ldg8_nt"),
    TensorCoreToken(
        r"i8816", "sm75 (Turing)", "INT8 (IMMA.8816)",
        "cutlass_tensorop_s8_i8816fprop_few_channels_s8_128x128_32x2_nhwc_align16",
    ),
    TensorCoreToken(
        r"[hsb]16816", "sm80 (Ampere)", "FP16, BF16 (HMMA.16816)", "ampere_h16816gemm_256x128_ldg8_stages_64x3_nn"
    ),
    TensorCoreToken(
        r"i16832", "sm80 (Ampere)", "INT8 (IMMA.16832)", "cutlass_80_tensorop_i16832gemm_s8_256x128_64x3_tn_align16"
    ),
    TensorCoreToken(
        r"hmma", "sm70 (Volta)", "FP16, BF16, TF32", "Volta_hmma_implicit_gemm_fprop_fp32_nhwc_128x128x64x1_1x3x3x0x1"
    ),
    TensorCoreToken(
        r"imma", "sm75 (Turing)", "INT8", "void xmma::gemm::kernel<xmma::Turing_imma_int8_int32_traits>"
    ),
    TensorCoreToken(r"wgmma", "sm90 (Hopper)", "FP16, BF16, FP8 (warpgroup MMA)", "gemm_wgmma_m64n128k32_tma_ab_mbar"),
    TensorCoreToken(r"gmma", "sm90 (Hopper)", "FP16, BF16, FP8 (warpgroup MMA)", "void xmma::gemm::kernel<xmma::Hopper_hgmma_fp32_traits>"),
    TensorCoreToken(
        r"sm1[0-2]\d_xmma|nvjet_sm1[0-2]\d|tcgen05", "sm100 (Blackwell)", "FP16, BF16, FP8, FP4",
        "nvjet_sm100_tst_128x256_64x4_1x2_h_bz_TNT",
    ),
    TensorCoreToken(r"nvjet", "sm90 (Hopper)", "FP16, BF16, FP8", "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN"),
    TensorCoreToken(
        r"tf32", "sm80 (Ampere)", "TF32", "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1_g1_tensor16x8x8_alignc4_execute_kernel__5x_cudnn"
    ),
    TensorCoreToken(
        r"xmma", "sm75 (Turing; its smNN_ prefix names it)", "FP16, BF16, TF32, INT8",
        "sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor",
    ),
    TensorCoreToken(
        r"tensorop", "sm70 (CUTLASS's tensor-op kernels)", "as the name's types say",
        "cutlass3x_sm90_tensorop_gemm_f16_f16_f16_f16_f16_128x256x64_1x2x1_0_tnn_align8_warpspecialized_pingpong_epi_tma",
    ),
)  # fmt: skip
"""Tokens that say tensor cores, most specific first: a name is matched against them in this order."""

EXAMPLES_FROM_SOURCE = frozenset({"imma", "gmma", "wgmma"})
"""Rows whose example is spelled as the libraries' sources name their traits or kernels (xmma's
``Turing_imma_int8_int32_traits``, ``Hopper_hgmma_...``, a hand-written Hopper ``wgmma`` GEMM), not
copied from a profile: the other examples are names that cuBLAS, cuDNN or CUTLASS kernels have in
published profiles or in CUTLASS's kernel list."""

TENSOR_TYPES = ("bf16", "fp16", "f16f16", "e4m3", "e5m2")
"""Types only tensor cores multiply: in a matrix kernel's name, they say it ran on them."""
MATRIX_KERNEL = re.compile(r"gemm|conv[0-9_]|convolution|convolve|wgrad|dgrad|fprop|[shd]cudnn")
"""A matrix kernel's name: matrix products and convolutions (``scudnn``: cuDNN's SIMT convolutions)."""
SIMT = "ffma"
"""A name with this runs fused multiply-adds on CUDA cores, whatever else it says."""

# one search for every token (a trace has hundreds of kernel names)
_TOKENS = re.compile("|".join(t.pattern for t in TENSOR_CORE_TABLE))
_ROWS = [re.compile(t.pattern) for t in TENSOR_CORE_TABLE]
_TENSOR_TYPE = re.compile("|".join(TENSOR_TYPES))


def _plain(name: str) -> str:
    """The part of a name that says: before its argument list (template arguments kept: CUTLASS names its
    kernels there), lower case, FBGEMM's library name left out (its ``gemm`` is no matrix product)."""
    return name.split("(", 1)[0].lower().replace("fbgemm", "")


def tensor_core_token(name: str) -> TensorCoreToken | None:
    """The first :data:`TENSOR_CORE_TABLE` row whose token is in a kernel's name, or None."""
    low = _plain(name)
    return next((row for row, p in zip(TENSOR_CORE_TABLE, _ROWS, strict=True) if p.search(low)), None)


def tensor_cores(name: str) -> bool | None:
    """Whether a kernel ran on tensor cores, as far as its name says.

    True for a :data:`TENSOR_CORE_TABLE` token, or a matrix kernel (``MATRIX_KERNEL``) with a
    ``TENSOR_TYPES`` type, unless ``ffma`` (SIMT fused multiply-add) is in it; False for another
    matrix kernel (e.g. ``ampere_sgemm_128x64_nn``, ``volta_scudnn_128x64_relu_small_nn_v1``: CUDA
    cores); None when the name does not tell.
    """
    low = _plain(name)
    matrix = MATRIX_KERNEL.search(low) is not None
    if SIMT not in low and (
        _TOKENS.search(low) is not None or (matrix and _TENSOR_TYPE.search(low) is not None)
    ):
        return True
    return False if matrix else None
