/* `nibble.host`: the small C module the host preloads for the Lua side. It owns the default
 * nb_ctx (so the SIGINT handler can interrupt long C loops through nb_ctx_interrupt) and offers
 * what plain Lua lacks: directory listing (for `nibble --help`) and isatty. */
#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include <luajit.h>

#include "host.h"

static nb_ctx *volatile g_ctx;

nb_ctx *nbh_ctx_if_created(void) { return g_ctx; }

nb_ctx *nbh_default_ctx(lua_State *L) {
    if (!g_ctx) {
        nb_ctx *c = NULL;
        nb_status s = nb_ctx_new(0, &c);   /* 0: NIBBLE_THREADS or every online CPU */
        if (s != NB_OK)
            luaL_error(L, "%s: cannot create the default context%s%s", nb_status_name(s), *nb_blas_error() ? ": " : "",
                       nb_blas_error());
        g_ctx = c;
    }
    return g_ctx;
}

void nbh_release_ctx(void) {
    nb_ctx *c = g_ctx;
    g_ctx = NULL;
    if (c) nb_ctx_release(c);
}

static int l_default_ctx(lua_State *L) {
    lua_pushlightuserdata(L, nbh_default_ctx(L));
    return 1;
}

static int l_listdir(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    DIR *d = opendir(path);
    if (!d) {
        lua_pushnil(L);
        lua_pushfstring(L, "%s: %s", path, strerror(errno));
        return 2;
    }
    lua_newtable(L);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        lua_pushstring(L, e->d_name);
        lua_rawseti(L, -2, ++n);
    }
    closedir(d);
    return 1;
}

/* registry[&critical_key] = setmetatable({}, {__mode = "k"}): function -> true */
static const char critical_key = 0;

static void push_critical_table(lua_State *L) {
    lua_pushlightuserdata(L, (void *)&critical_key);
    lua_rawget(L, LUA_REGISTRYINDEX);
    if (lua_istable(L, -1)) return;
    lua_pop(L, 1);
    lua_newtable(L);
    lua_newtable(L);
    lua_pushstring(L, "k");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    lua_pushlightuserdata(L, (void *)&critical_key);
    lua_pushvalue(L, -2);
    lua_rawset(L, LUA_REGISTRYINDEX);
}

int nbh_is_critical(lua_State *L, int idx) {
    if (!lua_isfunction(L, idx)) return 0;
    idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
    lua_pushlightuserdata(L, (void *)&critical_key);
    lua_rawget(L, LUA_REGISTRYINDEX);
    int r = 0;
    if (lua_istable(L, -1)) {
        lua_pushvalue(L, idx);
        lua_rawget(L, -2);
        r = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return r;
}

/* critical(fn): Ctrl-C waits until fn returns (for functions that move ownership of C objects). */
static int l_critical(lua_State *L) {
    luaL_checktype(L, 1, LUA_TFUNCTION);
    push_critical_table(L);
    lua_pushvalue(L, 1);
    lua_pushboolean(L, 1);
    lua_rawset(L, -3);
    lua_pop(L, 1);
    lua_settop(L, 1);
    return 1;
}

static int l_isatty(lua_State *L) {
    lua_pushboolean(L, isatty((int)luaL_optinteger(L, 1, 0)));
    return 1;
}

int luaopen_nibble_host(lua_State *L) {
    static const luaL_Reg fns[] = {
        { "default_ctx", l_default_ctx },
        { "listdir", l_listdir },
        { "isatty", l_isatty },
        { "critical", l_critical },
        { NULL, NULL },
    };
    lua_newtable(L);
    luaL_register(L, NULL, fns);
    lua_pushstring(L, nb_version());
    lua_setfield(L, -2, "version");
    lua_pushstring(L, LUAJIT_VERSION);
    lua_setfield(L, -2, "luajit");
    return 1;
}
