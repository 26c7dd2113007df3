/* Mixed parameter buffers (Megatron's param buffers): param_index_map in unpacked elements for
 * every parameter, the packed map where NVFP4 spans halve, and the storage itself, for an all-NVFP4,
 * a no-NVFP4 and a mixed buffer (a 100x100 NVFP4 weight beside a 100-element BF16 norm). */
#include <stdint.h>
#include <string.h>

#include "nbtest.h"

static nb_ctx *ctx;

static void span(const nb_parambuf *pb, const char *name, int64_t *u0, int64_t *u1, int64_t *p0, int64_t *p1) {
    CHECK_OK(ctx, nb_parambuf_index(ctx, pb, name, u0, u1));
    CHECK_OK(ctx, nb_parambuf_packed_index(ctx, pb, name, p0, p1));
}

static void mixed(void) {
    nb_parambuf *pb = NULL;
    CHECK_OK(ctx, nb_parambuf_new(ctx, &pb));
    int64_t w[2] = {100, 100}, n[1] = {100};
    CHECK_OK(ctx, nb_parambuf_add(ctx, pb, "layers.0.mlp.up_proj.weight", NB_FMT_NVFP4, NB_BF16, 2, w));
    CHECK_OK(ctx, nb_parambuf_add(ctx, pb, "layers.0.post_attention_layernorm.weight", NB_FMT_NONE, NB_BF16, 1, n));
    int64_t u0, u1, p0, p1;
    span(pb, "layers.0.mlp.up_proj.weight", &u0, &u1, &p0, &p1);
    CHECK_EQ_INT(u0, 0);
    CHECK_EQ_INT(u1 - u0, 10000);   /* unpacked span: 10,000 elements */
    CHECK_EQ_INT(p0, 0);
    CHECK_EQ_INT(p1 - p0, 5000);    /* packed span: 5,000 bytes */
    span(pb, "layers.0.post_attention_layernorm.weight", &u0, &u1, &p0, &p1);
    CHECK_EQ_INT(u0, 10000);
    CHECK_EQ_INT(u1, 10100);
    CHECK_EQ_INT(p0, 5000);
    CHECK_EQ_INT(p1, 5100);
    CHECK_EQ_INT(u1 - u0, p1 - p0); /* the norm's spans are equal */
    CHECK_EQ_INT(nb_parambuf_numel(pb), 10100);
    CHECK_EQ_INT(nb_parambuf_packed_numel(pb), 5100);
    CHECK(nb_parambuf_has_nvfp4(pb));
    CHECK_EQ_INT(nb_parambuf_count(pb), 2);
    CHECK(strcmp(nb_parambuf_name(pb, 1), "layers.0.post_attention_layernorm.weight") == 0);
    CHECK_EQ_INT(nb_parambuf_find(pb, "nope"), -1);
    nb_tensor *v = NULL;
    CHECK_FAIL(ctx, nb_parambuf_view(ctx, pb, "layers.0.mlp.up_proj.weight", &v), NB_ERR_INVALID, "after finalize");
    CHECK_OK(ctx, nb_parambuf_finalize(ctx, pb));
    CHECK_FAIL(ctx, nb_parambuf_add(ctx, pb, "late", NB_FMT_NONE, NB_F32, 1, n), NB_ERR_INVALID, "'late' added after finalize");
    int64_t b0, b1;
    CHECK_OK(ctx, nb_parambuf_byte_range(ctx, pb, "layers.0.mlp.up_proj.weight", &b0, &b1));
    CHECK_EQ_INT(b0, 0);
    CHECK_EQ_INT(b1, 5000);
    CHECK_OK(ctx, nb_parambuf_byte_range(ctx, pb, "layers.0.post_attention_layernorm.weight", &b0, &b1));
    CHECK_EQ_INT(b0, 5056);          /* 64-byte aligned start */
    CHECK_EQ_INT(b1, 5256);
    CHECK_EQ_INT(nb_parambuf_nbytes(pb), 5256);
    /* views share the storage: an E2M1 view of the weight and a BF16 view of the norm */
    CHECK_OK(ctx, nb_parambuf_view(ctx, pb, "layers.0.mlp.up_proj.weight", &v));
    CHECK_EQ_INT(v->dtype, NB_E2M1);
    CHECK_EQ_INT(nb_tensor_numel(v), 10000);
    CHECK_EQ_INT(nb_tensor_nbytes(v), 5000);
    int64_t idx[2] = {0, 3};
    CHECK_OK(ctx, nb_tensor_set(ctx, v, idx, -1.5));
    CHECK_EQ_INT(((uint8_t *)nb_buffer_data(nb_parambuf_buffer(pb)))[1], 0xB0);   /* element 3 = high nibble of byte 1 */
    nb_tensor *nv = NULL;
    CHECK_OK(ctx, nb_parambuf_view(ctx, pb, "layers.0.post_attention_layernorm.weight", &nv));
    int64_t i1[1] = {2};
    CHECK_OK(ctx, nb_tensor_set(ctx, nv, i1, 1.0));
    uint16_t h;
    memcpy(&h, (uint8_t *)nb_buffer_data(nb_parambuf_buffer(pb)) + 5056 + 4, 2);
    CHECK_EQ_INT(h, 0x3F80);
    nb_tensor_release(v);
    nb_tensor_release(nv);
    CHECK_FAIL(ctx, nb_parambuf_index(ctx, pb, "missing.weight", &u0, &u1), NB_ERR_NOT_FOUND, "no parameter 'missing.weight'");
    nb_parambuf_free(pb);
}

