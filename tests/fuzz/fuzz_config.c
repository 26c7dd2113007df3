/* libFuzzer target: a model's config.json, beside the committed tiny Llama's weights: the config
 * read alone (nb_model_read_config), then the whole model loaded against the weights. */
#include <unistd.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nb_ctx *ctx = fz_ctx();
    static char dir[1024];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s", fz_mkdir("cfg"));
        char link[1100];
        snprintf(link, sizeof link, "%s/model.safetensors", dir);
        if (symlink(fz_source("tests/golden/data/model_llama3/model.safetensors"), link) != 0) abort();
    }
    fz_write("cfg/config.json", data, size);
    nb_model_config cfg;
    (void)nb_model_read_config(ctx, dir, &cfg);
    nb_model *m = NULL;
    if (nb_model_load(ctx, dir, &m) == NB_OK) nb_model_free(m);
    return 0;
}
