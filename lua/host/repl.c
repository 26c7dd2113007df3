/* The interactive loop of `nibble` with no arguments. Lines are read with libedit (history in
 * ~/.nibble_history) on a terminal, or plainly from a pipe (no prompts, for scripted use and tests).
 * Each chunk is tried as `return <chunk>` first so expressions print their values (through
 * nibble.repl.show, which prints tensors by shape and a few values); a chunk that ends early
 * ('<eof>' syntax errors) continues on the next line. Ctrl-C stops the running chunk, not the REPL.
 * An error prints its message without a traceback (NIBBLE_DEBUG=1 adds it). Tab completes names
 * (globals, fields after ".", methods after ":") through nibble.repl.complete. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <editline/readline.h>
#include <luajit.h>

#include "host.h"

enum { HISTORY_MAX = 1000 };

typedef struct {
    int tty;
    char history[4096];
} repl_state;

/* Read one line without its newline (malloc'd), or NULL at end of input. Sets *intr when a
 * Ctrl-C arrived while waiting, or since the last line was read (a busy machine may deliver it
 * between two lines): the chunk typed so far is then dropped. */
static char *read_line(repl_state *rs, const char *prompt, int *intr) {
    *intr = 0;
    if (nbh_prompt_interrupt) {
        nbh_prompt_interrupt = 0;
        *intr = 1;
        return NULL;
    }
    if (rs->tty) {
        char *line = readline(prompt);
        if (nbh_prompt_interrupt) {
            *intr = 1;
            nbh_prompt_interrupt = 0;
            free(line);
            return NULL;
        }
        return line;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    for (;;) {
        errno = 0;
        n = getline(&line, &cap, stdin);
        if (n >= 0 || errno != EINTR) break;
        clearerr(stdin);
        if (nbh_prompt_interrupt) {
            *intr = 1;
            nbh_prompt_interrupt = 0;
            free(line);
            return NULL;
        }
    }
    if (n < 0) {
        free(line);
        return NULL;
    }
    if (n > 0 && line[n - 1] == '\n') line[--n] = 0;
    if (n > 0 && line[n - 1] == '\r') line[--n] = 0;
    return line;
}

/* ---- Tab completion ------------------------------------------------------------------------------ */

static lua_State *g_complete_L;
static int g_complete_ref = LUA_NOREF;   /* nibble.repl.complete */
static char **g_cands;
static int g_ncands, g_next;

static void free_cands(void) {
    for (int i = 0; i < g_ncands; i++) free(g_cands[i]);
    free(g_cands);
    g_cands = NULL;
    g_ncands = g_next = 0;
}

/* readline's generator: state 0 asks Lua for every completion of text, then they are handed out one
 * per call (readline frees each). Lua runs protected and without the Ctrl-C hook (the prompt's
 * handler only sets a flag), so completing can neither raise nor be cut in half. */
static char *complete_entry(const char *text, int state) {
    if (state == 0) {
        free_cands();
        lua_State *L = g_complete_L;
        int top = lua_gettop(L);
        lua_rawgeti(L, LUA_REGISTRYINDEX, g_complete_ref);
        lua_pushstring(L, text);
        if (lua_pcall(L, 1, 1, 0) == 0 && lua_istable(L, -1)) {
            int n = (int)lua_objlen(L, -1);
            g_cands = calloc((size_t)n + 1, sizeof *g_cands);
            for (int i = 1; g_cands && i <= n; i++) {
                lua_rawgeti(L, -1, i);
                const char *c = lua_tostring(L, -1);
                if (c && (g_cands[g_ncands] = strdup(c)) != NULL) g_ncands++;
                lua_pop(L, 1);
            }
        }
        lua_settop(L, top);
    }
    if (g_next < g_ncands) return strdup(g_cands[g_next++]);
    return NULL;
}

static char **attempt_completion(const char *text, int start, int end) {
    (void)start;
    (void)end;
    rl_attempted_completion_over = 1;   /* names only: no file names when none matches */
    return rl_completion_matches(text, complete_entry);
}

/* "." and ":" are part of a word (nibble.zeros, t:reshape); what separates Lua expressions is not. */
static char g_word_breaks[] = " \t\n\"\\'`@$><=;|&{}()[],+-*/%^~#";

static void setup_completion(lua_State *L) {
    lua_getglobal(L, "require");
    lua_pushstring(L, "nibble.repl");
    if (lua_pcall(L, 1, 1, 0) != 0) { lua_pop(L, 1); return; }
    lua_getfield(L, -1, "complete");
    if (lua_isfunction(L, -1)) {
        g_complete_ref = luaL_ref(L, LUA_REGISTRYINDEX);
        g_complete_L = L;
        rl_attempted_completion_function = attempt_completion;
        rl_basic_word_break_characters = g_word_breaks;
        rl_completer_word_break_characters = g_word_breaks;
        rl_completion_append_character = '\0';
    } else {
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
}

/* A syntax error that only says the chunk ended too early. */
static int incomplete(lua_State *L, int status) {
    if (status != LUA_ERRSYNTAX) return 0;
    size_t len;
    const char *msg = lua_tolstring(L, -1, &len);
    const char *tail = "'<eof>'";
    size_t tl = strlen(tail);
    return msg && len >= tl && strcmp(msg + len - tl, tail) == 0;
}

/* Compile the next chunk onto the stack. Returns the load status (error message on the stack),
 * -1 at end of input, -2 when Ctrl-C discarded the input. */
static int load_chunk(lua_State *L, repl_state *rs) {
    int intr;
    char *line = read_line(rs, "> ", &intr);
    if (!line) return intr ? -2 : -1;
    size_t cap = strlen(line) + 64, len = 0;
    char *buf = malloc(cap);
    if (!buf) { free(line); return luaL_error(L, "out of memory"); }
    const char *first = line;
    if (first[0] == '=') {   /* Lua 5.1's `=expr` */
        len = (size_t)snprintf(buf, cap, "return %s", first + 1);
    } else {
        len = strlen(first);
        memcpy(buf, first, len + 1);
    }
    free(line);
    int status;
    for (;;) {
        /* Expressions first, so `x`, `t.shape` and `f()` print their values. */
        size_t rlen = len + 8;
        char *ret = malloc(rlen + 1);
        if (!ret) { free(buf); return luaL_error(L, "out of memory"); }
        memcpy(ret, "return ", 7);
        memcpy(ret + 7, buf, len + 1);
        status = luaL_loadbuffer(L, ret, len + 7, "=stdin");
        free(ret);
        if (status == 0) break;
        lua_pop(L, 1);
        status = luaL_loadbuffer(L, buf, len, "=stdin");
        if (!incomplete(L, status)) break;
        lua_pop(L, 1);
        char *more = read_line(rs, ">> ", &intr);
        if (!more) {
            if (intr) { free(buf); return -2; }
            /* end of input inside a chunk: report why it is incomplete */
            status = luaL_loadbuffer(L, buf, len, "=stdin");
            free(buf);
            return status;
        }
        size_t ml = strlen(more);
        if (len + ml + 2 > cap) {
            cap = (len + ml + 2) * 2;
            char *nb = realloc(buf, cap);
            if (!nb) { free(buf); free(more); return luaL_error(L, "out of memory"); }
            buf = nb;
        }
        buf[len++] = '\n';
        memcpy(buf + len, more, ml + 1);
        len += ml;
        free(more);
    }
    if (rs->tty && len > 0) add_history(buf);
    free(buf);
    return status;
}

/* Print the n results on top of the stack with nibble.repl.show (global print as a fallback). */
static void show_results(lua_State *L, int n, int show_ref) {
    if (n <= 0) return;
    if (show_ref != LUA_NOREF) lua_rawgeti(L, LUA_REGISTRYINDEX, show_ref);
    else lua_getglobal(L, "print");
    lua_insert(L, -(n + 1));
    if (nbh_docall(L, n, 0, NULL) != 0) nbh_report(L);
}

int nbh_repl(lua_State *L) {
    repl_state rs;
    memset(&rs, 0, sizeof rs);
    rs.tty = isatty(STDIN_FILENO);
    if (rs.tty) {
        printf("nibble %s (%s). Try nibble.load(path), nibble.inspect(path), nibble.tensor{{1, 2}, {3, 4}}.\n"
               "Ctrl-C stops a running chunk, Ctrl-D leaves.\n",
               nb_version(), LUAJIT_VERSION);
        fflush(stdout);
        rl_readline_name = "nibble";
        setup_completion(L);
        using_history();
        stifle_history(HISTORY_MAX);
        const char *home = getenv("HOME");
        if (home && *home) {
            snprintf(rs.history, sizeof rs.history, "%s/.nibble_history", home);
            read_history(rs.history);
        }
    }
    /* show = require("nibble.repl").show */
    int show_ref = LUA_NOREF;
    lua_getglobal(L, "require");
    lua_pushstring(L, "nibble.repl");
    if (nbh_docall(L, 1, 1, NULL) == 0) {
        lua_getfield(L, -1, "show");
        if (lua_isfunction(L, -1)) show_ref = luaL_ref(L, LUA_REGISTRYINDEX);
        else lua_pop(L, 1);
        lua_pop(L, 1);
    } else {
        nbh_report(L);
    }

    nbh_brief_errors = 1;
    nbh_signals_prompt();
    for (;;) {
        int base = lua_gettop(L);
        int status = load_chunk(L, &rs);
        if (status == -1) break;
        if (status == -2) {
            if (rs.tty) fputs("^C\n", stdout);
            fflush(stdout);
            continue;
        }
        if (status == 0) {
            int interrupted = 0;
            status = nbh_docall(L, 0, LUA_MULTRET, &interrupted);
            if (status == 0) show_results(L, lua_gettop(L) - base, show_ref);
        }
        if (status != 0) nbh_report(L);
        lua_settop(L, base);
        fflush(stdout);
    }
    if (rs.tty) {
        fputc('\n', stdout);
        if (rs.history[0]) write_history(rs.history);
    }
    fflush(stdout);
    if (show_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, show_ref);
    if (g_complete_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, g_complete_ref);
    g_complete_ref = LUA_NOREF;
    free_cands();
    nbh_brief_errors = 0;
    return 0;
}
