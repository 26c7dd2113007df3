/* `nibble`: the command-line host. Embeds LuaJIT (classic Lua C API, modelled on luajit.c), makes
 * the `nibble` Lua module reachable without installation, and runs scripts (`run`, `-e`), the
 * built-in flags, sub-commands implemented in Lua (lua/nibble/cli/<cmd>.lua) and the REPL.
 * Ctrl-C sets a Lua hook that raises "interrupted" and interrupts the default nb_ctx; the run ends with
 * "nibble: interrupted" and exit code 130, with no traceback unless NIBBLE_DEBUG=1. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <luajit.h>

#include "host.h"

#ifndef NIBBLE_LUA_SOURCE_DIR
#define NIBBLE_LUA_SOURCE_DIR "lua"
#endif
#ifndef NIBBLE_LUA_BUILD_DIR
#define NIBBLE_LUA_BUILD_DIR "lua"
#endif
#ifndef NIBBLE_LUA_INSTALL_DIR
#define NIBBLE_LUA_INSTALL_DIR "/usr/local/share/lua/5.1"
#endif

static lua_State *g_L;
static volatile sig_atomic_t g_sigints;     /* SIGINTs not yet delivered as a Lua error */
static volatile sig_atomic_t g_got_sigint;  /* a SIGINT arrived during the current protected call */
static volatile sig_atomic_t g_warned;      /* the "still running" notice was printed */
volatile sig_atomic_t nbh_prompt_interrupt;

/* ---- Ctrl-C --------------------------------------------------------------------------------- */

static void lstop(lua_State *L, lua_Debug *ar) {
    /* Functions the Lua side marked critical (they move ownership of C objects, or keep a step and
     * its record together) finish first, with everything they call: the hook stays armed and fires
     * at the first instruction outside them. */
    (void)ar;
    lua_Debug frame;
    for (int level = 0; lua_getstack(L, level, &frame); level++) {
        if (!lua_getinfo(L, "f", &frame)) continue;
        int critical = nbh_is_critical(L, -1);
        lua_pop(L, 1);
        if (critical) return;
    }
    lua_sethook(L, NULL, 0, 0);
    nb_ctx *ctx = nbh_ctx_if_created();
    int delivered = ctx && !nb_ctx_interrupted(ctx);
    g_sigints = 0;
    g_warned = 0;
    alarm(0);
    /* A nibble call already raised this interrupt as an error (nibble.check clears the context's
     * flag when it does): once is enough, or a handler that saves a checkpoint would be cut short. */
    if (delivered) return;
    /* The interrupt is delivered now, as a Lua error: later C calls must not see it again. */
    if (ctx) nb_ctx_clear_interrupt(ctx);
    lua_pushstring(L, "interrupted");   /* the traceback says where */
    lua_error(L);
}

/* One second after a Ctrl-C that no hook or C loop has honoured, say why and what to do. */
static void on_sigalrm(int sig) {
    (void)sig;
    if (g_sigints > 0) {
        static const char msg[] = "\nnibble: still running: LuaJIT-compiled Lua loops cannot be interrupted "
                                  "(loops that call nibble can); Ctrl-C again to exit\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)w;
        g_warned = 1;
    }
}

