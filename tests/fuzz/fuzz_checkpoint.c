/* libFuzzer target: nibble's own checkpoint of a quantized model (nb_qmodel_save's safetensors:
 * master weights, quantizer state, and the per-module specs JSON in its metadata), restored into
 * a fresh quantized view of the committed tiny Llama. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nb_ctx *ctx = fz_ctx();
    nb_model *m = fz_model();
    static int seeded;
    if (!seeded++ && fz_seed_path("student.safetensors")) {
        nb_qmodel *qm = fz_qmodel();
        fz_check(nb_qmodel_save(ctx, qm, fz_seed_path("student.safetensors")), "save");
        nb_qmodel_free(qm);
    }
    const char *path = fz_write("student.safetensors", data, size);
    nb_qmodel *qm = NULL;
    if (nb_qmodel_new(ctx, m, &qm) != NB_OK) abort();
    if (nb_qmodel_restore(ctx, qm, path) == NB_OK) (void)nb_qmodel_check(ctx, qm);
    nb_qmodel_free(qm);
    return 0;
}
