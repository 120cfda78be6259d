"""A non-blocking connection used, then shared by fork: the child's copy
must stay non-blocking (fork shares the file's O_NONBLOCK), whatever carries
it there. nonblock_fork.py ROLE PORT. Every wait is bounded."""
import fcntl
import os
import select
import signal
import socket
import sys

role, port = sys.argv[1], int(sys.argv[2])


def nonblocking(s):
    return bool(fcntl.fcntl(s, fcntl.F_GETFL) & os.O_NONBLOCK)


if role == "server":
    # Echoes each byte it reads, until the client ends.
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    c, _ = s.accept()
    c.settimeout(20)
    while b := c.recv(10):
        c.sendall(b)
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
