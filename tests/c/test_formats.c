/* The format and preset descriptor tables (nibble/formats.h): every field of every row against the
 * values FORMATS.md gives (spelled out again here, independently of the table), the traits table's
 * numbers agreeing with them, the on-disk dtypes and the calibrated state a real quantize / calibration
 * produces, the aliases, the calibration algorithm names, what four_over_six does to each preset, and the
 * read-back's recognition of stored modules (and its messages), which it takes from the rows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nbtest.h"

static nb_ctx *ctx;

static int same_str(const char *a, const char *b) {
    if (!a || !b) return a == b;
    return strcmp(a, b) == 0;
}
/* Is word one of the space-separated words of list? */
static int has_word(const char *list, const char *word) {
    size_t n = strlen(word);
    for (const char *p = list; (p = strstr(p, word)) != NULL; p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0)) return 1;
    return 0;
}
#define CHECK_STR(a, b) CHECK_MSG(same_str((a), (b)), "%s is '%s', expected '%s'", #a, (a) ? (a) : "(null)", \
                                  (b) ? (b) : "(null)")

/* FORMATS.md §1.5, §2.4, §3.2, §4.1, §5, §6 */
static const struct {
    nb_qformat id;
    const char *name;
    nb_qformat disk;
    int block;
    nb_dtype elem, data, scale;
    int scale2;
    float maxbound, norm;
    int per_row, input_ok, groupable, fuse;
    const char *st_dyn, *st_static;
    uint32_t calib;
    const char *qa, *qa_act;
    const char *ct_format;
    int ct_bits, ct_group;
    const char *ct_strategy, *ct_scale_dtype, *ct_in_dyn, *ct_in_obs;
    int ct_inv;
    const char *mo[4], *ct[4];
} WANT[] = {
    {NB_FMT_NVFP4, "nvfp4", NB_FMT_NVFP4, 16, NB_E2M1, NB_U8, NB_E4M3, 1, 6.0f, 448.0f, 0, 1, 1, 1, "amax",
     "block_amax global_amax", 3u, "W4A16_NVFP4", "NVFP4", "nvfp4-pack-quantized", 4, 16, "tensor_group",
     "torch.float8_e4m3fn", "local", "static_minmax", 1,
     {"weight", "weight_scale", "weight_scale_2", "input_scale"},
     {"weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"}},
    {NB_FMT_NVFP4_46, "nvfp4_46", NB_FMT_NVFP4, 16, NB_E2M1, NB_U8, NB_E4M3, 1, 6.0f, 256.0f, 0, 0, 1, 1, "amax",
     "block_amax global_amax", 7u, "W4A16_NVFP4", "NVFP4", "nvfp4-pack-quantized", 4, 16, "tensor_group",
     "torch.float8_e4m3fn", "local", "static_minmax", 1,
     {"weight", "weight_scale", "weight_scale_2", "input_scale"},
     {"weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"}},
    {NB_FMT_MXFP8, "mxfp8", NB_FMT_MXFP8, 32, NB_E4M3, NB_E4M3, NB_U8, 0, 448.0f, 0.0f, 0, 1, 0, 0, "", NULL, 1u,
     "MXFP8", "MXFP8", "mxfp8-quantized", 8, 32, "group", "torch.uint8", "true", NULL, 0,
     {"weight", "weight_scale", NULL, "input_scale"}, {"weight", "weight_scale", NULL, "input_scale"}},
    {NB_FMT_FP8_TENSOR, "fp8", NB_FMT_FP8_TENSOR, 0, NB_E4M3, NB_E4M3, NB_F32, 0, 448.0f, 0.0f, 0, 1, 1, 0, "amax",
     NULL, 3u, "FP8", "FP8", "float-quantized", 8, 0, "tensor", NULL, "false", "static_minmax", 0,
     {"weight", "weight_scale", NULL, "input_scale"}, {"weight", "weight_scale", NULL, "input_scale"}},
    {NB_FMT_FP8_CHANNEL, "fp8_channel", NB_FMT_FP8_CHANNEL, 0, NB_E4M3, NB_E4M3, NB_F32, 0, 448.0f, 0.0f, 1, 0, 0, 0,
     "amax", NULL, 3u, "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PER_CHANNEL_PER_TOKEN", "float-quantized", 8, 0, "channel",
     NULL, "false", "static_minmax", 0,
     {"weight", "weight_scale", NULL, "input_scale"}, {"weight", "weight_scale", NULL, "input_scale"}},
};
enum { N_WANT = (int)(sizeof WANT / sizeof WANT[0]) };

