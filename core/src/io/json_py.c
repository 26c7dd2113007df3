/* Python-compatible JSON serialization over cJSON trees (see json_py.h). Numbers: integral values
 * print as integers, others as the shortest decimal that round-trips (Python's float repr). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json_py.h"

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

static void put_indent(sbuf *b, int indent, int depth) {
    put(b, "\n", 1);
    for (int i = 0; i < indent * depth; i++) put(b, " ", 1);
}

/* ensure_ascii=True: non-ASCII as \uXXXX (surrogate pairs above the BMP). */
static void put_string(sbuf *b, const char *s) {
    put(b, "\"", 1);
    const unsigned char *p = (const unsigned char *)s;
    char tmp[16];
    while (*p) {
        unsigned c = *p;
        if (c == '"') { puts_(b, "\\\""); p++; continue; }
        if (c == '\\') { puts_(b, "\\\\"); p++; continue; }
        if (c == '\n') { puts_(b, "\\n"); p++; continue; }
        if (c == '\r') { puts_(b, "\\r"); p++; continue; }
        if (c == '\t') { puts_(b, "\\t"); p++; continue; }
        if (c == '\b') { puts_(b, "\\b"); p++; continue; }
        if (c == '\f') { puts_(b, "\\f"); p++; continue; }
        if (c < 0x20) { snprintf(tmp, sizeof tmp, "\\u%04x", c); puts_(b, tmp); p++; continue; }
        if (c < 0x80) { put(b, (const char *)p, 1); p++; continue; }
        unsigned cp = 0;
        int extra = 0;
        if ((c & 0xE0) == 0xC0) { cp = c & 0x1F; extra = 1; }
        else if ((c & 0xF0) == 0xE0) { cp = c & 0x0F; extra = 2; }
        else if ((c & 0xF8) == 0xF0) { cp = c & 0x07; extra = 3; }
        else { cp = 0xFFFD; }
        p++;
        for (int k = 0; k < extra && (*p & 0xC0) == 0x80; k++, p++) cp = (cp << 6) | (*p & 0x3F);
        if (cp >= 0x10000) {
            cp -= 0x10000;
            snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
        } else {
            snprintf(tmp, sizeof tmp, "\\u%04x", cp);
        }
        puts_(b, tmp);
    }
    put(b, "\"", 1);
}

static void put_number(sbuf *b, double v) {
    char tmp[64];
    if (isnan(v)) { puts_(b, "NaN"); return; }
    if (isinf(v)) { puts_(b, v > 0 ? "Infinity" : "-Infinity"); return; }
    if (v == floor(v) && fabs(v) < 9007199254740992.0) {
        snprintf(tmp, sizeof tmp, "%.0f", v);
        puts_(b, tmp);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v);
        if (strtod(tmp, NULL) == v) break;
    }
    puts_(b, tmp);
}

static int cmp_keys(const void *a, const void *b) {
    const cJSON *x = *(const cJSON *const *)a, *y = *(const cJSON *const *)b;
    return strcmp(x->string, y->string);
}

static void dump(sbuf *b, const cJSON *it, int indent, int sort_keys, int depth) {
    if (cJSON_IsNull(it)) { puts_(b, "null"); return; }
    if (cJSON_IsTrue(it)) { puts_(b, "true"); return; }
    if (cJSON_IsFalse(it)) { puts_(b, "false"); return; }
    if (cJSON_IsNumber(it)) { put_number(b, it->valuedouble); return; }
    if (cJSON_IsString(it)) { put_string(b, it->valuestring ? it->valuestring : ""); return; }
    if (cJSON_IsRaw(it)) { puts_(b, it->valuestring ? it->valuestring : "null"); return; }
    int is_obj = cJSON_IsObject(it);
    int n = cJSON_GetArraySize(it);
    if (n == 0) { puts_(b, is_obj ? "{}" : "[]"); return; }
    const cJSON **kids = malloc((size_t)n * sizeof *kids);
    if (!kids) { b->oom = 1; return; }
    int k = 0;
    for (const cJSON *c = it->child; c; c = c->next) kids[k++] = c;
    if (is_obj && sort_keys) qsort(kids, (size_t)n, sizeof *kids, cmp_keys);
    put(b, is_obj ? "{" : "[", 1);
    for (int i = 0; i < n; i++) {
        if (i) puts_(b, indent >= 0 ? "," : ", ");
        if (indent >= 0) put_indent(b, indent, depth + 1);
        if (is_obj) {
            put_string(b, kids[i]->string ? kids[i]->string : "");
            puts_(b, ": ");
        }
        dump(b, kids[i], indent, sort_keys, depth + 1);
    }
    if (indent >= 0) put_indent(b, indent, depth);
    put(b, is_obj ? "}" : "]", 1);
    free(kids);
}

char *nb_json_py_dumps(const cJSON *item, int indent, int sort_keys) {
    sbuf b = {0};
    dump(&b, item, indent, sort_keys, 0);
    if (b.oom) { free(b.p); return NULL; }
    if (!b.p) { b.p = malloc(1); if (b.p) b.p[0] = 0; }
    return b.p;
}

int nb_json_py_write_file(const char *path, const cJSON *item, int indent, int sort_keys, int newline) {
    char *s = nb_json_py_dumps(item, indent, sort_keys);
    if (!s) return -1;
    FILE *f = fopen(path, "wb");
    if (!f) { free(s); return -1; }
    size_t n = strlen(s);
    int ok = fwrite(s, 1, n, f) == n && (!newline || fputc('\n', f) != EOF);
    free(s);
    if (fclose(f) != 0) ok = 0;
    return ok ? 0 : -1;
}
