/* Scalar float64 references of every model op (nibble/ops.h, nb_ref_*): the plainest loops that
 * state the math, single-threaded, no tricks. The fast kernels in ops.c are tested against these,
 * and these are tested against finite differences. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nibble/ops.h"

void nb_ref_embedding_fwd(const double *table, const int32_t *tokens, int64_t n, int64_t d, double *out) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t c = 0; c < d; c++) out[i * d + c] = table[(int64_t)tokens[i] * d + c];
}

void nb_ref_embedding_bwd(const int32_t *tokens, const double *dy, int64_t n, int64_t d, double *dtable) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t c = 0; c < d; c++) dtable[(int64_t)tokens[i] * d + c] += dy[i * d + c];
}

void nb_ref_rmsnorm_fwd(const double *x, const double *w, double *y, int64_t n, int64_t d, double eps) {
    for (int64_t i = 0; i < n; i++) {
        double ss = 0.0;
        for (int64_t c = 0; c < d; c++) ss += x[i * d + c] * x[i * d + c];
        double r = 1.0 / sqrt(ss / (double)d + eps);
        for (int64_t c = 0; c < d; c++) y[i * d + c] = x[i * d + c] * r * w[c];
    }
}

/* y_c = w_c x_c r(x): dy_c/dx_k = w_c (delta_ck r - x_c r^3 x_k / d) */
void nb_ref_rmsnorm_bwd(const double *x, const double *w, const double *dy, double *dx, double *dw, int64_t n,
                        int64_t d, double eps) {
    for (int64_t i = 0; i < n; i++) {
        const double *xi = x + i * d, *gi = dy + i * d;
        double ss = 0.0;
        for (int64_t c = 0; c < d; c++) ss += xi[c] * xi[c];
        double r = 1.0 / sqrt(ss / (double)d + eps);
        double dot = 0.0;
        for (int64_t c = 0; c < d; c++) dot += gi[c] * w[c] * xi[c];
        for (int64_t k = 0; k < d; k++) {
            if (dx) dx[i * d + k] += gi[k] * w[k] * r - xi[k] * r * r * r * dot / (double)d;
            if (dw) dw[k] += gi[k] * xi[k] * r;
        }
    }
}

static void ref_rope(double *x, int64_t n, int64_t T, int64_t pos0, int64_t nh, int64_t hd, const double *inv_freq,
                     double sign) {
    int64_t half = hd / 2;
    for (int64_t i = 0; i < n; i++) {
        double pos = (double)(pos0 + i % T);
        for (int64_t h = 0; h < nh; h++) {
            double *v = x + (i * nh + h) * hd;
            for (int64_t k = 0; k < half; k++) {
                double a = pos * inv_freq[k], c = cos(a), s = sign * sin(a);
                double x1 = v[k], x2 = v[k + half];
                v[k] = x1 * c - x2 * s;
                v[k + half] = x2 * c + x1 * s;
            }
        }
    }
}

void nb_ref_rope_fwd(double *x, int64_t n, int64_t T, int64_t pos0, int64_t nh, int64_t hd, const double *inv_freq) {
    ref_rope(x, n, T, pos0, nh, hd, inv_freq, 1.0);
}

void nb_ref_rope_bwd(double *dx, int64_t n, int64_t T, int64_t pos0, int64_t nh, int64_t hd, const double *inv_freq) {
    ref_rope(dx, n, T, pos0, nh, hd, inv_freq, -1.0);
}

static int ref_visible(const nb_attn_dims *a, int64_t t, int64_t j) {
    int64_t p = a->q_pos0 + t;
    if (j > p || j >= a->Tk) return 0;
    if (a->window > 0 && j <= p - a->window) return 0;
    return 1;
}

/* Softmax probabilities of one query row into p [Tk] (zero where masked). */
static void ref_probs(const nb_attn_dims *a, const double *q, const double *k, int64_t b, int64_t t, int64_t h,
                      double *p) {
    int64_t hd = a->hd, grp = a->H / a->KVH;
    const double *qi = q + ((b * a->Tq + t) * a->H + h) * hd;
    double mx = -INFINITY;
    for (int64_t j = 0; j < a->Tk; j++) {
        if (!ref_visible(a, t, j)) { p[j] = -INFINITY; continue; }
        const double *kj = k + ((b * a->kv_rows + j) * a->KVH + h / grp) * hd;
        double s = 0.0;
        for (int64_t c = 0; c < hd; c++) s += qi[c] * kj[c];
        p[j] = s * (double)a->scale;
        if (p[j] > mx) mx = p[j];
    }
    double sum = 0.0;
    for (int64_t j = 0; j < a->Tk; j++) {
        p[j] = isinf(p[j]) ? 0.0 : exp(p[j] - mx);
        sum += p[j];
    }
    for (int64_t j = 0; j < a->Tk; j++) p[j] = sum > 0 ? p[j] / sum : 0.0;
}