static void all_nvfp4(void) {
    nb_parambuf *pb = NULL;
    CHECK_OK(ctx, nb_parambuf_new(ctx, &pb));
    int64_t a[2] = {32, 64}, b[2] = {16, 32};
    CHECK_OK(ctx, nb_parambuf_add(ctx, pb, "q_proj.weight", NB_FMT_NVFP4, NB_BF16, 2, a));
    CHECK_OK(ctx, nb_parambuf_add(ctx, pb, "k_proj.weight", NB_FMT_NVFP4_46, NB_BF16, 2, b));
    CHECK_FAIL(ctx, nb_parambuf_add(ctx, pb, "q_proj.weight", NB_FMT_NVFP4, NB_BF16, 2, b), NB_ERR_INVALID, "duplicate parameter 'q_proj.weight'");
    int64_t odd[2] = {4, 7};
    CHECK_FAIL(ctx, nb_parambuf_add(ctx, pb, "odd", NB_FMT_NVFP4, NB_BF16, 2, odd), NB_ERR_SHAPE, "last dimension 7 is odd");
    int64_t u0, u1, p0, p1;
    span(pb, "k_proj.weight", &u0, &u1, &p0, &p1);
    CHECK_EQ_INT(u0, 2048);
    CHECK_EQ_INT(u1, 2048 + 512);
    CHECK_EQ_INT(p0, 1024);
    CHECK_EQ_INT(p1, 1024 + 256);
    CHECK_EQ_INT(nb_parambuf_packed_numel(pb) * 2, nb_parambuf_numel(pb));
    CHECK_OK(ctx, nb_parambuf_finalize(ctx, pb));
    /* a quantized tensor's packed bytes land at the parameter's byte range */
    nb_tensor *x = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, b, &x));
    for (int i = 0; i < 512; i++) ((float *)nb_tensor_data(x))[i] = (float)((i * 37) % 23) - 11.0f;
    nb_qparams p;
    nb_qparams_init(&p, NB_FMT_NVFP4_46);
    nb_qtensor *q = NULL, *qm = NULL;
    CHECK_OK(ctx, nb_quantize(ctx, x, &p, &q));
    CHECK_OK(ctx, nb_parambuf_store(ctx, pb, "k_proj.weight", q));
    int64_t b0, b1;
    CHECK_OK(ctx, nb_parambuf_byte_range(ctx, pb, "k_proj.weight", &b0, &b1));
    CHECK_EQ_INT(b1 - b0, 256);
    CHECK(memcmp((uint8_t *)nb_buffer_data(nb_parambuf_buffer(pb)) + b0, nb_tensor_data(q->data), 256) == 0);
    nb_qparams_init(&p, NB_FMT_MXFP8);
    CHECK_OK(ctx, nb_quantize(ctx, x, &p, &qm));
    CHECK_FAIL(ctx, nb_parambuf_store(ctx, pb, "k_proj.weight", qm), NB_ERR_INVALID, "'k_proj.weight' is nvfp4_46, the quantized tensor mxfp8");
    CHECK_FAIL(ctx, nb_parambuf_store(ctx, pb, "q_proj.weight", q), NB_ERR_SHAPE, "shape differs");
    nb_qtensor_release(q);
    nb_qtensor_release(qm);
    nb_tensor_release(x);
    nb_parambuf_free(pb);
}

static void no_nvfp4(void) {
    nb_parambuf *pb = NULL;
    CHECK_OK(ctx, nb_parambuf_new(ctx, &pb));
    int64_t a[2] = {8, 32}, n[1] = {64}, s[1] = {3};
    CHECK_OK(ctx, nb_parambuf_add(ctx, pb, "o_proj.weight", NB_FMT_FP8_TENSOR, NB_BF16, 2, a));
    CHECK_OK(ctx, nb_parambuf_add(ctx, pb, "norm.weight", NB_FMT_NONE, NB_BF16, 1, n));
    CHECK_OK(ctx, nb_parambuf_add(ctx, pb, "gate.weight", NB_FMT_MXFP8, NB_BF16, 2, a));
    CHECK_OK(ctx, nb_parambuf_add(ctx, pb, "scalar", NB_FMT_NONE, NB_F32, 1, s));
    CHECK(!nb_parambuf_has_nvfp4(pb));
    for (int i = 0; i < nb_parambuf_count(pb); i++) {
        int64_t u0, u1, p0, p1;
        span(pb, nb_parambuf_name(pb, i), &u0, &u1, &p0, &p1);
        CHECK(u0 == p0 && u1 == p1);
    }
    CHECK_EQ_INT(nb_parambuf_numel(pb), 256 + 64 + 256 + 3);
    CHECK_EQ_INT(nb_parambuf_packed_numel(pb), nb_parambuf_numel(pb));
    CHECK_OK(ctx, nb_parambuf_finalize(ctx, pb));
    int64_t b0, b1;
    CHECK_OK(ctx, nb_parambuf_byte_range(ctx, pb, "scalar", &b0, &b1));
    CHECK_EQ_INT(b0, 256 + 128 + 256);   /* 256 B fp8, 128 B bf16, 256 B fp8, all 64-aligned */
    CHECK_EQ_INT(b1, b0 + 12);
    nb_tensor *v = NULL;
    CHECK_OK(ctx, nb_parambuf_view(ctx, pb, "gate.weight", &v));
    CHECK_EQ_INT(v->dtype, NB_E4M3);
    nb_tensor_release(v);
    nb_parambuf_free(pb);
}

int main(void) {
    CHECK_OK(ctx, nb_ctx_new(2, &ctx));
    mixed();
    all_nvfp4();
    no_nvfp4();
    nb_ctx_release(ctx);
    return nbt_done("test_quant_parambuf");
}
