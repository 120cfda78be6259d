"""A TCP server in one process shape (tests/preload/shapes_test.sh).

Each connection: the client sends a 4-byte length and that many bytes; the
server answers with the SHA-256 of what it read, a line naming which
process served it (SHAPE:PID), then the same bytes back. Which process reads
and writes the connection depends on the shape; every one must get every
byte, in order.
"""
import hashlib, os, signal, socket, struct, sys, time

shape, port_file, conns = sys.argv[1], sys.argv[2], int(sys.argv[3])
signal.alarm(60)


def exact(fd_or_sock, n):
    b = bytearray()
    while len(b) < n:
        d = fd_or_sock.recv(n - len(b)) if hasattr(fd_or_sock, "recv") else os.read(fd_or_sock, n - len(b))
        if not d:
            raise SystemExit("short read: %d of %d" % (len(b), n))
        b += d
    return bytes(b)


def serve(s, who, head=b""):
    n = struct.unpack("!I", head + exact(s, 4 - len(head)))[0]
    data = exact(s, n)
    s.sendall(hashlib.sha256(data).hexdigest().encode() + b" %s:%d\n" % (who.encode(), os.getpid()))
    s.sendall(data)


def serve_half(s, who, data, n):
    """The rest of a request whose first part another process read."""
    data += exact(s, n - len(data))
    s.sendall(hashlib.sha256(data).hexdigest().encode() + b" %s:%d\n" % (who.encode(), os.getpid()))
    s.sendall(data)


ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", 0))
ls.listen(64)
if shape == "scm-rights":
    # Workers started before the first accept, as socket-activated and
    # worker-handoff servers are: the listener hands each connection over.
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    worker = os.fork()
    if worker == 0:
        ls.close(); a.close()
        for _ in range(conns):
            _, fds, _, _ = socket.recv_fds(b, 16, 1)
            c = socket.socket(fileno=fds[0])
            serve(c, "worker")
            c.close()
        os._exit(0)
    b.close()
with open(port_file + ".tmp", "w") as f:
    f.write(str(ls.getsockname()[1]))
os.rename(port_file + ".tmp", port_file)