static void test_format_rows(void) {
    CHECK(nb_format_desc_of(NB_FMT_NONE) == NULL);
    CHECK(nb_format_desc_of(NB_FMT_COUNT) == NULL);
    CHECK(nb_format_desc_of((nb_qformat)-1) == NULL);
    CHECK_EQ_INT(N_WANT, NB_FMT_COUNT - 1);   /* a new format needs its row here too */
    for (int i = 0; i < N_WANT; i++) {
        const nb_format_desc *d = nb_format_desc_of(WANT[i].id);
        CHECK(d != NULL);
        if (!d) continue;
        printf("format %s\n", WANT[i].name);
        CHECK_EQ_INT(d->id, WANT[i].id);
        CHECK_STR(d->name, WANT[i].name);
        CHECK(d->summary && d->summary[0]);
        CHECK_EQ_INT(d->disk_format, WANT[i].disk);
        CHECK_EQ_INT(d->block_size, WANT[i].block);
        CHECK_EQ_INT(d->elem_dtype, WANT[i].elem);
        CHECK_EQ_INT(d->data_dtype, WANT[i].data);
        CHECK_EQ_INT(d->scale_dtype, WANT[i].scale);
        CHECK_EQ_INT(d->has_scale2, WANT[i].scale2);
        CHECK(d->maxbound == WANT[i].maxbound);
        CHECK(d->scale_norm == WANT[i].norm);
        CHECK_EQ_INT(d->per_row, WANT[i].per_row);
        CHECK_EQ_INT(d->input_ok, WANT[i].input_ok);
        CHECK_EQ_INT(d->groupable, WANT[i].groupable);
        CHECK_EQ_INT(d->fuse_weights, WANT[i].fuse);
        CHECK_STR(d->state_dynamic, WANT[i].st_dyn);
        CHECK_STR(d->state_static, WANT[i].st_static);
        CHECK_EQ_INT(d->calib_methods, WANT[i].calib);
        CHECK_STR(d->quant_algo, WANT[i].qa);
        CHECK_STR(d->quant_algo_act, WANT[i].qa_act);
        CHECK_STR(d->ct_format, WANT[i].ct_format);
        CHECK_EQ_INT(d->ct_num_bits, WANT[i].ct_bits);
        CHECK_EQ_INT(d->ct_group_size, WANT[i].ct_group);
        CHECK_STR(d->ct_strategy, WANT[i].ct_strategy);
        CHECK_STR(d->ct_scale_dtype, WANT[i].ct_scale_dtype);
        CHECK_STR(d->ct_input_dynamic, WANT[i].ct_in_dyn);
        CHECK_STR(d->ct_input_observer, WANT[i].ct_in_obs);
        CHECK_EQ_INT(d->ct_inverse_scales, WANT[i].ct_inv);
        CHECK_STR(d->mo_weight, WANT[i].mo[0]);
        CHECK_STR(d->mo_scale, WANT[i].mo[1]);
        CHECK_STR(d->mo_scale2, WANT[i].mo[2]);
        CHECK_STR(d->mo_input, WANT[i].mo[3]);
        CHECK_STR(d->ct_weight, WANT[i].ct[0]);
        CHECK_STR(d->ct_scale, WANT[i].ct[1]);
        CHECK_STR(d->ct_scale2, WANT[i].ct[2]);
        CHECK_STR(d->ct_input, WANT[i].ct[3]);
        /* the traits row (row functions' table) says the same numbers */
        const nb_qformat_traits *t = nb_qformat_info(WANT[i].id);
        CHECK_STR(t->name, d->name);
        CHECK_EQ_INT(t->disk_format, d->disk_format);
        CHECK_EQ_INT(t->block_size, d->block_size);
        CHECK_EQ_INT(t->elem_dtype, d->elem_dtype);
        CHECK(t->elem_max == d->maxbound);
        CHECK(t->scale_norm == d->scale_norm);
        CHECK_EQ_INT(nb_qformat_from_name(d->name), d->id);
    }
}