static void on_sigint_running(int sig) {
    g_got_sigint = 1;
    if (g_sigints > 0) {
        /* Ctrl-C pressed again quickly (a busy machine may take a moment to honour the first):
         * the first is still on its way, nothing more to do. */
        if (!g_warned) return;
        /* Ctrl-C after the "still running" notice: LuaJIT cannot leave a compiled loop through a
         * hook, so give the user the way out luajit.c gives (default action). */
        static const char msg[] = "\nnibble: interrupted twice, exiting\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)w;
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    g_sigints = 1;
    nb_ctx *ctx = nbh_ctx_if_created();
    if (ctx) nb_ctx_interrupt(ctx);
    lua_sethook(g_L, lstop, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
    alarm(1);
}

static void on_sigint_prompt(int sig) {
    (void)sig;
    nbh_prompt_interrupt = 1;
}

static void set_sigint(void (*fn)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;   /* no SA_RESTART: a blocking read returns EINTR so the interrupt is seen */
    sigaction(SIGINT, &sa, NULL);
}

void nbh_signals_prompt(void) { set_sigint(on_sigint_prompt); }
void nbh_signals_default(void) { set_sigint(SIG_DFL); }

/* ---- protected calls -------------------------------------------------------------------------- */

int nbh_brief_errors;

/* NIBBLE_DEBUG set to anything but "" or "0": every error keeps its traceback (as nibble.cli.debug_on). */
static int debug_on(void) {
    const char *v = getenv("NIBBLE_DEBUG");
    return v && *v && strcmp(v, "0") != 0;
}

/* The error Ctrl-C raises: "interrupted" from the hook, possibly with a note after it (nibble.cli
 * says when an export had completed), or NB_ERR_INTERRUPTED from a nibble call that saw the flag. */
static int is_interrupt(const char *msg) {
    return strncmp(msg, "interrupted", 11) == 0 || strstr(msg, "NB_ERR_INTERRUPTED") != NULL;
}

static int msghandler(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (msg == NULL) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) msg = lua_tostring(L, -1);
        else msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    /* a message that already carries its traceback (nibble.cli.program adds the one from where a bug
     * happened before it re-raises) is not given a second one from the re-raise */
    if (strstr(msg, "\nstack traceback:")) return 1;
    /* Ctrl-C is the user's request, not a fault, and at the REPL the user's own line is the only
     * frame that matters: the message alone, unless NIBBLE_DEBUG asks for the traceback */
    if ((nbh_brief_errors || is_interrupt(msg)) && !debug_on()) return 1;
    luaL_traceback(L, L, msg, 1);
    return 1;
}

int nbh_docall(lua_State *L, int narg, int nres, int *interrupted) {
    int base = lua_gettop(L) - narg;
    lua_pushcfunction(L, msghandler);
    lua_insert(L, base);
    nb_ctx *ctx = nbh_ctx_if_created();
    if (ctx) nb_ctx_clear_interrupt(ctx);
    g_sigints = 0;
    g_warned = 0;
    g_got_sigint = 0;
    set_sigint(on_sigint_running);
    signal(SIGALRM, on_sigalrm);
    int status = lua_pcall(L, narg, nres, base);
    alarm(0);
    nbh_signals_prompt();
    lua_sethook(L, NULL, 0, 0);
    g_sigints = 0;
    g_warned = 0;
    ctx = nbh_ctx_if_created();
    if (ctx) nb_ctx_clear_interrupt(ctx);
    if (interrupted) *interrupted = g_got_sigint && status != 0;
    g_got_sigint = 0;
    lua_remove(L, base);
    return status;
}

void nbh_report(lua_State *L) {
    const char *msg = lua_tostring(L, -1);
    if (!msg) msg = "(error object is not a string)";
    fprintf(stderr, "nibble: %s\n", msg);
    fflush(stderr);
    lua_pop(L, 1);
}

/* ---- setup ------------------------------------------------------------------------------------ */

static void set_paths(lua_State *L) {
    /* NIBBLE_LUA_PATH first (it can replace any module), then lua/ and the build's generated
     * modules baked in at build time, then the install dir, then LuaJIT's default (LUA_PATH). */
    const char *extra = getenv("NIBBLE_LUA_PATH");
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "path");
    const char *dflt = lua_tostring(L, -1);
    lua_pushfstring(L,
                    "%s%s" NIBBLE_LUA_SOURCE_DIR "/?.lua;" NIBBLE_LUA_SOURCE_DIR "/?/init.lua;"
                    NIBBLE_LUA_BUILD_DIR "/?.lua;" NIBBLE_LUA_BUILD_DIR "/?/init.lua;"
                    NIBBLE_LUA_INSTALL_DIR "/?.lua;" NIBBLE_LUA_INSTALL_DIR "/?/init.lua;%s",
                    extra ? extra : "", extra && *extra ? ";" : "", dflt ? dflt : "");
    lua_setfield(L, -3, "path");
    lua_pop(L, 2);
    /* package.preload["nibble.host"] */
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "preload");
    lua_pushcfunction(L, luaopen_nibble_host);
    lua_setfield(L, -2, "nibble.host");
    lua_pop(L, 2);
}

/* require "name", leaving the result on the stack; reports and returns non-zero on error. */
static int dorequire(lua_State *L, const char *name) {
    lua_getglobal(L, "require");
    lua_pushstring(L, name);
    int status = nbh_docall(L, 1, 1, NULL);
    if (status) nbh_report(L);
    return status;
}

static int load_nibble(lua_State *L) {
    if (dorequire(L, "nibble")) return 1;
    lua_setglobal(L, "nibble");
    return 0;
}

