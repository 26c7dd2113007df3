/* Private parts shared by the Hugging Face export's files (core/src/export/): the driver and tensors
 * (export_hf.c), the JSON it writes (export_config.c) and the target directory checks
 * (export_target.c). Not installed. */
#ifndef NIBBLE_EXPORT_INTERNAL_H
#define NIBBLE_EXPORT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "nibble/export.h"
#include "qmodel/qmodel_internal.h"

/* ---- export_target.c ---- */

/* dir + "/" + name into out; 0 if it fit. */
int nbx_join_path(char *out, size_t cap, const char *dir, const char *name);
/* The files write_all copies from the source directory (or writes for a GGUF's tokenizer); NULL-ended.
 * nb_export_check_target counts them as an export's own. */
extern const char *const nbx_copied_files[];
/* nb_export_check_target; check_lock 0 when this process holds target's lock itself. */
nb_status nbx_check_target(nb_ctx *ctx, const char *dir, int check_lock);
/* A sibling of target that does not exist yet: target + tag + pid (+ a counter), created as a
 * directory when make. 0, or -1 with errno set. */
int nbx_free_sibling(char *out, size_t cap, const char *target, const char *tag, int make);
/* Remove (with remove_tree) the staging and moved-aside siblings of target (target.nibble-tmp-PID,
 * target.nibble-old-PID) whose process no longer exists. Call it holding target's lock. */
void nbx_remove_stale(const char *target, void (*remove_tree)(const char *));
/* The advice of a refusal because another process holds target's lock. */
#define NBX_BUSY "wait for it to finish or choose another output directory"

/* ---- export_config.c ---- */

typedef struct nbx_strset {
    char **v;
    int64_t n, cap;
} nbx_strset;

typedef struct nbx_plan {
    char **quant_names;   /* quantized module names */
    int64_t n_quant;
    char **unq_names;     /* linear modules left unquantized (have a "quantizer" in ModelOpt's sense) */
    int64_t n_unq;
    const char *algo;     /* single algo, or "MIXED_PRECISION"; NULL when only the KV cache is quantized */
    int group_size;       /* for the single-algo case */
    int mixed;
    int kv;               /* the KV cache is quantized (FP8): k_scale / v_scale written */
} nbx_plan;

/* ModelOpt's quant_algo of a module's spec ("NVFP4", "FP8", ...), NULL for an unknown format. */
const char *nbx_quant_algo_of(const nb_qspec *s);
/* The weight format's block size (0 for per-tensor / per-channel formats). */
int nbx_group_size_of(const nb_qspec *s);
void nbx_strset_free(nbx_strset *s);
/* exclude_modules: the shortest prefix wildcards over unq that match nothing in quant, sorted, added
 * to res; -1 when out of memory. */
int nbx_summarize_excludes(char **unq, int64_t n_unq, char **quant, int64_t n_quant, nbx_strset *res);
/* hf_quant_config.json (ModelOpt layout). */
cJSON *nbx_modelopt_hf_quant_config(const nb_qmodel *qm, const nbx_plan *p, const int *included, nbx_strset *excl);
/* config.json's quantization_config in the ModelOpt layout. */
cJSON *nbx_modelopt_quantization_config(const nb_qmodel *qm, const nbx_plan *p, const int *included,
                                        const nbx_strset *excl);
/* config.json's quantization_config in the compressed-tensors layout. */
cJSON *nbx_ct_quantization_config(const nb_qmodel *qm, const int *included, int kv);
/* config.json for a model that came without one (GGUF, memory). */
cJSON *nbx_synth_config(const nb_qmodel *qm, nb_dtype dt);
/* config.json's torch_dtype (and dtype, where present) set to dt's name. */
void nbx_set_torch_dtype(cJSON *config, nb_dtype dt);
/* A JSON side file (config.json of the source, of an export target) is refused above this size:
 * the largest real config.json is tens of KiB, and the file is read whole into memory. */
#define NBX_JSON_MAX_BYTES (64 << 20)
/* The JSON file at path into *out: NB_OK with *out NULL when there is no such file; an error naming
 * the file when it cannot be read, is over NBX_JSON_MAX_BYTES, or is not valid JSON. */
nb_status nbx_read_json(nb_ctx *ctx, const char *path, cJSON **out);

#endif
