/*
 * The checkpoint hook: how `iprobe debug --capture` learns, while CRIU holds
 * production frozen, exactly which client bytes the checkpoint includes.
 *
 * CRIU runs its post-dump action script (`--action-script`) after the dump,
 * production still frozen.  iprobe's script (libexec/iprobe/iprobe-criu-hook)
 * connects to the Unix socket named by the environment variable below (the
 * mirror's --hook-socket), sends the one command line below, and waits for
 * the mirror's one-line answer: by then the mirror has read how far
 * production had read each connection (its sockets, through sock_diag).
 * The script always exits 0: a hook that fails must not fail the dump.
 */
#ifndef IPROBE_CHECKPOINT_HOOK_H
#define IPROBE_CHECKPOINT_HOOK_H

#define IPROBE_CHECKPOINT_HOOK_SOCKET_ENV "IPROBE_CHECKPOINT_SOCKET"
/* A MirrorCommand (proxy/include/iprobe/proxy/mirror.h), as its JSON line. */
#define IPROBE_CHECKPOINT_HOOK_COMMAND "{\"command\":\"checkpoint\"}\n"
/* How long production may be held frozen waiting for the mirror. */
#define IPROBE_CHECKPOINT_HOOK_TIMEOUT_MS 1000

#endif