/* key=value with a key that looks like a name: it becomes arg.key */
static int split_kv(const char *s, size_t *keylen) {
    const char *eq = strchr(s, '=');
    if (!eq || eq == s) return 0;
    if (!(s[0] == '_' || (s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= 'a' && s[0] <= 'z'))) return 0;
    for (const char *p = s; p < eq; p++) {
        char c = *p;
        if (!(c == '_' || c == '.' || c == '-' || (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') ||
              (c >= 'a' && c <= 'z')))
            return 0;
    }
    *keylen = (size_t)(eq - s);
    return 1;
}

/* Global `arg`: arg[0] = script, arg[-1] = the program, arg[1..n] = positional arguments,
 * arg.key = "value" for key=value. Pushes every argument (raw) for the chunk's `...`. */
static int push_args(lua_State *L, const char *progname, const char *script, char **args, int nargs) {
    lua_createtable(L, nargs, 4);
    lua_pushstring(L, progname);
    lua_rawseti(L, -2, -1);
    lua_pushstring(L, script);
    lua_rawseti(L, -2, 0);
    int pos = 0;
    for (int i = 0; i < nargs; i++) {
        size_t klen;
        if (split_kv(args[i], &klen)) {
            lua_pushlstring(L, args[i], klen);
            lua_pushstring(L, args[i] + klen + 1);
            lua_rawset(L, -3);
        } else {
            lua_pushstring(L, args[i]);
            lua_rawseti(L, -2, ++pos);
        }
    }
    lua_setglobal(L, "arg");
    luaL_checkstack(L, nargs + 1, "too many arguments");
    for (int i = 0; i < nargs; i++) lua_pushstring(L, args[i]);
    return nargs;
}

static int exit_code(int status, int interrupted) {
    if (status == 0) return 0;
    return interrupted ? 130 : 1;
}

/* Compile (chunk on the stack or error), then run with args. A file that returns a table (a
 * declarative recipe) is handed to nibble.pipeline.execute(table, arg) when `recipes` is set. */
static int run_chunk(lua_State *L, int load_status, const char *progname, const char *script, char **args,
                     int nargs, int recipes) {
    if (load_status) {
        nbh_report(L);
        return 1;
    }
    int base = lua_gettop(L) - 1;
    int n = push_args(L, progname, script, args, nargs);
    int interrupted = 0;
    int status = nbh_docall(L, n, 1, &interrupted);
    if (!status && recipes && lua_istable(L, -1)) {
        lua_getglobal(L, "require");
        lua_pushstring(L, "nibble.pipeline");
        status = nbh_docall(L, 1, 1, &interrupted);
        if (!status) {
            lua_getfield(L, -1, "execute");   /* table, module, execute */
            lua_remove(L, -2);
            lua_insert(L, -2);                /* execute, table */
            lua_getglobal(L, "arg");
            status = nbh_docall(L, 2, 0, &interrupted);
        }
    }
    if (status) nbh_report(L);
    lua_settop(L, base);
    return exit_code(status, interrupted);
}

/* The second line says which GEMM kernels run on this CPU, so a slow machine explains itself. */
static int print_version(void) {
    printf("nibble %s (%s, CUDA %s)\n", nb_version(), LUAJIT_VERSION, nb_cuda_built() ? "on" : "off");
    nb_blas_info info;
    if (nb_blas_get(NULL, &info) != NB_OK) {
        fprintf(stderr, "nibble: %s\n", nb_blas_error());
        return 1;
    }
    char line[1024];
    nb_blas_describe(&info, line, sizeof line);
    printf("%s\n", line);
    return 0;
}

static void print_help(lua_State *L) {
    printf("usage: nibble [COMMAND] [ARGS...]\n"
           "\n"
           "  nibble                     interactive REPL (line editing, history in ~/.nibble_history)\n"
           "  nibble run FILE [ARGS]     run a Lua script: key=value arguments reach it as arg.key\n"
           "                             (strings), the others as arg[1], arg[2], ...; FILE - is stdin\n"
           "  nibble FILE.lua [ARGS]     the same as run\n"
           "  nibble -e CODE [ARGS]      run CODE (arguments as for run)\n"
           "  nibble --version           print the nibble and LuaJIT versions, the GEMM library, its\n"
           "                             kernel set and the CPU's features\n"
           "  nibble --help              this help\n"
           "\n"
           "commands (lua/nibble/cli/<name>.lua):\n");
    fflush(stdout);
    /* The list comes from the Lua side so commands added later appear without touching the host. */
    lua_getglobal(L, "require");
    lua_pushstring(L, "nibble.cli");
    if (nbh_docall(L, 1, 1, NULL) == 0) {
        lua_getfield(L, -1, "help_lines");
        if (nbh_docall(L, 0, 1, NULL) == 0 && lua_isstring(L, -1)) fputs(lua_tostring(L, -1), stdout);
        else if (!lua_isstring(L, -1)) fputs("  (none found)\n", stdout);
        else nbh_report(L);
    } else {
        nbh_report(L);
    }
    printf("\nThe Lua module: `nibble` is a global in scripts and the REPL (require \"nibble\" from luajit).\n"
           "environment: NIBBLE_THREADS (threads of the default context), NIBBLE_LUA_PATH (extra\n"
           "module path, searched first), NIBBLE_LIB (libnibble for a plain luajit), OPENBLAS_CORETYPE\n"
           "(forces the GEMM kernel set; unset, nibble picks the CPU's best: see --version), NIBBLE_BLAS\n"
           "(another CBLAS library to load, e.g. libblis.so.4)\n");
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* nibble <cmd> args...: lua/nibble/cli/<cmd>.lua. Returns -1 if there is no such command. */
static int run_cli(lua_State *L, const char *cmd, char **args, int nargs) {
    lua_getglobal(L, "require");
    lua_pushstring(L, "nibble.cli");
    if (nbh_docall(L, 1, 1, NULL)) { nbh_report(L); return 1; }
    lua_getfield(L, -1, "exists");
    lua_pushstring(L, cmd);
    if (nbh_docall(L, 1, 1, NULL)) { nbh_report(L); return 1; }
    int exists = lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (!exists) { lua_pop(L, 1); return -1; }
    if (load_nibble(L)) return 1;
    lua_getfield(L, -1, "main");
    lua_pushstring(L, cmd);
    lua_createtable(L, nargs, 0);
    for (int i = 0; i < nargs; i++) {
        lua_pushstring(L, args[i]);
        lua_rawseti(L, -2, i + 1);
    }
    int interrupted = 0;
    int status = nbh_docall(L, 2, 1, &interrupted);
    if (status) { nbh_report(L); return exit_code(status, interrupted); }
    int code = (int)lua_tointeger(L, -1);
    lua_pop(L, 2);
    return code;
}

typedef struct { int argc; char **argv; int exit; } pmain_args;

static int pmain(lua_State *L) {
    pmain_args *a = (pmain_args *)lua_touserdata(L, 1);
    int argc = a->argc;
    char **argv = a->argv;
    const char *prog = argv[0] ? argv[0] : "nibble";
    g_L = L;
    lua_gc(L, LUA_GCSTOP, 0);
    luaL_openlibs(L);
    lua_gc(L, LUA_GCRESTART, -1);
    set_paths(L);
    nbh_signals_prompt();

    if (argc < 2) {
        if (load_nibble(L)) { a->exit = 1; return 0; }
        a->exit = nbh_repl(L);
        return 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-v") || !strcmp(cmd, "version")) {
        a->exit = print_version();
    } else if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        print_help(L);
        a->exit = 0;
    } else if (!strcmp(cmd, "-e")) {
        if (argc < 3) { fprintf(stderr, "nibble: -e needs an argument (see nibble --help)\n"); a->exit = 1; return 0; }
        if (load_nibble(L)) { a->exit = 1; return 0; }
        int s = luaL_loadbuffer(L, argv[2], strlen(argv[2]), "=(command line)");
        a->exit = run_chunk(L, s, prog, "-e", argv + 3, argc - 3, 0);
    } else if (!strcmp(cmd, "run")) {
        if (argc < 3 || !strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) {
            /* the usage text lives with the other commands' (lua/nibble/cli/run.lua) */
            int code = run_cli(L, "run", argv + 2, argc - 2);
            a->exit = code >= 0 ? code : 1;
            return 0;
        }
        if (load_nibble(L)) { a->exit = 1; return 0; }
        const char *file = argv[2];
        int s = luaL_loadfile(L, strcmp(file, "-") ? file : NULL);
        a->exit = run_chunk(L, s, prog, file, argv + 3, argc - 3, 1);
    } else if (cmd[0] == '-') {
        fprintf(stderr, "nibble: unknown option '%s' (see nibble --help)\n", cmd);
        a->exit = 1;
    } else {
        int code = run_cli(L, cmd, argv + 2, argc - 2);
        if (code >= 0) {
            a->exit = code;
        } else if (file_exists(cmd)) {
            if (load_nibble(L)) { a->exit = 1; return 0; }
            int s = luaL_loadfile(L, cmd);
            a->exit = run_chunk(L, s, prog, cmd, argv + 2, argc - 2, 1);
        } else {
            fprintf(stderr, "nibble: unknown command or file '%s' (see nibble --help)\n", cmd);
            a->exit = 1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    /* os.exit(code, true) (nibble.cli.program's refusals) closes the Lua state and exits without
     * returning here: the default context is released then too */
    atexit(nbh_release_ctx);
    /* A file-size limit (ulimit -f) makes a write fail with EFBIG, which every writer reports as a
     * named I/O error (the metrics JSONL, run-settings.json, redirected output), not death by SIGXFSZ. */
    signal(SIGXFSZ, SIG_IGN);
    lua_State *L = luaL_newstate();
    if (!L) {
        fprintf(stderr, "nibble: cannot create the Lua state: not enough memory\n");
        return 1;
    }
    pmain_args a = { argc, argv, 0 };
    int status = lua_cpcall(L, pmain, &a);
    if (status) {
        nbh_report(L);
        a.exit = 1;
    }
    fflush(stdout);
    lua_close(L);   /* finalizers release tensors (and their references to the context) first */
    nbh_release_ctx();
    return a.exit;
}
