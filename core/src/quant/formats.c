/* The quantization format traits table (ggml-style: one row per stable nb_qformat id) and the
 * small numeric helpers the calibrators share. The rows are constant: which row functions run is
 * each context's choice (its backend, core/src/cpu/fast_dispatch.c). */
#include <math.h>
#include <string.h>

#include "nibble/formats.h"
#include "quant/quant_internal.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

static const nb_qformat_traits TRAITS[NB_FMT_COUNT] = {
    [NB_FMT_NONE] = {"none", NB_FMT_NONE, 0, NB_F32, NB_F32, NB_F32, 0.0f, 0.0f},
    [NB_FMT_NVFP4] = {"nvfp4", NB_FMT_NVFP4, NB_NVFP4_BLOCK, NB_E2M1, NB_U8, NB_E4M3, 6.0f, 448.0f},
    [NB_FMT_NVFP4_46] = {"nvfp4_46", NB_FMT_NVFP4, NB_NVFP4_BLOCK, NB_E2M1, NB_U8, NB_E4M3, 6.0f, 256.0f},
    [NB_FMT_MXFP8] = {"mxfp8", NB_FMT_MXFP8, NB_MXFP8_BLOCK, NB_E4M3, NB_E4M3, NB_U8, 448.0f, 0.0f},
    [NB_FMT_FP8_TENSOR] = {"fp8", NB_FMT_FP8_TENSOR, 0, NB_E4M3, NB_E4M3, NB_F32, 448.0f, 0.0f},
    [NB_FMT_FP8_CHANNEL] = {"fp8_channel", NB_FMT_FP8_CHANNEL, 0, NB_E4M3, NB_E4M3, NB_F32, 448.0f, 0.0f},
};

const nb_qformat_traits *nb_qformat_info(nb_qformat f) {
    return ((unsigned)f < NB_FMT_COUNT) ? &TRAITS[f] : NULL;
}

int nb_qformat_from_name(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < NB_FMT_COUNT; i++)
        if (strcmp(TRAITS[i].name, name) == 0) return i;
    nb_qformat f;
    const char *a;
    for (int i = 0; (a = nb_qformat_alias(i, &f)) != NULL; i++)   /* the other spellings (formats.h) */
        if (strcmp(a, name) == 0) return f;
    return -1;
}

float nb_linspace_f32(double start, double stop, int64_t steps, int64_t i) {
    float a = (float)start, b = (float)stop;
    if (steps <= 1) return a;
    float span = b - a;
    float step = span / (float)(steps - 1);
    /* torch's CPU kernel evaluates start + step*i (and stop - step*(steps-1-i)) with one rounding */
    if (i < steps / 2) return fmaf(step, (float)i, a);
    return fmaf(-step, (float)(steps - 1 - i), b);
}

int64_t nb_mse_steps(double start, double stop, double step) {
    if (!(step > 0.0) || !(stop >= start)) return 1;
    return (int64_t)ceil((stop - start) / step) + 1;
}
