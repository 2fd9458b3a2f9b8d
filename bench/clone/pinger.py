#!/usr/bin/env python3
"""A client of redis that sends PING every millisecond on one connection
until SIGTERM, then prints the longest wait for a reply (ms) and how many
replies came: the freeze as a client feels it (bench/clone/pinger.sh)."""
import signal
import socket
import sys
import time

host, port = sys.argv[1], int(sys.argv[2])
s = socket.create_connection((host, port), timeout=30)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
stop = False


def on_term(*_):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)
worst, replies = 0.0, 0
print("ready", flush=True)
while not stop:
    t = time.monotonic()
    s.sendall(b"PING\r\n")
    got = b""
    while not got.endswith(b"\r\n"):
        chunk = s.recv(64)
        if not chunk:
            sys.exit("connection closed by the server")
        got += chunk
    worst = max(worst, time.monotonic() - t)
    replies += 1
    time.sleep(0.001)
print("%.1f %d" % (worst * 1000, replies), flush=True)
