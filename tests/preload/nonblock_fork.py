"""A connection shared by fork keeps one set of file status flags
(O_NONBLOCK) for parent and child, whatever carries it in each:
nonblock_fork.py ROLE PORT. Clients: "client" (non-blocking, used, then
forked: the child's copy must stay non-blocking); "client-blocking" (a
non-blocking connect, forked before any use; the child makes its copy
blocking and its read must wait for the bytes, not fail with EAGAIN);
"client-forks" (20 connections, each followed by 50 ms of forked
children that close their copy at once, while the parent's library may be
settling the connection: none may hang). Every wait is bounded."""
import fcntl
import os
import select
import signal
import socket
import sys
import time

role, port = sys.argv[1], int(sys.argv[2])


def nonblocking(s):
    return bool(fcntl.fcntl(s, fcntl.F_GETFL) & os.O_NONBLOCK)


if role == "server":
    # Echoes each byte it reads, until the client ends; COUNT connections
    # one after another (default 1).
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    for _ in range(int(sys.argv[3]) if len(sys.argv) > 3 else 1):
        c, _ = s.accept()
        c.settimeout(20)
        while b := c.recv(10):
            c.sendall(b)
        c.close()
elif role == "server-hello":
    # Takes the connection up at once, says hello 0.5 s later, then waits
    # for the client's end.
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    c, _ = s.accept()
    c.settimeout(20)
    select.select([c], [], [], 0.5)
    c.sendall(b"hello")
    c.recv(10)
elif role == "client-blocking":
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port))
    pid = os.fork()
    if pid == 0:
        signal.alarm(5)
        time.sleep(0.2)
        flags = fcntl.fcntl(s, fcntl.F_GETFL)
        fcntl.fcntl(s, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        try:
            got = os.read(s.fileno(), 10)
        except BlockingIOError:
            print("child: EAGAIN from a copy it made blocking", flush=True)
            os._exit(1)
        os._exit(0 if got == b"hello" else 1)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        sys.exit(f"the child failed (status {status})")
    print("OK: the child's blocking read waited for the bytes", flush=True)
elif role == "client-forks":
    # 20 connections; after each connect, children forked for 50 ms (the
    # parent's answerer settles the connection meanwhile), each closing its
    # copy at once.
    children, hung = 0, 0
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", port))
        pids = []
        start = time.monotonic()
        while time.monotonic() - start < 0.05:
            pid = os.fork()
            if pid == 0:
                signal.alarm(3)  # a close that never returns is the failure
                s.close()
                os._exit(0)
            pids.append(pid)
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            children += 1
            hung += os.WIFSIGNALED(status)
        s.sendall(b"x")
        if s.recv(1) != b"x":
            sys.exit("no echo")
        s.close()
    if hung:
        sys.exit(f"{hung} of {children} children hung in close()")
    print(f"OK: {children} children closed their copies", flush=True)
elif role == "client":
    s = socket.create_connection(("127.0.0.1", port))
    s.setblocking(False)
    s.send(b"a")
    select.select([s], [], [], 5)
    if s.recv(10) != b"a":
        sys.exit("parent: no echo")
    pid = os.fork()
    if pid == 0:
        signal.alarm(5)  # a recv that blocks is the failure
        try:
            if not nonblocking(s):
                print("child: the copy is blocking", flush=True)
                os._exit(1)
            try:
                s.recv(10)
                print("child: recv returned data nobody sent", flush=True)
                os._exit(1)
            except BlockingIOError:
                pass
            s.send(b"b")
            select.select([s], [], [], 5)
            if s.recv(10) != b"b":
                print("child: no echo", flush=True)
                os._exit(1)
            os._exit(0)
        except Exception as e:  # noqa: BLE001 - any failure is the child's exit status
            print(f"child: {e!r}", flush=True)
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        sys.exit(f"the child failed (status {status})")
    print("OK: the child's copy stayed non-blocking", flush=True)
else:
    sys.exit(f"unknown role {role}")
