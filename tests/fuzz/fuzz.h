/* Shared by the libFuzzer targets in tests/fuzz/: one context per process, a private temporary
 * folder (removed at exit) where each input is written as the file the parser reads, and the
 * committed tiny model (tests/golden/data/model_llama3) that fixtures are built from. A target
 * returns 0 for every input; a parser's refusal is an ordinary outcome, a sanitizer report is a
 * finding. */
#ifndef NIBBLE_FUZZ_H
#define NIBBLE_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nibble/nibble.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The process's context (1 thread: findings reproduce without scheduling noise). */
nb_ctx *fz_ctx(void);
/* The process's temporary folder, made on first use. */
const char *fz_dir(void);
/* Write data to fz_dir()/name (a path inside it: "sub/file" needs fz_mkdir("sub") first) and
 * return the path (a static buffer per slot: up to 4 live at once). Aborts on I/O failure: the
 * harness, not the parser, is broken then. */
const char *fz_write(const char *name, const uint8_t *data, size_t size);
const char *fz_mkdir(const char *name);
/* A file of the source tree (tests/golden/data/...), by path relative to the repository root. */
const char *fz_source(const char *rel);
/* Abort with a message when a fixture cannot be made (never for the fuzzed input). */
void fz_check(nb_status s, const char *what);

/* Where a target writes the seeds its fixture makes (a valid index, checkpoint, export config):
 * $NIBBLE_FUZZ_SEEDS/name, or NULL when that variable is unset (scripts/fuzz-campaign.sh --seeds). */
const char *fz_seed_path(const char *name);
/* Copy a file (a fixture's seed) to dst; aborts on failure. */
void fz_copy(const char *src, const char *dst);

/* The committed tiny Llama (2 layers, hidden 32, vocab 96), loaded once. */
nb_model *fz_model(void);
/* A quantized view of fz_model() with weights calibrated: NVFP4 attention, MXFP8 gate/up, FP8
 * per-channel down_proj, FP8 per-tensor lm_head, fused siblings; what checkpoints and exports hold. */
nb_qmodel *fz_qmodel(void);

#endif
