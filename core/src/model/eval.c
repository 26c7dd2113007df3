/* Evaluation and generation: perplexity exactly as llama.cpp's llama-perplexity computes it (chunks
 * of n_ctx tokens, BOS in each chunk's first slot, only the second half scored), KL(teacher||model)
 * and top-1 agreement at the same positions, and greedy / sampled generation with a KV cache. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"

/* ---- sampling ------------------------------------------------------------------------------ */

typedef struct { double w; int32_t i; } wi_pair;

/* descending weight, then ascending id */
static int cmp_desc(const void *a, const void *b) {
    const wi_pair *x = a, *y = b;
    if (x->w != y->w) return x->w < y->w ? 1 : -1;
    return x->i < y->i ? -1 : (x->i > y->i);
}

static int32_t argmax(const float *l, int64_t V) {
    int32_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (l[i] > l[best]) best = (int32_t)i;
    return best;
}

/* heap of the k largest weights, smallest at the root */
static void sift_down(wi_pair *h, int64_t k, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, s = i;
        if (l < k && cmp_desc(&h[l], &h[s]) > 0) s = l;
        if (r < k && cmp_desc(&h[r], &h[s]) > 0) s = r;
        if (s == i) return;
        wi_pair t = h[i];
        h[i] = h[s];
        h[s] = t;
        i = s;
    }
}

/* Work is O(V) (plus O(V log k) for top-k): a 150k vocabulary is never sorted whole. Top-p sorts
 * only the tokens whose weight is at least 1e-7 of the mean, which together miss at most 1e-7 of the
 * mass. */
int32_t nb_sample_logits(const float *logits, int64_t V, const nb_sample_opts *o, nb_rng *rng) {
    if (!o || o->greedy || !(o->temperature > 0) || !rng || V <= 1) return argmax(logits, V);
    int32_t best = argmax(logits, V);
    double mx = logits[best], inv_t = 1.0 / o->temperature, sum = 0.0;
    double *w = malloc(sizeof(double) * (size_t)V);
    if (!w) return best;
    for (int64_t i = 0; i < V; i++) sum += (w[i] = exp(((double)logits[i] - mx) * inv_t));
    int top_p = o->top_p > 0 && o->top_p < 1;
    int top_k = o->top_k > 0 && o->top_k < V;
    if (!top_p && !top_k) {   /* the whole distribution, in id order */
        double u = nb_rng_uniform(rng) * sum, acc = 0.0;
        int32_t pick = best;
        for (int64_t i = 0; i < V; i++) {
            acc += w[i];
            if (u < acc) { pick = (int32_t)i; break; }
        }
        free(w);
        return pick;
    }
    int64_t n = 0, cap = top_k ? o->top_k : V;
    wi_pair *c = malloc(sizeof *c * (size_t)cap);
    if (!c) { free(w); return best; }
    if (top_k) {
        for (int64_t i = 0; i < V; i++) {
            wi_pair e = {w[i], (int32_t)i};
            if (n < cap) {
                c[n++] = e;
                if (n == cap)
                    for (int64_t j = cap / 2 - 1; j >= 0; j--) sift_down(c, cap, j);
            } else if (cmp_desc(&e, &c[0]) < 0) {   /* e ranks before the smallest kept */
                c[0] = e;
                sift_down(c, cap, 0);
            }
        }
    } else {
        double floor_w = 1e-7 * sum / (double)V;
        for (int64_t i = 0; i < V; i++)
            if (w[i] >= floor_w) c[n++] = (wi_pair){w[i], (int32_t)i};
    }
    qsort(c, (size_t)n, sizeof *c, cmp_desc);
    double csum = 0.0;
    for (int64_t i = 0; i < n; i++) csum += c[i].w;
    if (top_p) {
        double acc = 0.0;
        int64_t keep = n;
        for (int64_t i = 0; i < n; i++) {
            acc += c[i].w;
            if (acc >= o->top_p * csum) { keep = i + 1; break; }
        }
        n = keep;
        csum = 0.0;
        for (int64_t i = 0; i < n; i++) csum += c[i].w;
    }
    double u = nb_rng_uniform(rng) * csum, acc = 0.0;
    int32_t pick = c[n - 1].i;
    for (int64_t i = 0; i < n; i++) {
        acc += c[i].w;
        if (u < acc) { pick = c[i].i; break; }
    }
    free(c);
    free(w);
    return pick;
}

static int is_eos(const nb_model_config *c, int32_t t) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_token_ids[i] == t) return 1;
    return 0;
}

