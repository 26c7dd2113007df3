/* JSON text the way Python's json.dumps writes it (indent, separators, ensure_ascii escapes,
 * optional sort_keys), so files nibble writes diff cleanly against ModelOpt's and transformers'. */
#ifndef NIBBLE_JSON_PY_H
#define NIBBLE_JSON_PY_H

#include <cjson/cJSON.h>

/* A malloc'd string (caller frees), or NULL when out of memory. indent < 0 = one line with ", "
 * and ": " separators (json.dumps default); indent >= 0 = pretty, with "," line ends. */
char *nb_json_py_dumps(const cJSON *item, int indent, int sort_keys);
/* Write the text plus a trailing newline if `newline`; 0 on success, -1 on an I/O error (errno set). */
int nb_json_py_write_file(const char *path, const cJSON *item, int indent, int sort_keys, int newline);

#endif