void nb_ref_attention_fwd(const nb_attn_dims *a, const double *q, const double *k, const double *v, double *out) {
    int64_t hd = a->hd, grp = a->H / a->KVH;
    double *p = malloc(sizeof(double) * (size_t)(a->Tk > 0 ? a->Tk : 1));
    if (!p) return;
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t t = 0; t < a->Tq; t++)
            for (int64_t h = 0; h < a->H; h++) {
                ref_probs(a, q, k, b, t, h, p);
                double *o = out + ((b * a->Tq + t) * a->H + h) * hd;
                for (int64_t c = 0; c < hd; c++) o[c] = 0.0;
                for (int64_t j = 0; j < a->Tk; j++) {
                    const double *vj = v + ((b * a->kv_rows + j) * a->KVH + h / grp) * hd;
                    for (int64_t c = 0; c < hd; c++) o[c] += p[j] * vj[c];
                }
            }
    free(p);
}

/* o = sum_j p_j v_j, p = softmax(s), s_j = scale q.k_j:
 * dv_j += p_j do; dp_j = do.v_j; ds_j = p_j (dp_j - sum_k p_k dp_k); dq += scale ds_j k_j; dk_j += scale ds_j q */
void nb_ref_attention_bwd(const nb_attn_dims *a, const double *q, const double *k, const double *v, const double *dout,
                          double *dq, double *dk, double *dv) {
    int64_t hd = a->hd, grp = a->H / a->KVH;
    double *p = malloc(sizeof(double) * (size_t)(a->Tk > 0 ? a->Tk : 1));
    double *dp = malloc(sizeof(double) * (size_t)(a->Tk > 0 ? a->Tk : 1));
    if (!p || !dp) { free(p); free(dp); return; }
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t t = 0; t < a->Tq; t++)
            for (int64_t h = 0; h < a->H; h++) {
                ref_probs(a, q, k, b, t, h, p);
                int64_t qi = ((b * a->Tq + t) * a->H + h) * hd;
                const double *g = dout + qi;
                double pd = 0.0;
                for (int64_t j = 0; j < a->Tk; j++) {
                    const double *vj = v + ((b * a->kv_rows + j) * a->KVH + h / grp) * hd;
                    double s = 0.0;
                    for (int64_t c = 0; c < hd; c++) s += g[c] * vj[c];
                    dp[j] = s;
                    pd += p[j] * s;
                }
                for (int64_t j = 0; j < a->Tk; j++) {
                    if (p[j] == 0.0) continue;
                    int64_t kj = ((b * a->kv_rows + j) * a->KVH + h / grp) * hd;
                    double ds = p[j] * (dp[j] - pd) * (double)a->scale;
                    for (int64_t c = 0; c < hd; c++) {
                        dq[qi + c] += ds * k[kj + c];
                        dk[kj + c] += ds * q[qi + c];
                        dv[kj + c] += p[j] * g[c];
                    }
                }
            }
    free(p);
    free(dp);
}

void nb_ref_swiglu_fwd(const double *g, const double *u, double *a, int64_t n) {
    for (int64_t i = 0; i < n; i++) a[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
}

void nb_ref_swiglu_bwd(const double *g, const double *u, const double *da, double *dg, double *du, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double s = 1.0 / (1.0 + exp(-g[i]));
        du[i] += da[i] * g[i] * s;
        dg[i] += da[i] * u[i] * (s + g[i] * s * (1.0 - s));
    }
}

void nb_ref_linear_fwd(const double *x, const double *w, const double *b, double *y, int64_t n, int64_t in,
                       int64_t out) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t o = 0; o < out; o++) {
            double s = b ? b[o] : 0.0;
            for (int64_t k = 0; k < in; k++) s += x[i * in + k] * w[o * in + k];
            y[i * out + o] = s;
        }
}

void nb_ref_linear_bwd(const double *x, const double *w, const double *dy, double *dx, double *dw, double *db,
                       int64_t n, int64_t in, int64_t out) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t o = 0; o < out; o++) {
            double g = dy[i * out + o];
            if (db) db[o] += g;
            for (int64_t k = 0; k < in; k++) {
                if (dx) dx[i * in + k] += g * w[o * in + k];
                if (dw) dw[o * in + k] += g * x[i * in + k];
            }
        }
}

double nb_ref_cross_entropy(const double *logits, const int32_t *targets, int64_t n, int64_t V, int32_t ignore_index,
                            double grad_scale, double *dlogits) {
    double total = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (targets[i] == ignore_index) continue;
        const double *l = logits + i * V;
        double mx = -INFINITY;
        for (int64_t c = 0; c < V; c++) mx = l[c] > mx ? l[c] : mx;
        double sum = 0.0;
        for (int64_t c = 0; c < V; c++) sum += exp(l[c] - mx);
        total += mx + log(sum) - l[targets[i]];
        if (dlogits) {
            for (int64_t c = 0; c < V; c++) dlogits[i * V + c] += grad_scale * exp(l[c] - mx) / sum;
            dlogits[i * V + targets[i]] -= grad_scale;
        }
    }
    return total;
}
