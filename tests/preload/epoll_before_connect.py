"""Event loops that register a socket with epoll before connect() (nginx's
upstream connections): epoll_before_connect.py ROLE PORT [ARGS]. The
registration must report the upgraded stream. Every wait is bounded; a
failure exits non-zero with the reason."""
import errno
import hashlib
import select
import socket
import sys
import time

role, port = sys.argv[1], int(sys.argv[2])
CHUNK, CHUNKS = 100_000, 3


def payload(i):
    return bytes((i * 7 + k) % 251 for k in range(CHUNK))


if role == "server":
    # Answers each connection's request line in three chunks, 30 ms apart,
    # and keeps the connection open until the client ends it: no end of
    # stream on the kernel socket wakes a registration left there.
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    for _ in range(int(sys.argv[3])):
        c, _ = s.accept()
        c.settimeout(20)
        req = b""
        while not req.endswith(b"\n"):
            b = c.recv(100)
            if not b:
                sys.exit("server: the client ended before its request")
            req += b
        for i in range(CHUNKS):
            c.sendall(payload(i))
            time.sleep(0.03)
        if c.recv(1) != b"":
            sys.exit("server: bytes after the request")
        c.close()
elif role == "client":
    # MODE: et (edge-triggered, reads until a short read, as nginx does:
    # a short read means the socket is drained), lt (level-triggered), or
    # two-sets (edge-triggered in two sets, both must report).
    mode = sys.argv[3]
    want = hashlib.sha256(b"".join(payload(i) for i in range(CHUNKS))).hexdigest()
    for n in range(int(sys.argv[4])):
        c = socket.socket()
        c.setblocking(False)
        flags = select.EPOLLIN | select.EPOLLOUT | select.EPOLLRDHUP
        if mode != "lt":
            flags |= select.EPOLLET
        sets = [select.epoll() for _ in range(2 if mode == "two-sets" else 1)]
        for ep in sets:
            ep.register(c.fileno(), flags)
        err = c.connect_ex(("127.0.0.1", port))
        if err not in (0, errno.EINPROGRESS):
            sys.exit(f"client: connect: {errno.errorcode.get(err, err)}")
        got, sent, reported = bytearray(), False, [0] * len(sets)
        deadline = time.monotonic() + 5
        while len(got) < CHUNK * CHUNKS:
            left = deadline - time.monotonic()
            if left <= 0:
                sys.exit(f"client {n} ({mode}): stalled at {len(got)} bytes "
                         f"(events per set: {reported})")
            events = []
            for k, ep in enumerate(sets):
                evs = ep.poll(min(left, 0.05) if len(sets) > 1 else left)
                reported[k] += sum(1 for _, e in evs if e & select.EPOLLIN)
                events += evs
            for _, ev in events:
                if ev & select.EPOLLOUT and not sent:
                    c.send(b"GET\n")
                    sent = True
                if ev & select.EPOLLIN:
                    while True:
                        try:
                            b = c.recv(4096)
                        except BlockingIOError:
                            break
                        if not b:
                            sys.exit(f"client {n}: end of stream at {len(got)} bytes")
                        got += b
                        if len(b) < 4096 or mode == "lt":
                            break
        if hashlib.sha256(got).hexdigest() != want:
            sys.exit(f"client {n} ({mode}): the bytes differ")
        if mode == "two-sets" and 0 in reported:
            sys.exit(f"client {n}: a set never reported the stream: {reported}")
        c.close()
        for ep in sets:
            ep.close()
        print(f"client {n} ({mode}): {len(got)} bytes verified", flush=True)
else:
    sys.exit(f"unknown role {role}")
