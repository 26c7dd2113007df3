/* The format and preset descriptor tables (nibble/formats.h): what each format is and what each
 * recipe preset asks for, in one place. Values from FORMATS.md; tests/c/test_formats.c checks every
 * field. The row functions stay in formats.c's traits table. */
#include <string.h>

#include "nibble/formats.h"

#define CALIB(m) (1u << (m))

/* What NVFP4 and its four_over_six variant share: the bytes on disk and how both layouts describe them
 * (FORMATS §1.5, §2.4, §3.2, §4.1). */
#define NVFP4_ON_DISK                                                                                             \
    .disk_format = NB_FMT_NVFP4, .block_size = NB_NVFP4_BLOCK, .elem_dtype = NB_E2M1, .data_dtype = NB_U8,        \
    .scale_dtype = NB_E4M3, .has_scale2 = 1, .maxbound = 6.0f, .per_row = 0, .groupable = 1, .fuse_weights = 1,   \
    .state_dynamic = "amax", .state_static = "block_amax global_amax", .quant_algo = "W4A16_NVFP4",               \
    .quant_algo_act = "NVFP4", .ct_format = "nvfp4-pack-quantized", .ct_num_bits = 4,                             \
    .ct_group_size = NB_NVFP4_BLOCK, .ct_strategy = "tensor_group", .ct_scale_dtype = "torch.float8_e4m3fn",      \
    .ct_input_dynamic = "local", .ct_input_observer = "static_minmax", .ct_inverse_scales = 1,                    \
    .mo_weight = "weight", .mo_scale = "weight_scale", .mo_scale2 = "weight_scale_2", .mo_input = "input_scale",  \
    .ct_weight = "weight_packed", .ct_scale = "weight_scale", .ct_scale2 = "weight_global_scale",                 \
    .ct_input = "input_global_scale"

/* The tensor names of the E4M3 formats: the same in both layouts (FORMATS §4.2, §5, §6). */
#define E4M3_NAMES                                                                                                \
    .mo_weight = "weight", .mo_scale = "weight_scale", .mo_scale2 = NULL, .mo_input = "input_scale",              \
    .ct_weight = "weight", .ct_scale = "weight_scale", .ct_scale2 = NULL, .ct_input = "input_scale"

/* FP8 per tensor and per row: E4M3 elements, F32 scales, compressed-tensors' float-quantized (FORMATS §6). */
#define FP8_COMMON                                                                                                \
    .block_size = 0, .elem_dtype = NB_E4M3, .data_dtype = NB_E4M3, .scale_dtype = NB_F32, .has_scale2 = 0,       \
    .maxbound = 448.0f, .scale_norm = 0.0f, .fuse_weights = 0, .state_dynamic = "amax", .state_static = NULL,     \
    .calib_methods = CALIB(NB_CALIB_MAX) | CALIB(NB_CALIB_MSE), .ct_format = "float-quantized", .ct_num_bits = 8, \
    .ct_group_size = 0, .ct_scale_dtype = NULL, .ct_input_dynamic = "false", .ct_input_observer = "static_minmax", \
    .ct_inverse_scales = 0, E4M3_NAMES