nb_status nb_model_generate(nb_ctx *ctx, nb_model *m, const int32_t *prompt, int64_t n_prompt, int64_t n_new,
                            const nb_sample_opts *opts, int32_t *out, int64_t *n_out) {
    if (n_out) *n_out = 0;
    if (n_prompt < 1) return nb_fail(ctx, NB_ERR_INVALID, "generate: the prompt needs at least one token (e.g. BOS)");
    if (n_new < 0) return nb_fail(ctx, NB_ERR_INVALID, "generate: n_new is negative");
    if (n_new == 0) return NB_OK;
    int64_t V = m->cfg.vocab_size;
    nb_kv_cache *kc = NULL;
    nb_status s = nb_kv_cache_new(ctx, m, 1, n_prompt + n_new, &kc);
    if (s) return s;
    float *lg = malloc(sizeof(float) * (size_t)V);
    if (!lg) { nb_kv_cache_free(kc); return nb_fail(ctx, NB_ERR_NOMEM, "out of memory"); }
    nb_rng rng;
    nb_rng_seed(&rng, opts ? opts->seed : 0);
    nb_forward_opts fo = {0};
    fo.logits = lg;
    fo.cache = kc;
    fo.logits_start = n_prompt - 1;
    s = nb_model_forward(ctx, m, prompt, 1, n_prompt, &fo);
    int64_t n = 0;
    fo.logits_start = 0;
    while (!s && n < n_new) {
        int32_t t = nb_sample_logits(lg, V, opts, &rng);
        out[n++] = t;
        if (opts && opts->stop_at_eos && is_eos(&m->cfg, t)) break;
        if (n < n_new) s = nb_model_forward(ctx, m, &t, 1, 1, &fo);
    }
    if (n_out) *n_out = n;
    free(lg);
    nb_kv_cache_free(kc);
    return s;
}

/* ---- perplexity / KL ------------------------------------------------------------------------ */

typedef struct {
    nb_ctx *ctx;
    const int32_t *chunk_tokens;   /* [B, n_ctx] as fed (targets come from here) */
    int64_t n_ctx, first, V;
    const float *teacher;          /* NULL or [rows, V] teacher logits of the same rows */
    double *row_nll, *row_kl;      /* per selected row (NaN when not scored) */
    int8_t *row_same;
    const float *logits;           /* current chunk */
    int64_t row0;
} score_job;

static void score_range(void *arg, int64_t r0, int64_t r1) {
    score_job *j = arg;
    int64_t V = j->V, per = j->n_ctx - j->first;
    for (int64_t r = r0; r < r1; r++) {
        int64_t R = j->row0 + r, b = R / per, t = j->first + R % per;
        if (t >= j->n_ctx - 1) { j->row_nll[R] = NAN; continue; }
        const float *l = j->logits + r * V;
        int32_t target = j->chunk_tokens[b * j->n_ctx + t + 1];
        float mx = l[0];
        for (int64_t c = 1; c < V; c++) mx = l[c] > mx ? l[c] : mx;
        double sum = 0.0;
        for (int64_t c = 0; c < V; c++) sum += exp((double)l[c] - mx);
        double lse = (double)mx + log(sum);
        j->row_nll[R] = lse - (double)l[target];
        if (j->teacher) {
            const float *q = j->teacher + R * V;
            float tm = q[0];
            for (int64_t c = 1; c < V; c++) tm = q[c] > tm ? q[c] : tm;
            double ts = 0.0;
            for (int64_t c = 0; c < V; c++) ts += exp((double)q[c] - tm);
            double tlse = (double)tm + log(ts), kl = 0.0;
            for (int64_t c = 0; c < V; c++) {
                double lp = (double)q[c] - tlse;
                kl += exp(lp) * (lp - ((double)l[c] - lse));
            }
            j->row_kl[R] = kl;
            j->row_same[R] = argmax(l, V) == argmax(q, V);
        }
    }
}

static nb_status score_cb(nb_ctx *ctx, void *user, int64_t row0, int64_t nrows, int64_t vocab, float *logits) {
    score_job *j = user;
    j->logits = logits;
    j->row0 = row0;
    nb_parallel_for(ctx, nrows, 1 + 65536 / (vocab + 1), score_range, j);
    return NB_OK;
}

typedef struct { float *dst; } copy_job;
static nb_status copy_cb(nb_ctx *ctx, void *user, int64_t row0, int64_t nrows, int64_t vocab, float *logits) {
    copy_job *c = user;
    memcpy(c->dst + row0 * vocab, logits, sizeof(float) * (size_t)(nrows * vocab));
    return NB_OK;
}

