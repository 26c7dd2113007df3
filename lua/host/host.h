/* The nibble host program: shared declarations of main.c (commands, protected calls, Ctrl-C),
 * repl.c (the interactive loop) and hostlib.c (the `nibble.host` C module the Lua side uses to
 * reach the host: the default context the Ctrl-C handler interrupts, directory listing). */
#ifndef NIBBLE_HOST_H
#define NIBBLE_HOST_H

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>
#include <signal.h>

#include "nibble/nibble.h"

/* The default context, created on first use by Lua (`nibble.ctx`); NULL until then. */
nb_ctx *nbh_default_ctx(lua_State *L);
nb_ctx *nbh_ctx_if_created(void);
void nbh_release_ctx(void);

/* Call the function below `narg` arguments with a traceback message handler while SIGINT
 * interrupts it (Lua hook + nb_ctx_interrupt). Returns the lua_pcall status; on error the
 * message (with traceback) is on the stack. *interrupted is set when a Ctrl-C caused it. */
int nbh_docall(lua_State *L, int narg, int nres, int *interrupted);
/* Set by the REPL: an error's message is printed without the traceback (NIBBLE_DEBUG=1 keeps it). */
extern int nbh_brief_errors;
/* Print the error on top of the stack to stderr (prefixed "nibble: ") and pop it. */
void nbh_report(lua_State *L);

/* SIGINT while waiting for input: sets nbh_prompt_interrupt (read() then fails with EINTR). */
extern volatile sig_atomic_t nbh_prompt_interrupt;
void nbh_signals_prompt(void);
void nbh_signals_default(void);

/* Whether the function at stack index idx was registered with nibble.host.critical(fn). */
int nbh_is_critical(lua_State *L, int idx);

int nbh_repl(lua_State *L);
int luaopen_nibble_host(lua_State *L);

#endif
