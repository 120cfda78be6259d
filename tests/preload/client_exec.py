"""Server for the preload's client-exec case (preload_test.sh): one
connection at a time, CONNS of them. Each client sends one line; the
server answers with SIZE bytes, a pattern seeded by the line, and closes.
The client side is a shell (bash's /dev/tcp, a forked and exec'd child), so
the answer is checked with `cmp` against `client_exec.py expect LINE SIZE`.
   client_exec.py server PORT CONNS SIZE [greet]   (greet: "HELLO\n" first)
   client_exec.py expect LINE SIZE      (the answer, to stdout)
   client_exec.py fork-exec|spawn|spawn-greeted|fork-exec-stdio|inheritable
                  PORT LINE SIZE OUT
A client whose child runs `sh` on the connection (stdin and stdout):
`printf` (stdio) writes the line and `head` reads the answer into OUT
(fork-exec-stdio: `sha256sum`, which reads through stdio, writes the
answer's digest there; spawn-greeted: `head` first reads the server's
greeting). inheritable: no child; the client marks its
socket inheritable (os.set_inheritable: ioctl FIONCLEX) and execs sh,
which uses it as fd N.
fork-exec: os.fork and os.execvp; spawn: subprocess, which uses vfork (no
fork handlers run in the parent). The parent keeps its copy and waits."""
import hashlib, os, socket, subprocess, sys


def pattern(line, size):
    out = bytearray()
    block = hashlib.sha256(line).digest()
    while len(out) < size:
        out += block
        block = hashlib.sha256(block).digest()
    return bytes(out[:size])


if sys.argv[1] == "expect":
    sys.stdout.buffer.write(pattern(sys.argv[2].encode() + b"\n", int(sys.argv[3])))
    sys.exit(0)
if sys.argv[1] in ("fork-exec", "spawn", "spawn-greeted", "fork-exec-stdio", "inheritable"):
    port, line, size, out = int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
    s = socket.create_connection(("127.0.0.1", port))
    script = '/usr/bin/printf "%%s\\n" %s; head -c %d >%s' % (line, size, out)
    if sys.argv[1] == "fork-exec-stdio":
        script = '/usr/bin/printf "%%s\\n" %s; sha256sum >%s' % (line, out)
    if sys.argv[1] == "inheritable":
        fd = s.fileno()
        os.set_inheritable(fd, True)
        if os.get_inheritable(fd) is not True:
            raise SystemExit("set_inheritable(%d) did not clear close-on-exec" % fd)
        os.execvp("sh", ["sh", "-c", '/usr/bin/printf "%%s\\n" %s >&%d; head -c %d <&%d >%s'
                         % (line, fd, size, fd, out)])
    if sys.argv[1] == "spawn-greeted":
        script = "head -c 6 >/dev/null; " + script
    if sys.argv[1].startswith("spawn"):
        sys.exit(subprocess.run(["sh", "-c", script], stdin=s, stdout=s).returncode)
    pid = os.fork()
    if pid == 0:
        os.dup2(s.fileno(), 0)
        os.dup2(s.fileno(), 1)
        os.execvp("sh", ["sh", "-c", script])
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
port, conns, size = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
greet = len(sys.argv) > 5 and sys.argv[5] == "greet"
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(8)
l.settimeout(20)
for i in range(conns):
    c, _ = l.accept()
    c.settimeout(20)
    if greet:
        c.sendall(b"HELLO\n")
    line = b""
    while not line.endswith(b"\n"):
        d = c.recv(100)
        if not d:
            raise SystemExit("connection %d: end of stream before a line (%r)" % (i, line))
        line += d
    c.sendall(pattern(line, size))
    c.close()
print("OK", conns)