/* What a quantize of a [2, 64] tensor stores, and the state a quantizer of each kind needs, as the rows say. */
static void test_rows_match_behaviour(void) {
    int64_t sh[2] = {2, 64};
    nb_tensor *x = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, sh, &x));
    if (!x) return;
    float *v = nb_tensor_data(x);
    for (int i = 0; i < 128; i++) v[i] = (float)((i * 37) % 23 - 11) * 0.25f;
    for (int i = 0; i < N_WANT; i++) {
        const nb_format_desc *d = nb_format_desc_of(WANT[i].id);
        nb_qparams p;
        nb_qparams_init(&p, d->id);
        nb_qtensor *q = NULL;
        CHECK_OK(ctx, nb_quantize(ctx, x, &p, &q));
        if (!q) continue;
        CHECK_EQ_INT(q->data->dtype, d->data_dtype);
        CHECK_EQ_INT(q->scale->dtype, d->scale_dtype);
        CHECK_EQ_INT(q->scale2 != NULL, d->has_scale2);
        int64_t scales = d->block_size ? 64 / d->block_size : (d->per_row ? 1 : 0);
        CHECK_EQ_INT(nb_tensor_numel(q->scale), scales ? 2 * scales : 1);
        nb_qtensor_release(q);
        /* a dynamic quantizer needs exactly state_dynamic; a static one state_static */
        for (int st = 0; st < 2; st++) {
            if (st == 1 && !d->state_static) continue;
            nb_quantizer_config cfg;
            nb_quantizer_config_init(&cfg, d->id);
            cfg.is_static = st;
            nb_quantizer *qz = NULL;
            CHECK_OK(ctx, nb_quantizer_new(ctx, "q", &cfg, &qz));
            if (!qz) continue;
            const char *want = st ? d->state_static : d->state_dynamic;
            const char *missing = nb_quantizer_missing(qz);
            char first[32] = "";
            sscanf(want, "%31s", first);
            const char *expect = st ? "block_amax" : first;
            CHECK_STR(missing ? missing : "", expect);
            CHECK_OK(ctx, nb_quantizer_calibrate(ctx, qz, x, NB_CALIB_MAX));
            for (int k = 0; nb_quantizer_state_name(k); k++) {
                const char *a = nb_quantizer_state_name(k);
                int listed = has_word(want, a);
                CHECK_MSG(nb_quantizer_has_state(qz, a) == listed, "%s %s: state %s", d->name, st ? "static" : "dynamic", a);
            }
            /* each method the row lists calibrates; four_over_six only on a static 4/6 quantizer */
            for (int m = 1; m < NB_CALIB_COUNT; m++) {
                if (!(d->calib_methods & (1u << m))) continue;
                if (m == NB_CALIB_FOUR_OVER_SIX && !st) continue;
                CHECK_OK(ctx, nb_quantizer_calibrate(ctx, qz, x, (nb_calib_method)m));
            }
            nb_quantizer_release(qz);
        }
    }
    nb_tensor_release(x);
}

