#!/usr/bin/env python3
"""One process connected to its own listener (tests/preload/self_connect_test.sh).

    self_connect.py SHAPE

Shapes (each end's first use would wait for the other's, which this very
thread makes next):
  client-first   accept, then the client writes first (a request)
  server-first   accept, then the server writes first (a banner)
  nonblocking    non-blocking sockets in one select() loop
  thread         a server thread blocked in accept(), the client in main
  thread-race    30 connections: a server thread that reads as soon as it
                 has accepted, while the main thread writes as soon as it
                 has connected (both ends settled at once, each thread
                 finding the other's end); every other time the server
                 thread is away from accept() for 5 ms
  many           20 connections opened, then all accepted, then used
  write-before-accept
                 the client writes before the connection is accepted (it
                 must stay on kernel TCP: the accept comes from this thread)

Every byte is checked (a 256 KiB pattern each way); each first use is
timed, and the slowest is printed: a wait for the rendezvous budget would
show as seconds. Prints "OK SHAPE conns=N slowest_first_use_ms=X".
"""
import hashlib
import select
import socket
import sys
import threading
import time

SIZE = 256 * 1024


def pattern(tag, n=SIZE):
    out = bytearray()
    block = 0
    while len(out) < n:
        out += hashlib.sha256(f"{tag}:{block}".encode()).digest()
        block += 1
    return bytes(out[:n])


def recv_exact(s, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(min(65536, n - len(buf)))
        if not chunk:
            raise RuntimeError(f"end of stream after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def listener():
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen(64)
    return l


slowest = 0.0


def timed(fn, *args):
    global slowest
    t = time.monotonic()
    r = fn(*args)
    slowest = max(slowest, time.monotonic() - t)
    return r


def exchange(c, s, tag, client_first=True):
    """Client sends its pattern, server echoes it back and sends its own."""
    up, down = pattern(f"up{tag}"), pattern(f"down{tag}")
    if client_first:
        timed(c.sendall, up[:1])
        # The first use of the server end: a 1-byte read.
        first = timed(recv_exact, s, 1)
    else:
        timed(s.sendall, down[:1])
        first = timed(recv_exact, c, 1)
    # Both ends are settled now: bulk both ways from two threads (a pattern
    # larger than a socket buffer would block one thread writing both).
    got = {}

    def server_side():
        if client_first:
            got["up"] = first + recv_exact(s, SIZE - 1)
            s.sendall(down)
        else:
            s.sendall(down[1:])
            got["up"] = recv_exact(s, SIZE)

    t = threading.Thread(target=server_side)
    t.start()
    if client_first:
        c.sendall(up[1:])
        got["down"] = recv_exact(c, SIZE)
    else:
        c.sendall(up)
        got["down"] = first + recv_exact(c, SIZE - 1)
    t.join()
    if got["up"] != up or got["down"] != down:
        raise RuntimeError(f"connection {tag}: bytes differ")


def blocking(client_first):
    l = listener()
    c = socket.create_connection(l.getsockname())
    s, _ = l.accept()
    exchange(c, s, 0, client_first)
    return 1


def nonblocking():
    l = listener()
    c = socket.socket()
    c.setblocking(False)
    try:
        c.connect(l.getsockname())
    except BlockingIOError:
        pass
    s, _ = l.accept()
    s.setblocking(False)
    up, down = pattern("nb-up"), pattern("nb-down")
    sent_up = sent_down = 0
    got_up, got_down = bytearray(), bytearray()
    deadline = time.monotonic() + 20
    t0 = time.monotonic()
    first_done = None
    while (len(got_up) < SIZE or len(got_down) < SIZE) and time.monotonic() < deadline:
        r, w, _ = select.select([c, s], [x for x, left in ((c, sent_up < SIZE), (s, sent_down < SIZE)) if left], [], 1)
        if first_done is None and (r or w):
            first_done = time.monotonic() - t0
        for x in w:
            try:
                if x is c:
                    sent_up += c.send(up[sent_up:sent_up + 65536])
                else:
                    sent_down += s.send(down[sent_down:sent_down + 65536])
            except BlockingIOError:
                pass
        for x in r:
            try:
                data = x.recv(65536)
            except BlockingIOError:
                continue
            if not data:
                raise RuntimeError("end of stream")
            (got_down if x is c else got_up).extend(data)
    if bytes(got_up) != up or bytes(got_down) != down:
        raise RuntimeError("non-blocking: bytes differ or missing")
    global slowest
    slowest = max(slowest, first_done or 0)
    return 1


def threaded():
    l = listener()
    box = {}

    def serve():
        box["s"], _ = l.accept()

    t = threading.Thread(target=serve)
    t.start()
    c = socket.create_connection(l.getsockname())
    t.join()
    exchange(c, box["s"], 0, True)
    return 1


def thread_race(n=30):
    l = listener()
    errors = []

    def serve():
        try:
            for i in range(n):
                s, _ = l.accept()
                with s:
                    up = timed(recv_exact, s, 4096)  # the first use, at once
                    if up != pattern(f"race{i}", 4096):
                        raise RuntimeError(f"connection {i}: bytes differ")
                    s.sendall(up[::-1])
                if i % 2:
                    # Busy elsewhere when the next client comes: the client
                    # must wait for this thread, which accepted last.
                    time.sleep(0.005)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    t = threading.Thread(target=serve)
    t.start()
    for i in range(n):
        with socket.create_connection(l.getsockname()) as c:
            up = pattern(f"race{i}", 4096)
            timed(c.sendall, up)  # the first use, at once
            if recv_exact(c, 4096) != up[::-1]:
                raise RuntimeError(f"connection {i}: answer differs")
    t.join()
    if errors:
        raise errors[0]
    return n


def many(n=20):
    l = listener()
    clients = [socket.create_connection(l.getsockname()) for _ in range(n)]
    servers = [l.accept()[0] for _ in range(n)]
    # accept() order is the kernel's: pair the ends by port.
    by_port = {s.getpeername()[1]: s for s in servers}
    for i, c in enumerate(clients):
        exchange(c, by_port[c.getsockname()[1]], i, i % 2 == 0)
    return n


def write_before_accept():
    l = listener()
    c = socket.create_connection(l.getsockname())
    msg = pattern("early", 4096)
    timed(c.sendall, msg)  # the client's first use: nothing accepted it yet
    s, _ = l.accept()
    if recv_exact(s, len(msg)) != msg:
        raise RuntimeError("early bytes differ")
    exchange(c, s, 1, False)
    return 1


def main():
    shape = sys.argv[1]
    conns = {
        "client-first": lambda: blocking(True),
        "server-first": lambda: blocking(False),
        "nonblocking": nonblocking,
        "thread": threaded,
        "thread-race": thread_race,
        "many": many,
        "write-before-accept": write_before_accept,
    }[shape]()
    print(f"OK {shape} conns={conns} slowest_first_use_ms={slowest * 1000:.1f}")


if __name__ == "__main__":
    main()
