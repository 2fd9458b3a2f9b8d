/*
 * The checkpoint hook: how `iprobe debug --capture` learns, while CRIU holds
 * production frozen, exactly which client bytes the checkpoint includes.
 *
 * CRIU sends its "post-dump" notification over its RPC (criu swrk) after the
 * dump, production still frozen, and waits for the answer.  Before it
 * answers, the launcher (launcher/src/clone.cpp) connects to the Unix socket
 * the mirror listens on (its --hook-socket), sends the one command line
 * below, and waits for the mirror's one-line answer, at most the timeout
 * below: by then the mirror has read how far production had read each
 * connection (its sockets, through sock_diag).  The notification is always
 * answered with success: a hook that fails must not fail the dump.
 */
#ifndef IPROBE_CHECKPOINT_HOOK_H
#define IPROBE_CHECKPOINT_HOOK_H

/* A MirrorCommand (proxy/include/iprobe/proxy/mirror.h), as its JSON line. */
#define IPROBE_CHECKPOINT_HOOK_COMMAND "{\"command\":\"checkpoint\"}\n"
/* How long production may be held frozen waiting for the mirror. */
#define IPROBE_CHECKPOINT_HOOK_TIMEOUT_MS 1000

#endif