/* The presets (FORMATS §3.2 quant_algo, §2.3 four_over_six) in --help order. */
static void test_presets(void) {
    static const struct {
        const char *name;
        nb_qformat w;
        int st;
        nb_qformat in;
        const char *kind;
        nb_calib_method algo;
        const char *v46, *qa;
    } P[] = {
        {"nvfp4_w4a16", NB_FMT_NVFP4, 0, NB_FMT_NONE, "dynamic", NB_CALIB_MAX, "nvfp4_4o6", "W4A16_NVFP4"},
        {"nvfp4", NB_FMT_NVFP4, 0, NB_FMT_NVFP4, "dynamic", NB_CALIB_MAX, "nvfp4_4o6_a4", "NVFP4"},
        {"nvfp4_static", NB_FMT_NVFP4, 1, NB_FMT_NONE, "static", NB_CALIB_MAX, "nvfp4_4o6", "W4A16_NVFP4"},
        {"nvfp4_4o6", NB_FMT_NVFP4_46, 1, NB_FMT_NONE, "static", NB_CALIB_FOUR_OVER_SIX, "nvfp4_4o6", "W4A16_NVFP4"},
        {"nvfp4_4o6_a4", NB_FMT_NVFP4_46, 1, NB_FMT_NVFP4, "static", NB_CALIB_FOUR_OVER_SIX, "nvfp4_4o6_a4", "NVFP4"},
        {"mxfp8", NB_FMT_MXFP8, 0, NB_FMT_NONE, "dynamic", NB_CALIB_MAX, NULL, "MXFP8"},
        {"fp8", NB_FMT_FP8_TENSOR, 0, NB_FMT_FP8_TENSOR, "per_tensor", NB_CALIB_MAX, NULL, "FP8"},
        {"fp8_per_channel", NB_FMT_FP8_CHANNEL, 0, NB_FMT_NONE, "per_channel", NB_CALIB_MAX, NULL,
         "FP8_PER_CHANNEL_PER_TOKEN"},
    };
    int n = (int)(sizeof P / sizeof P[0]);
    CHECK_EQ_INT(nb_preset_count(), n + 1);   /* + the KV cache's fp8 */
    CHECK(nb_preset_at(-1) == NULL);
    CHECK(nb_preset_at(n + 1) == NULL);
    for (int i = 0; i < n; i++) {
        const nb_preset_desc *p = nb_preset_at(i);
        printf("preset %s\n", P[i].name);
        CHECK_STR(p->name, P[i].name);
        CHECK_EQ_INT(p->kind, NB_PRESET_LINEAR);
        CHECK(p->summary && p->summary[0]);
        CHECK_EQ_INT(p->weight_format, P[i].w);
        CHECK_EQ_INT(p->weight_static, P[i].st);
        CHECK_EQ_INT(p->input_format, P[i].in);
        CHECK_STR(p->weight_kind, P[i].kind);
        CHECK_EQ_INT(p->algorithm, P[i].algo);
        CHECK_STR(p->four_over_six, P[i].v46);
        CHECK_STR(nb_preset_quant_algo(p), P[i].qa);
        CHECK(nb_preset_find(P[i].name, NB_PRESET_LINEAR) == p);
        /* max keeps every preset; four_over_six turns NVFP4 into its 4/6 variant, and nothing else */
        CHECK(nb_preset_with_algorithm(p, NB_CALIB_MAX) == p);
        const nb_preset_desc *v = nb_preset_with_algorithm(p, NB_CALIB_FOUR_OVER_SIX);
        CHECK_STR(v ? v->name : NULL, P[i].v46);
        /* its own default algorithm applies to it */
        CHECK(nb_preset_with_algorithm(p, p->algorithm) == p);
    }
    CHECK(nb_preset_with_algorithm(nb_preset_find("mxfp8", NB_PRESET_LINEAR), NB_CALIB_MSE) == NULL);
    CHECK(nb_preset_with_algorithm(nb_preset_find("fp8", NB_PRESET_LINEAR), NB_CALIB_MSE) != NULL);
    CHECK(nb_preset_with_algorithm(nb_preset_find("fp8", NB_PRESET_LINEAR), (nb_calib_method)7) == NULL);
    const nb_preset_desc *kv = nb_preset_find("fp8", NB_PRESET_KV);
    CHECK(kv == nb_preset_at(n));
    CHECK(kv && kv->weight_format == NB_FMT_FP8_TENSOR && kv->input_format == NB_FMT_NONE);
    CHECK_STR(nb_preset_quant_algo(kv), "FP8");   /* kv_cache_quant_algo */
    CHECK(nb_preset_find("nvfp4", NB_PRESET_KV) == NULL);
    CHECK(nb_preset_find("nvfp5", NB_PRESET_LINEAR) == NULL);
    CHECK(nb_preset_find(NULL, NB_PRESET_LINEAR) == NULL);
    CHECK(nb_preset_quant_algo(NULL) == NULL);
}

static void test_aliases_and_algorithms(void) {
    static const struct {
        const char *alias;
        nb_qformat f;
    } A[] = {{"nvfp4_4o6", NB_FMT_NVFP4_46}, {"four_over_six", NB_FMT_NVFP4_46}, {"fp8_tensor", NB_FMT_FP8_TENSOR},
             {"fp8_per_channel", NB_FMT_FP8_CHANNEL}};
    int n = (int)(sizeof A / sizeof A[0]);
    for (int i = 0; i < n; i++) {
        nb_qformat f = NB_FMT_NONE;
        CHECK_STR(nb_qformat_alias(i, &f), A[i].alias);
        CHECK_EQ_INT(f, A[i].f);
        CHECK_EQ_INT(nb_qformat_from_name(A[i].alias), A[i].f);
    }
    CHECK(nb_qformat_alias(n, NULL) == NULL);
    CHECK(nb_qformat_alias(-1, NULL) == NULL);
    CHECK_EQ_INT(nb_qformat_from_name("none"), NB_FMT_NONE);
    CHECK_EQ_INT(nb_qformat_from_name("nvfp5"), -1);
    CHECK_EQ_INT(nb_qformat_from_name(NULL), -1);
    CHECK_STR(nb_calib_method_name(NB_CALIB_MAX), "max");
    CHECK_STR(nb_calib_method_name(NB_CALIB_MSE), "mse");
    CHECK_STR(nb_calib_method_name(NB_CALIB_FOUR_OVER_SIX), "four_over_six");
    CHECK(nb_calib_method_name((nb_calib_method)NB_CALIB_COUNT) == NULL);
    CHECK_EQ_INT(nb_calib_method_from_name("four_over_six"), NB_CALIB_FOUR_OVER_SIX);
    CHECK_EQ_INT(nb_calib_method_from_name("mse"), NB_CALIB_MSE);
    CHECK_EQ_INT(nb_calib_method_from_name("best"), -1);
    CHECK_EQ_INT(nb_calib_method_from_name(NULL), -1);
}

