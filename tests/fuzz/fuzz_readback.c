/* libFuzzer target: the JSON side file of an export read back: config.json (with its
 * quantization_config) beside the weights of a real nibble export of the committed tiny Llama
 * (NVFP4, MXFP8, FP8 modules, ModelOpt layout). The export's own guard reads it (is this folder a
 * nibble export it may replace?), then nb_model_load dequantizes the export as the config says. */
#include <unistd.h>

#include "fuzz.h"

static const char *export_dir(void) {
    static char dir[1024];
    if (dir[0]) return dir;
    nb_ctx *ctx = fz_ctx();
    char src[1024], link[1100];
    snprintf(src, sizeof src, "%s/export", fz_dir());
    nb_qmodel *qm = fz_qmodel();
    nb_export_opts eo;
    nb_export_opts_init(&eo);
    fz_check(nb_qmodel_export(ctx, qm, src, &eo), "export");
    if (fz_seed_path("modelopt_config.json")) {
        char cfg[1100], ct[1100];
        snprintf(cfg, sizeof cfg, "%s/config.json", src);
        fz_copy(cfg, fz_seed_path("modelopt_config.json"));
        snprintf(ct, sizeof ct, "%s/export-ct", fz_dir());
        eo.layout = NB_LAYOUT_COMPRESSED_TENSORS;
        fz_check(nb_qmodel_export(ctx, qm, ct, &eo), "export compressed-tensors");
        snprintf(cfg, sizeof cfg, "%s/config.json", ct);
        fz_copy(cfg, fz_seed_path("ct_config.json"));
    }
    nb_qmodel_free(qm);
    snprintf(dir, sizeof dir, "%s", fz_mkdir("readback"));
    snprintf(link, sizeof link, "%s/model.safetensors", dir);
    snprintf(src + strlen(src), sizeof src - strlen(src), "/model.safetensors");
    if (symlink(src, link) != 0) abort();
    return dir;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nb_ctx *ctx = fz_ctx();
    const char *dir = export_dir();
    fz_write("readback/config.json", data, size);
    (void)nb_export_check_target(ctx, dir);
    nb_model *m = NULL;
    if (nb_model_load(ctx, dir, &m) == NB_OK) nb_model_free(m);
    return 0;
}
