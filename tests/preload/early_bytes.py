"""Clients whose first bytes come before the server uses the connection
(docs/preload.md, "Early bytes"): early_bytes.py ROLE PORT [ARGS]. Every
wait is bounded; a failure exits non-zero with the reason."""
import hashlib
import http.server
import os
import socket
import sys
import time

role, port = sys.argv[1], int(sys.argv[2])


def listener():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def check_page(i, started, body, want):
    took = time.time() - started
    print(f"request {i}: {len(body)} bytes in {took:.3f} s", flush=True)
    if body != want:
        sys.exit(f"request {i}: the page differs")
    if took > 1.0:
        sys.exit(f"request {i} took {took:.3f} s (a stall)")


def content_length(head):
    return [int(l.split(b":")[1]) for l in head.split(b"\r\n")
            if l.lower().startswith(b"content-length:")][0]


def recv_all(c):
    out = bytearray()
    while True:
        b = c.recv(65536)
        if not b:
            return bytes(out)
        out += b


if role == "keepalive-server":
    # Iterative HTTP/1.1: it takes the next connection only once the
    # client has ended the previous one.
    class H(http.server.SimpleHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

    os.chdir(sys.argv[3])
    srv = http.server.HTTPServer(("127.0.0.1", port), H)
    srv.timeout = 30
    for _ in range(int(sys.argv[4])):
        srv.handle_request()
elif role == "keepalive-client":
    # Each request goes on a new connection while the previous one is still
    # open; the previous one ends when its file object goes.
    want = open(sys.argv[3], "rb").read()
    f = None
    for i in range(int(sys.argv[4])):
        t = time.time()
        s = socket.create_connection(("127.0.0.1", port), timeout=20)
        s.sendall(b"GET /page HTTP/1.1\r\nHost: x\r\n\r\n")
        f = s.makefile("rb")
        s.close()
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            b = f.read(1)
            if not b:
                sys.exit(f"request {i}: the connection ended in the header")
            head += b
        check_page(i, t, f.read(content_length(head)), want)
    f.close()
elif role == "asyncio-client":
    # The same on an event loop (epoll): the loop registers each new
    # connection before it writes, and closes the previous one only after.
    import asyncio

    async def main():
        want = open(sys.argv[3], "rb").read()
        prev = None
        for i in range(int(sys.argv[4])):
            t = time.time()
            r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 20)
            w.write(b"GET /page HTTP/1.1\r\nHost: x\r\n\r\n")
            await w.drain()
            if prev is not None:
                prev.close()
            head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 20)
            body = await asyncio.wait_for(r.readexactly(content_length(head)), 20)
            check_page(i, t, body, want)
            prev = w
        prev.close()

    asyncio.run(main())
elif role == "digest-server":
    # Busy when the client's first bytes come; then reads to the end and
    # answers with their digest.
    c, _ = listener().accept()
    time.sleep(0.3)
    c.sendall(hashlib.sha256(recv_all(c)).hexdigest().encode())
    c.close()
elif role == "digest-client":
    c = socket.create_connection(("127.0.0.1", port), timeout=20)
    data = os.urandom(3 * 8000 + 500_000)
    t = time.time()
    for i in range(3):
        c.sendall(data[i * 8000:(i + 1) * 8000])
    early = time.time() - t
    c.sendall(data[24000:])
    c.shutdown(socket.SHUT_WR)
    got = recv_all(c).decode()
    print(f"first 24000 bytes sent in {early:.3f} s; digest {got}", flush=True)
    if got != hashlib.sha256(data).hexdigest():
        sys.exit("the server's digest differs: bytes lost or out of order")
    if early > 0.1:
        sys.exit(f"the first sends waited {early:.3f} s for the server")
elif role == "quiet-server":
    c, _ = listener().accept()
    time.sleep(0.5)
    t = time.time()
    line = c.recv(100)
    took = time.time() - t
    print(f"read {line!r} after {took:.3f} s", flush=True)
    if line != b"hello\n":
        sys.exit("wrong bytes")
    if took > 1.0:
        sys.exit(f"the read waited {took:.3f} s for a client in no call")
elif role == "quiet-client":
    # Writes, then makes no call on the connection for a while.
    c = socket.create_connection(("127.0.0.1", port), timeout=20)
    t = time.time()
    c.sendall(b"hello\n")
    took = time.time() - t
    print(f"sent in {took:.3f} s", flush=True)
    time.sleep(float(sys.argv[3]))
    c.close()
    if took > 0.1:
        sys.exit(f"the send waited {took:.3f} s for the server")
else:
    sys.exit("unknown role " + role)
