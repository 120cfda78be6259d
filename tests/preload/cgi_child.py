"""A CGI-shaped server: it reads a request's length, forks and execs
`head -c N` with the connection as its stdin and stdout (the child answers
by echoing the body), waits for the child, then shuts its copy down and
closes it. Every byte the child wrote must reach the client before the end
of stream. cgi_child.py ROLE PORT COUNT. Every wait is bounded."""
import os
import socket
import sys
import threading

role, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
SIZE = 2_000_000

if role == "server":
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen()
    for _ in range(count):
        c, _ = ls.accept()  # blocking: head's stdin shares the file's flags
        n = int(c.recv(16).decode())
        pid = os.fork()
        if pid == 0:
            os.dup2(c.fileno(), 0)
            os.dup2(c.fileno(), 1)
            os.execvp("head", ["head", "-c", str(n)])
        os.waitpid(pid, 0)
        c.shutdown(socket.SHUT_WR)
        c.close()
elif role == "client":
    data = os.urandom(SIZE)
    bad = []
    for i in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        s.settimeout(20)
        s.sendall(b"%-16d" % len(data))
        writer = threading.Thread(target=s.sendall, args=(data,))
        writer.start()
        got = bytearray()
        while chunk := s.recv(1 << 20):
            got += chunk
        writer.join()
        s.close()
        if got != data:
            bad.append(f"connection {i}: {len(got)} of {len(data)} bytes")
    if bad:
        sys.exit("answers cut short: " + "; ".join(bad))
    print(f"OK: {count} answers of {SIZE} bytes", flush=True)
else:
    sys.exit(f"unknown role {role}")