/* clang-format off */
static const nb_format_desc FORMATS[NB_FMT_COUNT] = {
    [NB_FMT_NVFP4] = {
        .id = NB_FMT_NVFP4, .name = "nvfp4", .summary = "E2M1 x16 + E4M3 block scale + F32 weight_scale_2",
        NVFP4_ON_DISK, .scale_norm = 448.0f, .input_ok = 1,
        .calib_methods = CALIB(NB_CALIB_MAX) | CALIB(NB_CALIB_MSE)},
    [NB_FMT_NVFP4_46] = {
        .id = NB_FMT_NVFP4_46, .name = "nvfp4_46",
        .summary = "four_over_six: NVFP4 bytes, each block scaled to 6 or 4, block scales normalized to 256",
        NVFP4_ON_DISK, .scale_norm = 256.0f, .input_ok = 0,
        .calib_methods = CALIB(NB_CALIB_MAX) | CALIB(NB_CALIB_MSE) | CALIB(NB_CALIB_FOUR_OVER_SIX)},
    [NB_FMT_MXFP8] = {
        .id = NB_FMT_MXFP8, .name = "mxfp8", .summary = "E4M3 x32 + E8M0 block scale",
        .disk_format = NB_FMT_MXFP8, .block_size = NB_MXFP8_BLOCK, .elem_dtype = NB_E4M3, .data_dtype = NB_E4M3,
        .scale_dtype = NB_U8, .has_scale2 = 0, .maxbound = 448.0f, .scale_norm = 0.0f, .per_row = 0,
        .input_ok = 1, .groupable = 0, .fuse_weights = 0, .state_dynamic = "", .state_static = NULL,
        .calib_methods = CALIB(NB_CALIB_MAX), .quant_algo = "MXFP8", .quant_algo_act = "MXFP8",
        .ct_format = "mxfp8-quantized", .ct_num_bits = 8, .ct_group_size = NB_MXFP8_BLOCK,
        .ct_strategy = "group", .ct_scale_dtype = "torch.uint8", .ct_input_dynamic = "true",
        .ct_input_observer = NULL, .ct_inverse_scales = 0, E4M3_NAMES},
    [NB_FMT_FP8_TENSOR] = {
        .id = NB_FMT_FP8_TENSOR, .name = "fp8", .summary = "E4M3 + one F32 weight_scale per tensor",
        .disk_format = NB_FMT_FP8_TENSOR, FP8_COMMON, .per_row = 0, .input_ok = 1, .groupable = 1,
        .quant_algo = "FP8", .quant_algo_act = "FP8", .ct_strategy = "tensor"},
    [NB_FMT_FP8_CHANNEL] = {
        .id = NB_FMT_FP8_CHANNEL, .name = "fp8_channel", .summary = "E4M3 + one F32 weight_scale per output row",
        .disk_format = NB_FMT_FP8_CHANNEL, FP8_COMMON, .per_row = 1, .input_ok = 0, .groupable = 0,
        .quant_algo = "FP8_PER_CHANNEL_PER_TOKEN", .quant_algo_act = "FP8_PER_CHANNEL_PER_TOKEN",
        .ct_strategy = "channel"},
};

/* The recipe presets, in --help order (FORMATS §3.2 for the ModelOpt presets they mirror). */
static const nb_preset_desc PRESETS[] = {
    {"nvfp4_w4a16", NB_PRESET_LINEAR, "NVFP4 weights, dynamic block scales; activations unquantized",
     NB_FMT_NVFP4, 0, NB_FMT_NONE, "dynamic", NB_CALIB_MAX, "nvfp4_4o6"},
    {"nvfp4", NB_PRESET_LINEAR, "W4A4: NVFP4 weights and activations (needs calibration data)",
     NB_FMT_NVFP4, 0, NB_FMT_NVFP4, "dynamic", NB_CALIB_MAX, "nvfp4_4o6_a4"},
    {"nvfp4_static", NB_PRESET_LINEAR, "NVFP4 weights with calibrated per-block amax",
     NB_FMT_NVFP4, 1, NB_FMT_NONE, "static", NB_CALIB_MAX, "nvfp4_4o6"},
    {"nvfp4_4o6", NB_PRESET_LINEAR, "NVFP4 weights, four_over_six (each block scaled to 6 or 4)",
     NB_FMT_NVFP4_46, 1, NB_FMT_NONE, "static", NB_CALIB_FOUR_OVER_SIX, "nvfp4_4o6"},
    {"nvfp4_4o6_a4", NB_PRESET_LINEAR, "W4A4: four_over_six weights, NVFP4 activations (needs calibration data)",
     NB_FMT_NVFP4_46, 1, NB_FMT_NVFP4, "static", NB_CALIB_FOUR_OVER_SIX, "nvfp4_4o6_a4"},
    {"mxfp8", NB_PRESET_LINEAR, "MXFP8 weights (E4M3 x32, E8M0 block scale)",
     NB_FMT_MXFP8, 0, NB_FMT_NONE, "dynamic", NB_CALIB_MAX, NULL},
    {"fp8", NB_PRESET_LINEAR, "W8A8: FP8 weights and activations, per tensor (needs calibration data)",
     NB_FMT_FP8_TENSOR, 0, NB_FMT_FP8_TENSOR, "per_tensor", NB_CALIB_MAX, NULL},
    {"fp8_per_channel", NB_PRESET_LINEAR, "FP8 weights, one scale per output channel",
     NB_FMT_FP8_CHANNEL, 0, NB_FMT_NONE, "per_channel", NB_CALIB_MAX, NULL},
    /* ModelOpt's FP8_KV_CFG: keys (after RoPE) and values, k_scale / v_scale = amax / 448 per layer */
    {"fp8", NB_PRESET_KV, "FP8 KV cache: k_scale / v_scale per layer (needs calibration data)",
     NB_FMT_FP8_TENSOR, 0, NB_FMT_NONE, "per_tensor", NB_CALIB_MAX, NULL},
};
/* clang-format on */

