/* CPU fast paths of the quantizers: which row functions nb_quantize / nb_fake_quant /
 * nb_qtensor_dequantize run. Every fast path is bit-equal to the scalar reference (tests/c/test_quant_fast.c);
 * the choice only changes speed. */
#ifndef NIBBLE_QUANT_FAST_H
#define NIBBLE_QUANT_FAST_H

#include "nibble/ctx.h"

/* The row functions ctx runs: "avx512" (the AVX2 rows, plus AVX-512 kernels that nb_quantize runs
 * on BF16 input), "avx2" (AVX2+FMA+F16C), "reference" (the scalar references), or "mixed" when
 * nb_qformat_set_rows has installed others for some formats. A context starts on the path its options
 * name (nb_ctx_options.quant_path), else the one NIBBLE_QUANT_PATH names when it is created (auto,
 * avx512, avx2 or reference; unset or empty means auto), else the best the CPU has. A NIBBLE_QUANT_PATH
 * that is not a path, or a path this CPU lacks, is not replaced silently: auto is installed and every
 * quantize, fake quant, calibration and dequantize on that context fails (NB_ERR_INVALID, or
 * NB_ERR_UNSUPPORTED for a missing path) with a message naming the variable, its value and the valid
 * values, until nb_quant_set_cpu_path chooses a path explicitly. */
NB_API const char *nb_quant_cpu_path(const nb_ctx *ctx);
/* Install one path for every format of this context: "auto" (the best this CPU runs), "avx512",
 * "avx2" or "reference". NB_ERR_UNSUPPORTED when the CPU (or this build) lacks the path, NB_ERR_INVALID
 * for another name. Other contexts keep theirs; call it while no quantization runs on this context. */
NB_API nb_status nb_quant_set_cpu_path(nb_ctx *ctx, const char *path);

#endif
