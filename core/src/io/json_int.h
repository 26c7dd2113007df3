/* JSON numbers (and integers in metadata text) that become integers. cJSON keeps every number as a double; casting a double outside
 * the target type's range is undefined behaviour (1e36 -> int64_t), so every parser goes through
 * this range check before the cast. */
#ifndef NIBBLE_JSON_INT_H
#define NIBBLE_JSON_INT_H

#include <stdint.h>

#include <cjson/cJSON.h>

/* 1 and *out set when `j` is a JSON number with no fractional part in [lo, hi]; 0 otherwise
 * (not a number, fractional, out of range), *out untouched. */
int nb_json_int(const cJSON *j, int64_t lo, int64_t hi, int64_t *out);

/* The same for an integer written as text (a version or format number in safetensors metadata):
 * 1 and *out set when `s` is exactly an optional '-' and decimal digits, nothing before or after,
 * with a value in [lo, hi]; 0 otherwise (atoi would read "1x" as 1 and "99999999999" as garbage). */
int nb_text_int(const char *s, int64_t lo, int64_t hi, int64_t *out);

#endif
