/* nb_quantize, nb_fake_quant and dequantize on CUDA device tensors: the entry points in qtensor.c
 * dispatch here on the tensor's device. The plan is resolved exactly as on the CPU (NaN/Inf check,
 * the data's amax, the calibrated state, the same messages) from a host copy of the input, then the
 * CUDA kernels (kernels/, held bit for bit to the scalar references) run on the context's stream.
 * The host copy is the price of one resolver until a device amax reduction lands (the GPU runtime). */
#include <string.h>

#include "quant/quant_internal.h"
#include "cpu/fast_internal.h"   /* nbq_check_finite_params */
#include "nibble/cuda.h"
#include "nibble/quant_cuda.h"
#include "backend.h"

nb_status nbq_device_check(nb_ctx *ctx, const nb_tensor *t, const char *what, const char *role) {
    if (!nb_cuda_built())
        return nb_fail(ctx, NB_ERR_DEVICE, "%s: the %s is on CUDA device %d, but this libnibble was built without CUDA "
                       "(configure with -DNIBBLE_CUDA=ON where nvcc is found)", what, role, t->device);
    if (t->device >= nb_cuda_device_count())
        return nb_fail(ctx, NB_ERR_DEVICE, "%s: the %s is on CUDA device %d, and %d device%s available", what, role,
                       t->device, nb_cuda_device_count(), nb_cuda_device_count() == 1 ? " is" : "s are");
    if (!nb_tensor_is_contiguous(t))
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: the %s on CUDA device %d must be contiguous", what, role, t->device);
    return nbk_set_device(ctx, t->device);
}

/* Copies the plan's host arrays (static NVFP4 block amax, FP8 per-row scales) into the context's
 * workspace on `device` and points ca at them. */
static nb_status stage_plan(nb_ctx *ctx, int device, const nbq_plan *plan, nb_cuda_qargs *ca) {
    nb_cuda_qargs_init(ca);
    ca->scale = plan->base.scale;
    ca->global_amax = plan->base.global_amax;
    ca->mx_floor = plan->base.mx_floor;
    ca->div_dtype = plan->base.div_dtype;
    size_t nb = plan->block_amax ? (size_t)(plan->rows * (plan->n / NB_NVFP4_BLOCK)) * sizeof(float) : 0;
    size_t nr = plan->row_scale ? (size_t)plan->rows * sizeof(float) : 0;
    if (!nb && !nr) return NB_OK;
    void *w = NULL;
    void *stream = nb_backend_of(ctx)->cuda_stream;
    nb_status s = nbk_workspace(ctx, device, nb + nr, &w);
    if (!s && nb) s = nbk_memcpy(ctx, w, plan->block_amax, nb, 0, stream);
    if (!s && nr) s = nbk_memcpy(ctx, (char *)w + nb, plan->row_scale, nr, 0, stream);
    if (s) return s;
    if (nb) ca->block_amax = w;
    if (nr) ca->row_scale = (const float *)((const char *)w + nb);
    return NB_OK;
}

nb_status nbq_device_plan(nb_ctx *ctx, const nb_tensor *x, const nb_qparams *p, const char *what, nbq_plan *plan,
                          nb_cuda_qargs *ca) {
    memset(plan, 0, sizeof *plan);
    nb_tensor *xh = NULL;
    nb_status s = nb_tensor_to_device(ctx, x, NB_DEVICE_HOST, &xh);
    if (s) return s;
    nb_qparams pa;
    s = nbq_check_finite_params(ctx, xh, what, p, &pa);
    if (!s) s = nbq_plan_init(ctx, plan, xh, &pa);
    nb_tensor_release(xh);
    if (!s && (s = stage_plan(ctx, x->device, plan, ca))) nbq_plan_free(plan);
    return s;
}

/* One f32 from the host into a device tensor (weight_scale_2, FP8 per-tensor weight_scale). */
static nb_status put_f32(nb_ctx *ctx, nb_tensor *t, float v) {
    return nbk_memcpy(ctx, nb_tensor_data(t), &v, sizeof v, 0, nb_backend_of(ctx)->cuda_stream);
}

/* Quantize x into q, or (q NULL) fake-quantize it into out, on x's device. */
static nb_status device_run(nb_ctx *ctx, const nb_tensor *x, const nb_qparams *p, const char *what, nb_qtensor *q,
                            nb_tensor *out) {
    nbq_plan plan;
    nb_cuda_qargs ca;
    nbk_lock(ctx);
    nb_status s = nbq_device_plan(ctx, x, p, what, &plan, &ca);
    if (s) {
        nbk_unlock(ctx);
        return s;
    }
    void *stream = nb_backend_of(ctx)->cuda_stream;
    if (!q) {
        s = nb_cuda_fake_quant(ctx, p->format, nb_tensor_data(x), x->dtype, plan.rows, plan.n, &ca, nb_tensor_data(out),
                               out->dtype, stream);
    } else {
        if (q->scale2) s = put_f32(ctx, q->scale2, plan.base.scale);
        if (!s && p->format == NB_FMT_FP8_TENSOR) s = put_f32(ctx, q->scale, plan.base.scale);
        if (!s && p->format == NB_FMT_FP8_CHANNEL)
            s = nbk_memcpy(ctx, nb_tensor_data(q->scale), plan.row_scale, (size_t)plan.rows * sizeof(float), 0, stream);
        if (!s)
            s = nb_cuda_quantize(ctx, p->format, nb_tensor_data(x), x->dtype, plan.rows, plan.n, &ca,
                                 nb_tensor_data(q->data), plan.tr->block_size ? nb_tensor_data(q->scale) : NULL, stream);
    }
    if (!s) s = nbk_stream_sync(ctx, stream);
    nbk_unlock(ctx);
    nbq_plan_free(&plan);
    return s;
}

nb_status nbq_device_quantize(nb_ctx *ctx, const nb_tensor *x, const nb_qparams *p, const char *what, nb_qtensor *q) {
    return device_run(ctx, x, p, what, q, NULL);
}

nb_status nbq_device_fake(nb_ctx *ctx, const nb_tensor *x, const nb_qparams *p, const char *what, nb_tensor *out) {
    return device_run(ctx, x, p, what, NULL, out);
}

nb_status nbq_device_dequantize(nb_ctx *ctx, const nb_qtensor *q, nb_tensor *out) {
    void *stream = nb_backend_of(ctx)->cuda_stream;
    nb_cuda_qargs ca;
    nb_cuda_qargs_init(&ca);
    nb_status s = NB_OK;
    if (q->scale2) s = nbk_memcpy(ctx, &ca.scale, nb_tensor_data(q->scale2), sizeof ca.scale, 1, stream);
    else if (q->format == NB_FMT_FP8_TENSOR) s = nbk_memcpy(ctx, &ca.scale, nb_tensor_data(q->scale), sizeof ca.scale, 1, stream);
    else if (q->format == NB_FMT_FP8_CHANNEL) ca.row_scale = nb_tensor_data(q->scale);
    if (s) return s;
    int64_t n = q->shape[q->ndim - 1], rows = n ? nb_qtensor_numel(q) / n : 0;
    s = nb_cuda_dequantize(ctx, q->format, nb_tensor_data(q->data),
                           nb_qformat_info(q->format)->block_size ? nb_tensor_data(q->scale) : NULL, rows, n, &ca,
                           nb_tensor_data(out), out->dtype, stream);
    if (!s) s = nbk_stream_sync(ctx, stream);
    return s;
}
