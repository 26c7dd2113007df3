/* Decoding: nb_sample_logits picks one token from a row of logits (greedy, temperature, top-k, top-p),
 * nb_model_generate continues a batch of prompts of any lengths with one KV cache, position by position,
 * each row drawing from its own seeded stream, rows leaving the batch as they stop. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"
#include "nibble/generate.h"

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

/* ---- generation ---------------------------------------------------------------------------- */

static int is_stop(const nb_model_config *c, const nb_generate_opts *o, int32_t t) {
    if (o->stop_at_eos)
        for (int i = 0; i < c->n_eos; i++)
            if (c->eos_token_ids[i] == t) return 1;
    for (int32_t i = 0; i < o->n_stop; i++)
        if (o->stop[i] == t) return 1;
    return 0;
}

/* Keep only the cache rows keep[0..nb) (ascending old row indices), moved down to rows 0..nb: the
 * cache then serves a batch of nb. Each block moves to an offset at or below its own, and blocks are
 * visited in ascending order, so no block is overwritten before it is read. */
static void cache_keep_rows(nb_kv_cache *kc, const int64_t *keep, int64_t nb) {
    size_t row = (size_t)(kc->max_len * kc->kv_dim), used = sizeof(float) * (size_t)(kc->len * kc->kv_dim);
    for (int64_t l = 0; l < kc->n_layers; l++)
        for (int64_t i = 0; i < nb; i++) {
            size_t src = (size_t)(l * kc->B + keep[i]) * row, dst = (size_t)(l * nb + i) * row;
            if (src == dst) continue;
            memmove(kc->k + dst, kc->k + src, used);
            memmove(kc->v + dst, kc->v + src, used);
        }
    kc->B = nb;
}

typedef struct {
    const float *logits;            /* [n_act, V] */
    int64_t V;
    const int64_t *rows;            /* active row -> original row */
    const int8_t *sampling;         /* per active row: past its prompt */
    const nb_sample_opts *so;
    nb_rng *rngs;                   /* per original row */
    int32_t *picked;                /* per active row */
} sample_job;

static void sample_range(void *arg, int64_t i0, int64_t i1) {
    sample_job *j = arg;
    for (int64_t i = i0; i < i1; i++)
        if (j->sampling[i]) j->picked[i] = nb_sample_logits(j->logits + i * j->V, j->V, j->so, &j->rngs[j->rows[i]]);
}

nb_status nb_model_generate(nb_ctx *ctx, nb_model *m, const int32_t *prompts, const int64_t *prompt_lens,
                            int64_t B, int64_t n_new, const nb_generate_opts *opts, int32_t *out,
                            int64_t *n_out) {
    static const nb_generate_opts dflt = {{1, 0.0f, 0, 1.0f}, 0, NULL, 1, NULL, 0, NULL, NULL};
    if (!opts) opts = &dflt;
    if (B < 1) return nb_fail(ctx, NB_ERR_INVALID, "generate: B must be at least 1 (got %lld)", (long long)B);
    if (n_new < 0) return nb_fail(ctx, NB_ERR_INVALID, "generate: n_new is negative");
    if (opts->n_stop < 0 || (opts->n_stop > 0 && !opts->stop))
        return nb_fail(ctx, NB_ERR_INVALID, "generate: n_stop %d without stop ids", (int)opts->n_stop);
    int64_t lmin = INT64_MAX, lmax = 0;
    for (int64_t b = 0; b < B; b++) {
        if (prompt_lens[b] < 1)
            return nb_fail(ctx, NB_ERR_INVALID, "generate: the prompt of row %lld needs at least one token (e.g. BOS)",
                           (long long)b);
        lmin = prompt_lens[b] < lmin ? prompt_lens[b] : lmin;
        lmax = prompt_lens[b] > lmax ? prompt_lens[b] : lmax;
    }
    for (int64_t b = 0; b < B; b++) n_out[b] = 0;
    if (n_new == 0) return NB_OK;
    int64_t V = m->cfg.vocab_size;
    nb_kv_cache *kc = NULL;
    nb_status s = nb_kv_cache_new(ctx, m, B, lmax + n_new, &kc);
    if (s) return s;
    /* per original row: prompt offset, RNG; per active row (packed): original row, next token, ... */
    int64_t *first = malloc(sizeof(int64_t) * (size_t)B), *rows = malloc(sizeof(int64_t) * (size_t)B);
    int64_t *keep = malloc(sizeof(int64_t) * (size_t)B);
    nb_rng *rngs = malloc(sizeof(nb_rng) * (size_t)B);
    int32_t *next = malloc(sizeof(int32_t) * (size_t)(B * lmin > B ? B * lmin : B));
    int32_t *picked = malloc(sizeof(int32_t) * (size_t)B);
    int8_t *sampling = malloc((size_t)B);
    float *lg = malloc(sizeof(float) * (size_t)(B * V));
    if (!first || !rows || !keep || !rngs || !next || !picked || !sampling || !lg) {
        s = nb_fail(ctx, NB_ERR_NOMEM, "generate: out of memory");
        goto done;
    }
    for (int64_t b = 0, off = 0; b < B; off += prompt_lens[b], b++) {
        first[b] = off;
        rows[b] = b;
        nb_rng_seed(&rngs[b], opts->seeds ? opts->seeds[b] : opts->seed + (uint64_t)b);
        memcpy(next + b * lmin, prompts + off, sizeof(int32_t) * (size_t)lmin);
    }
    /* the prompt length all rows share in one forward; its last position's logits come back */
    nb_forward_opts fo = {0};
    fo.logits = lg;
    fo.cache = kc;
    fo.logits_start = lmin - 1;
    s = nb_model_forward(ctx, m, next, B, lmin, &fo);
    fo.logits_start = 0;
    int64_t n_act = B, pos = lmin;   /* pos: positions in the cache; the logits predict position pos */
    sample_job sj = {lg, V, rows, sampling, &opts->sample, rngs, picked};
    while (!s) {
        for (int64_t i = 0; i < n_act; i++) sampling[i] = pos >= prompt_lens[rows[i]];
        nb_parallel_for(ctx, n_act, 1, sample_range, &sj);
        int64_t kept = 0;
        for (int64_t i = 0; i < n_act && !s; i++) {
            int64_t b = rows[i];
            int stop = 0;
            if (sampling[i]) {
                int32_t t = picked[i];
                out[b * n_new + n_out[b]++] = t;
                if (opts->on_token) s = opts->on_token(ctx, opts->user, b, t);
                stop = n_out[b] == n_new || is_stop(&m->cfg, opts, t);
                next[i] = t;
            } else {
                next[i] = prompts[first[b] + pos];
            }
            if (!stop) {   /* pack the rows that go on */
                keep[kept] = i;
                rows[kept] = b;
                next[kept++] = next[i];
            }
        }
        if (s || kept == 0) break;
        if (kept < n_act) {
            cache_keep_rows(kc, keep, kept);
            n_act = kept;
        }
        s = nb_model_forward(ctx, m, next, n_act, 1, &fo);
        pos++;
    }
done:
    if (kc) kc->B = B;   /* what it was allocated with, for nb_kv_cache_free */
    nb_kv_cache_free(kc);
    free(lg);
    free(sampling);
    free(picked);
    free(next);
    free(rngs);
    free(keep);
    free(rows);
    free(first);
    return s;
}
