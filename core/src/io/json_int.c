/* Range-checked JSON number -> integer conversion (see json_int.h). */
#include "io/json_int.h"

#include <errno.h>
#include <stdlib.h>

int nb_json_int(const cJSON *j, int64_t lo, int64_t hi, int64_t *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double d = j->valuedouble;
    /* [-2^63, 2^63) is exactly the doubles whose conversion to int64_t is defined; NaN fails both */
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) return 0;
    int64_t v = (int64_t)d;
    if ((double)v != d || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

int nb_text_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s) return 0;
    const char *d = s[0] == '-' ? s + 1 : s;
    if (*d < '0' || *d > '9') return 0;   /* strtoll would skip spaces and take a '+' */
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return 0;
    *out = (int64_t)v;
    return 1;
}