nb_status nb_model_eval(nb_ctx *ctx, nb_model *m, nb_model *teacher, const int32_t *tokens, int64_t n_tokens,
                        const nb_eval_opts *opts, nb_eval_result *out) {
    static const nb_eval_opts dflt = {0};
    if (!opts) opts = &dflt;
    memset(out, 0, sizeof *out);
    out->kld_mean = out->top1_agree = NAN;
    int64_t n_ctx = opts->n_ctx > 0 ? opts->n_ctx : 512, V = m->cfg.vocab_size;
    if (n_ctx < 4) return nb_fail(ctx, NB_ERR_INVALID, "eval: n_ctx %lld is too small", (long long)n_ctx);
    if (teacher && teacher->cfg.vocab_size != V)
        return nb_fail(ctx, NB_ERR_SHAPE, "eval: the teacher's vocabulary (%lld) differs from the model's (%lld)",
                       (long long)teacher->cfg.vocab_size, (long long)V);
    int64_t max_chunks = n_tokens / n_ctx;
    if (max_chunks < 1)
        return nb_fail(ctx, NB_ERR_INVALID, "eval: %lld tokens are fewer than one chunk of n_ctx %lld", (long long)n_tokens,
                       (long long)n_ctx);
    int64_t chunks = opts->n_chunks > 0 && opts->n_chunks < max_chunks ? opts->n_chunks : max_chunks;
    int32_t bos = opts->bos == -1 ? m->cfg.bos_token_id : opts->bos;
    int64_t first = n_ctx / 2, per = n_ctx - first;
    /* batch: about 2048 tokens per forward, and teacher logits under 256 MiB */
    int64_t B = opts->batch > 0 ? opts->batch : (2048 + n_ctx - 1) / n_ctx;
    if (teacher && opts->batch <= 0) {
        int64_t cap = (int64_t)(64 << 20) / (per * V);
        if (B > cap) B = cap;
    }
    if (B < 1) B = 1;
    if (B > chunks) B = chunks;
    int64_t rows = B * per;
    int32_t *ct = malloc(sizeof(int32_t) * (size_t)(B * n_ctx));
    double *nll = malloc(sizeof(double) * (size_t)rows), *kl = malloc(sizeof(double) * (size_t)rows);
    int8_t *same = malloc((size_t)rows);
    float *tl = teacher ? malloc(sizeof(float) * (size_t)(rows * V)) : NULL;
    nb_status s = NB_OK;
    if (!ct || !nll || !kl || !same || (teacher && !tl)) s = nb_fail(ctx, NB_ERR_NOMEM, "eval: out of memory");
    double sum = 0.0, sum2 = 0.0, klsum = 0.0;
    int64_t count = 0, agree = 0;
    for (int64_t c0 = 0; !s && c0 < chunks; c0 += B) {
        int64_t nb = chunks - c0 < B ? chunks - c0 : B;
        memcpy(ct, tokens + c0 * n_ctx, sizeof(int32_t) * (size_t)(nb * n_ctx));
        if (bos >= 0)
            for (int64_t b = 0; b < nb; b++) ct[b * n_ctx] = bos;
        nb_forward_opts fo = {0};
        fo.logits_start = first;
        if (teacher) {
            copy_job cj = {tl};
            fo.on_logits = copy_cb;
            fo.user = &cj;
            if ((s = nb_model_forward(ctx, teacher, ct, nb, n_ctx, &fo))) break;
        }
        score_job j = {ctx, ct, n_ctx, first, V, tl, nll, kl, same, NULL, 0};
        fo.on_logits = score_cb;
        fo.user = &j;
        if ((s = nb_model_forward(ctx, m, ct, nb, n_ctx, &fo))) break;
        for (int64_t r = 0; r < nb * per; r++) {
            if (isnan(nll[r])) continue;
            sum += nll[r];
            sum2 += nll[r] * nll[r];
            count++;
            if (teacher) {
                klsum += kl[r];
                agree += same[r];
            }
        }
        if (opts->on_chunks && (s = opts->on_chunks(ctx, opts->user, c0 + nb, chunks))) break;
    }
    free(ct);
    free(nll);
    free(kl);
    free(same);
    free(tl);
    if (s) return s;
    double mean = sum / (double)count, var = sum2 / (double)count - mean * mean;
    out->nll = mean;
    out->ppl = exp(mean);
    out->ppl_err = var > 0 && count > 1 ? sqrt(var / (double)(count - 1)) * out->ppl : 0.0;
    out->tokens = count;
    out->chunks = chunks;
    if (teacher) {
        out->kld_mean = klsum / (double)count;
        out->top1_agree = 100.0 * (double)agree / (double)count;
    }
    return NB_OK;
}
