/* Evaluation: perplexity exactly as llama.cpp's llama-perplexity computes it (chunks of n_ctx tokens,
 * BOS in each chunk's first slot, only the second half scored), KL(teacher||model) and top-1 agreement
 * at the same positions. Generation is in generate.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"
#include "nibble/generate.h"

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
            j->row_same[R] = nb_sample_logits(l, V, NULL, NULL) == nb_sample_logits(q, V, NULL, NULL);
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