/* ---- read-back: which row a stored module matches, and the messages, from the rows ----------------- */

/* One module "m" written with these tensors, then probed (nb_readback_probe). The lines below are what
 * the read-back gave before it read the rows (the same program against the previous libnibble). */
typedef struct { const char *name; nb_dtype dt; int nd; int64_t sh[2]; float v; } pc_t;
typedef struct { const char *label; int n; pc_t t[4]; } pcase_t;
static const pcase_t PCASES[] = {
    {"nvfp4 no scale2", 2, {{"m.weight", NB_U8, 2, {4, 8}, 0}, {"m.weight_scale", NB_E4M3, 2, {4, 1}, 1}}},
    {"nvfp4 bad scale", 3, {{"m.weight", NB_U8, 2, {4, 8}, 0}, {"m.weight_scale", NB_E4M3, 2, {4, 2}, 1},
                            {"m.weight_scale_2", NB_F32, 0, {0, 0}, 0.5f}}},
    {"nvfp4 ct", 4, {{"m.weight_packed", NB_U8, 2, {4, 8}, 0}, {"m.weight_scale", NB_E4M3, 2, {4, 1}, 1},
                     {"m.weight_global_scale", NB_F32, 1, {1, 0}, 4.0f}, {"m.input_global_scale", NB_F32, 1, {1, 0}, 8.0f}}},
    {"nvfp4 mo w4a4", 4, {{"m.weight", NB_U8, 2, {4, 8}, 0}, {"m.weight_scale", NB_E4M3, 2, {4, 1}, 1},
                     {"m.weight_scale_2", NB_F32, 0, {0, 0}, 0.25f}, {"m.input_scale", NB_F32, 0, {0, 0}, 0.125f}}},
    {"mxfp8 bad", 2, {{"m.weight", NB_E4M3, 2, {4, 64}, 0}, {"m.weight_scale", NB_U8, 2, {4, 3}, 1}}},
    {"mxfp8 e8m0", 2, {{"m.weight", NB_E4M3, 2, {4, 64}, 0}, {"m.weight_scale", NB_E8M0, 2, {4, 2}, 1}}},
    {"mxfp8 1d", 2, {{"m.weight", NB_E4M3, 2, {4, 64}, 0}, {"m.weight_scale", NB_U8, 1, {8, 0}, 1}}},
    {"fp8 3 scales", 2, {{"m.weight", NB_E4M3, 2, {4, 8}, 0}, {"m.weight_scale", NB_F32, 1, {3, 0}, 1}}},
    {"fp8 ct bf16", 3, {{"m.weight", NB_E4M3, 2, {4, 8}, 0}, {"m.weight_scale", NB_BF16, 1, {1, 0}, 1},
                        {"m.input_scale", NB_BF16, 1, {1, 0}, 2.0f}}},
    {"fp8 channel", 2, {{"m.weight", NB_E4M3, 2, {4, 8}, 0}, {"m.weight_scale", NB_F32, 1, {4, 0}, 1}}},
    {"fp8 mo", 3, {{"m.weight", NB_E4M3, 2, {4, 8}, 0}, {"m.weight_scale", NB_F32, 0, {0, 0}, 1},
                   {"m.input_scale", NB_F32, 0, {0, 0}, 3.0f}}},
    {"e4m3 scales", 2, {{"m.weight", NB_E4M3, 2, {4, 8}, 0}, {"m.weight_scale", NB_E4M3, 2, {4, 1}, 1}}},
    {"u8 float scale", 2, {{"m.weight", NB_U8, 2, {4, 8}, 0}, {"m.weight_scale", NB_F32, 0, {0, 0}, 1}}},
    {"fp8 weight + input_global_scale", 3, {{"m.weight", NB_E4M3, 2, {4, 8}, 0}, {"m.weight_scale", NB_F32, 0, {0, 0}, 1},
                   {"m.input_global_scale", NB_F32, 0, {0, 0}, 4.0f}}},
};