children = []
for i in range(conns):
    c, _ = ls.accept()
    if shape == "fork":  # the postmaster: the child serves, the parent closes
        pid = os.fork()
        if pid == 0:
            ls.close(); serve(c, "child"); c.close(); os._exit(0)
        c.close(); children.append(pid)
    elif shape == "double-fork":  # a daemonising child serves from a grandchild
        pid = os.fork()
        if pid == 0:
            ls.close()
            if os.fork() == 0:
                os.setsid(); serve(c, "grandchild"); c.close(); os._exit(0)
            os._exit(0)
        c.close(); os.waitpid(pid, 0)
    elif shape == "keep-copy":  # the parent keeps its copy open while the child serves
        pid = os.fork()
        if pid == 0:
            ls.close(); serve(c, "child"); c.close(); os._exit(0)
        os.waitpid(pid, 0)
        c.close()
    elif shape == "both-use":
        # Parent and child both use the connection, neither having used it
        # before the fork: the child's first use (an empty send) comes while
        # the parent's first read is still upgrading it (about 1 ms in), so
        # it must wait for the parent's claim and follow it; the child then
        # only writes (its line after the parent's answer) while the parent
        # reads and answers. The child closes last.
        r, w = os.pipe()
        r2, w2 = os.pipe()
        pid = os.fork()
        if pid == 0:
            ls.close(); os.close(w); os.close(r2)
            time.sleep(0.0005)
            c.send(b"")
            os.read(r, 1)
            c.sendall(b"child:%d\n" % os.getpid())
            os.write(w2, b"x")
            os.read(r, 1)  # the parent has closed its copy
            c.close(); os._exit(0)
        os.close(r); os.close(w2)
        serve(c, "parent")
        os.write(w, b"x")
        os.read(r2, 1)
        c.close()
        os.write(w, b"x"); os.close(w); os.close(r2)
        os.waitpid(pid, 0)
    elif shape.startswith("close-all-"):
        # A daemon that closes every descriptor it does not know of, once its
        # connection is up (adopted by its first read): closefrom, close_range,
        # or close() on every number up to the hard limit. The library's own
        # descriptors must survive.
        head = exact(c, 4)
        keep = max(ls.fileno(), c.fileno())
        import ctypes, resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if os.sysconf("SC_OPEN_MAX") != soft:
            raise SystemExit("sysconf(_SC_OPEN_MAX) %d, getrlimit %d" % (os.sysconf("SC_OPEN_MAX"), soft))
        if shape == "close-all-from":
            ctypes.CDLL(None).closefrom(keep + 1)
        elif shape == "close-all-range":
            os.closerange(keep + 1, 1 << 30)
        else:
            for fd in range(keep + 1, hard):
                try: os.close(fd)
                except OSError: pass
        serve(c, "server", head); c.close()
    elif shape.startswith("client-"):  # the client forks (client.py): plain serving
        serve(c, "server"); c.close()
    elif shape == "fork-after-use":  # the parent reads the head, a child the rest
        n = struct.unpack("!I", exact(c, 4))[0]
        first = exact(c, min(n, 1000))
        pid = os.fork()
        if pid == 0:
            ls.close(); serve_half(c, "child", first, n); os._exit(0)
        os.waitpid(pid, 0)
        c.sendall(b"parent:%d\n" % os.getpid()); c.close()
    elif shape in ("exec", "exec-after-use", "exec-plain", "exec-plain-after-use"):
        # inetd: the connection becomes fds 0 and 1; "plain": of a program
        # whose environment has no LD_PRELOAD (systemd-socket-activate's)
        head = exact(c, 4) if shape.endswith("after-use") else b""
        pid = os.fork()
        if pid == 0:
            os.dup2(c.fileno(), 0); os.dup2(c.fileno(), 1)
            argv = [sys.executable, os.path.join(os.path.dirname(__file__), "stdio_serve.py"), head.hex()]
            if "plain" in shape:
                os.execve(sys.executable, argv, {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
            os.execvp(sys.executable, argv)
        c.close(); os.waitpid(pid, 0)
    elif shape == "child-answers":
        # The parent reads the request; a forked child writes the answer,
        # shuts down writing and exits at once, while the parent keeps its
        # copy open until the client, told the end, closes.
        n = struct.unpack("!I", exact(c, 4))[0]
        data = exact(c, n)
        pid = os.fork()
        if pid == 0:
            ls.close()
            c.sendall(hashlib.sha256(data).hexdigest().encode() + b" child:%d\n" % os.getpid())
            c.sendall(data)
            c.shutdown(socket.SHUT_WR)
            os._exit(0)
        os.waitpid(pid, 0)
        if c.recv(1) != b"":
            raise SystemExit("the client wrote after its request")
        c.close()
    elif shape == "scm-rights":
        socket.send_fds(a, [b"x"], [c.fileno()]); c.close()
    elif shape == "signals":  # a child whose first use is interrupted by signals
        pid = os.fork()
        if pid == 0:
            ls.close()
            signal.signal(signal.SIGALRM, lambda *_: None)
            signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
            serve(c, "child"); c.close()
            signal.setitimer(signal.ITIMER_REAL, 0, 0)
            os._exit(0)
        # and the parent signals the child while it takes the connection over
        for _ in range(20):
            try: os.kill(pid, signal.SIGWINCH)
            except ProcessLookupError: break
        c.close(); children.append(pid)
    else:
        raise SystemExit("unknown shape " + shape)
for pid in children:
    _, st = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(st) != 0:
        raise SystemExit("child %d: exit %d" % (pid, os.waitstatus_to_exitcode(st)))
if shape == "scm-rights":
    _, st = os.waitpid(worker, 0)
    if os.waitstatus_to_exitcode(st) != 0:
        raise SystemExit("worker: exit %d" % os.waitstatus_to_exitcode(st))
print("OK")
