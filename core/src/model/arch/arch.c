/* The table of architecture families (arch.h) and the config.json field readers they share with
 * model/load.c. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "io/json_int.h"
#include "model/arch/arch.h"

static const nb_arch_family *const k_families[] = {&nb_arch_llama, &nb_arch_mistral, &nb_arch_qwen2,
                                                   &nb_arch_qwen3, &nb_arch_mixtral, &nb_arch_qwen3_moe};
enum { N_FAMILIES = sizeof k_families / sizeof k_families[0] };

const nb_arch_family *nb_arch_family_of(int32_t arch) {
    for (int i = 0; i < N_FAMILIES; i++)
        if (k_families[i]->arch == arch) return k_families[i];
    return NULL;
}

const nb_arch_family *nb_arch_family_named(const char *name) {
    for (int i = 0; name && i < N_FAMILIES; i++)
        if (!strcmp(k_families[i]->name, name)) return k_families[i];
    return NULL;
}

void nb_arch_names(char *buf, size_t cap, int gguf) {
    size_t n = 0;
    if (cap) buf[0] = 0;
    for (int i = 0; i < N_FAMILIES && n < cap; i++)
        if (!gguf || k_families[i]->gguf)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", k_families[i]->name);
}

const cJSON *nb_cfg_get(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

int64_t nb_cfg_int(nb_cfg_reader *c, const cJSON *o, const char *k, int required, int64_t dflt) {
    const cJSON *v = nb_cfg_get(o, k);
    if (!v) {
        if (required && !c->err) c->err = nb_fail(c->ctx, NB_ERR_FORMAT, "%s: missing required field '%s'", c->path, k);
        return dflt;
    }
    int64_t x;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble)) {
        if (!c->err) c->err = nb_fail(c->ctx, NB_ERR_FORMAT, "%s: field '%s' must be an integer", c->path, k);
        return dflt;
    }
    /* sizes and counts: anything past 2^31 is no model nibble can hold, and keeps products of two in int64 */
    if (!nb_json_int(v, INT32_MIN, INT32_MAX, &x)) {
        if (!c->err)
            c->err = nb_fail(c->ctx, NB_ERR_FORMAT, "%s: field '%s' is %g, outside [%d, %d]", c->path, k, v->valuedouble,
                             INT32_MIN, INT32_MAX);
        return dflt;
    }
    return x;
}

double nb_cfg_num(nb_cfg_reader *c, const cJSON *o, const char *k, double dflt) {
    const cJSON *v = nb_cfg_get(o, k);
    if (!v) return dflt;
    if (!cJSON_IsNumber(v)) {
        if (!c->err) c->err = nb_fail(c->ctx, NB_ERR_FORMAT, "%s: field '%s' must be a number", c->path, k);
        return dflt;
    }
    return v->valuedouble;
}

int nb_cfg_bool(nb_cfg_reader *c, const cJSON *o, const char *k, int dflt) {
    const cJSON *v = nb_cfg_get(o, k);
    if (!v) return dflt;
    if (!cJSON_IsBool(v)) {
        if (!c->err) c->err = nb_fail(c->ctx, NB_ERR_FORMAT, "%s: field '%s' must be true or false", c->path, k);
        return dflt;
    }
    return cJSON_IsTrue(v);
}

const char *nb_cfg_str(const cJSON *o, const char *k) {
    const cJSON *v = nb_cfg_get(o, k);
    return v && cJSON_IsString(v) ? v->valuestring : NULL;
}