/* writes case c to path and probes it into a line "label: format layout input_format input_scale | error" */
static void probe_case(nb_ctx *c, const pcase_t *pc, const char *path, char *line, size_t cap) {
    nb_st_writer *w = NULL;
    nb_st_writer_new(c, &w);
    for (int i = 0; i < pc->n; i++) {
        nb_tensor *t = NULL;
        int64_t sh[2] = {pc->t[i].sh[0], pc->t[i].sh[1]};
        nb_tensor_new(c, pc->t[i].dt, pc->t[i].nd, sh, &t);
        if (pc->t[i].v != 0 && nb_tensor_numel(t) >= 1) {
            float f = pc->t[i].v;
            nb_convert(nb_tensor_data(t), pc->t[i].dt, &f, NB_F32, 1);
        }
        nb_st_writer_add(c, w, pc->t[i].name, t);
        nb_tensor_release(t);
    }
    nb_st_writer_write(c, w, path);
    nb_st_writer_free(w);
    nb_st *st = NULL;
    nb_st_open(c, path, &st);
    nb_readback_info info;
    nb_status s = nb_readback_probe(c, st, "m", &info);
    if (s) snprintf(line, cap, "%s: error %d %s", pc->label, (int)s, nb_ctx_last_error(c));
    else snprintf(line, cap, "%s: format %d layout %d input %d scale %g", pc->label, (int)info.format, (int)info.layout,
                  (int)info.input_format, (double)info.input_scale);
    nb_ctx_clear_error(c);
    nb_st_close(st);
}

static const char *const PROBE_WANT[] = {
    "nvfp4 no scale2: error -4 m: NVFP4 weight without weight_scale_2 (ModelOpt) or weight_global_scale (compressed-tensors)",
    "nvfp4 bad scale: error -4 m: NVFP4 weight_scale must be [4, 1]",
    "nvfp4 ct: format 1 layout 1 input 1 scale 0.125",
    "nvfp4 mo w4a4: format 1 layout 0 input 1 scale 0.125",
    "mxfp8 bad: error -4 m: MXFP8 weight_scale must be [4, 2]",
    "mxfp8 e8m0: format 3 layout 0 input 0 scale 0",
    "mxfp8 1d: error -5 m: weight F8_E4M3 with weight_scale U8 is not a layout nibble reads",
    "fp8 3 scales: error -4 m: FP8 weight_scale has 3 values (1 or one per row expected)",
    "fp8 ct bf16: format 4 layout 1 input 4 scale 2",
    "fp8 channel: format 5 layout 0 input 0 scale 0",
    "fp8 mo: format 4 layout 0 input 4 scale 3",
    "e4m3 scales: error -5 m: weight F8_E4M3 with weight_scale F8_E4M3 is not a layout nibble reads",
    "u8 float scale: error -5 m: weight U8 with weight_scale F32 is not a layout nibble reads",
    "fp8 weight + input_global_scale: format 4 layout 0 input 1 scale 0.25",
};

static void test_readback_rows(void) {
    char dir[] = "/tmp/nb_test_formats_XXXXXX", path[256], line[1024];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    int n = (int)(sizeof PCASES / sizeof PCASES[0]);
    CHECK_EQ_INT(n, (int)(sizeof PROBE_WANT / sizeof PROBE_WANT[0]));
    for (int i = 0; i < n; i++) {
        probe_case(ctx, &PCASES[i], path, line, sizeof line);
        const char *got = line;
        CHECK_STR(got, PROBE_WANT[i]);
    }
    remove(path);
    rmdir(dir);
}

int main(void) {
    CHECK_OK(ctx, nb_ctx_new(0, &ctx));
    test_format_rows();
    test_rows_match_behaviour();
    test_presets();
    test_aliases_and_algorithms();
    test_readback_rows();
    nb_ctx_release(ctx);
    return nbt_done("test_formats");
}
