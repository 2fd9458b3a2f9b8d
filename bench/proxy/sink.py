#!/usr/bin/env python3
"""A debug copy that keeps up at almost no CPU cost: accepts connections and
discards what they send.  Isolates the proxy's own duplication cost from the
CPU a real second redis takes on the same cores.  usage: sink.py PORT"""
import selectors
import socket
import sys

sel = selectors.DefaultSelector()
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", int(sys.argv[1])))
srv.listen(1024)
srv.setblocking(False)
sel.register(srv, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        if key.fileobj is srv:
            try:
                conn, _ = srv.accept()
            except BlockingIOError:
                continue
            conn.setblocking(False)
            sel.register(conn, selectors.EVENT_READ)
            continue
        try:
            data = key.fileobj.recv(1 << 20)
        except (BlockingIOError, ConnectionError):
            data = b"" if not isinstance(sys.exc_info()[1], BlockingIOError) else None
        if data == b"":
            sel.unregister(key.fileobj)
            key.fileobj.close()
