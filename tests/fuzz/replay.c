/* main() for the fuzz targets when built without libFuzzer (the release and sanitizer builds):
 * runs LLVMFuzzerTestOneInput once on every file named, or on every file inside a folder named,
 * so ctest replays the committed corpus and reproducers under gcc's ASan/UBSan too. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return 1; }
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 65536;
            uint8_t *q = realloc(buf, cap);
            if (!q) { free(buf); fclose(f); return 1; }
            buf = q;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    fclose(f);
    /* a private copy of exactly n bytes: ASan then sees any read past the input's end */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) { free(buf); return 1; }
    if (n) memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv) {
    int bad = 0;
    long files = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) continue;   /* an absent folder (no reproducers yet) is empty */
        if (!S_ISDIR(st.st_mode)) { bad |= run_file(argv[i]); files++; continue; }
        DIR *d = opendir(argv[i]);
        if (!d) { perror(argv[i]); return 1; }
        char **names = NULL;
        size_t n = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char **q = realloc(names, (n + 1) * sizeof *names);
            if (!q) return 1;
            names = q;
            names[n] = malloc(strlen(argv[i]) + strlen(e->d_name) + 2);
            sprintf(names[n++], "%s/%s", argv[i], e->d_name);
        }
        closedir(d);
        qsort(names, n, sizeof *names, cmp);
        for (size_t k = 0; k < n; k++) {
            bad |= run_file(names[k]);
            files++;
            free(names[k]);
        }
        free(names);
    }
    printf("replayed %ld inputs\n", files);
    if (files == 0) fprintf(stderr, "no inputs: name a corpus folder or file\n");
    return bad || files == 0;
}