enum { N_PRESETS = (int)(sizeof PRESETS / sizeof PRESETS[0]) };

/* Other spellings of format names: the recipe preset's and the calibration algorithm's for four_over_six,
 * and the long names of the FP8 granularities. */
static const struct {
    const char *alias;
    nb_qformat format;
} ALIASES[] = {
    {"nvfp4_4o6", NB_FMT_NVFP4_46},
    {"four_over_six", NB_FMT_NVFP4_46},
    {"fp8_tensor", NB_FMT_FP8_TENSOR},
    {"fp8_per_channel", NB_FMT_FP8_CHANNEL},
};

static const char *const CALIB_NAMES[NB_CALIB_COUNT] = {
    [NB_CALIB_MAX] = "max", [NB_CALIB_MSE] = "mse", [NB_CALIB_FOUR_OVER_SIX] = "four_over_six"};

const nb_format_desc *nb_format_desc_of(nb_qformat f) {
    return ((unsigned)f < NB_FMT_COUNT && f != NB_FMT_NONE) ? &FORMATS[f] : NULL;
}

int nb_format_uses_state(const nb_format_desc *d, int is_static, const char *attr) {
    const char *list = d ? (is_static ? d->state_static : d->state_dynamic) : NULL;
    if (!list || !attr || !attr[0]) return 0;
    size_t n = strlen(attr);
    for (const char *p = list; (p = strstr(p, attr)) != NULL; p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0)) return 1;
    return 0;
}

int nb_preset_count(void) { return N_PRESETS; }

const nb_preset_desc *nb_preset_at(int i) { return (i >= 0 && i < N_PRESETS) ? &PRESETS[i] : NULL; }

const nb_preset_desc *nb_preset_find(const char *name, nb_preset_kind kind) {
    if (!name) return NULL;
    for (int i = 0; i < N_PRESETS; i++)
        if (PRESETS[i].kind == kind && strcmp(PRESETS[i].name, name) == 0) return &PRESETS[i];
    return NULL;
}

const char *nb_preset_quant_algo(const nb_preset_desc *p) {
    const nb_format_desc *d = p ? nb_format_desc_of(p->weight_format) : NULL;
    if (!d) return NULL;
    return p->input_format != NB_FMT_NONE ? d->quant_algo_act : d->quant_algo;
}

const nb_preset_desc *nb_preset_with_algorithm(const nb_preset_desc *p, nb_calib_method m) {
    const nb_format_desc *d = p ? nb_format_desc_of(p->weight_format) : NULL;
    if (!d || (unsigned)m >= NB_CALIB_COUNT) return NULL;
    if (m == NB_CALIB_FOUR_OVER_SIX) return p->four_over_six ? nb_preset_find(p->four_over_six, p->kind) : NULL;
    return (d->calib_methods & CALIB(m)) ? p : NULL;
}

const char *nb_qformat_alias(int i, nb_qformat *format) {
    if (i < 0 || i >= (int)(sizeof ALIASES / sizeof ALIASES[0])) return NULL;
    if (format) *format = ALIASES[i].format;
    return ALIASES[i].alias;
}

int nb_calib_method_from_name(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < NB_CALIB_COUNT; i++)
        if (strcmp(CALIB_NAMES[i], name) == 0) return i;
    return -1;
}

const char *nb_calib_method_name(nb_calib_method m) {
    return (unsigned)m < NB_CALIB_COUNT ? CALIB_NAMES[m] : NULL;
}
