"""A client that forks before any use while its server is slow to speak
(preload_test.sh slow-greeting): the server greets DELAY seconds after
its accept, the child reads the greeting and exits, then the parent sends
a request and reads the answer. The child's wait for its creator ends
before the server takes the offer up; whatever it settles, the parent's
copy must go on working.
   slow_greeting.py server PORT DELAY
   slow_greeting.py client PORT"""
import os, socket, sys, time

if sys.argv[1] == "server":
    port, delay = int(sys.argv[2]), float(sys.argv[3])
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port))
    l.listen(4)
    l.settimeout(20)
    c, _ = l.accept()
    c.settimeout(20)
    time.sleep(delay)
    c.sendall(b"HELLO\n")
    f = c.makefile("rb")
    line = f.readline()
    if line != b"request\n":
        raise SystemExit("server got %r" % line)
    c.sendall(b"ANSWER\n")
    if f.read() != b"":
        raise SystemExit("server: bytes after the request")
    print("OK server")
    sys.exit(0)
s = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
s.settimeout(20)
pid = os.fork()
if pid == 0:
    got = s.recv(100)
    os._exit(0 if got == b"HELLO\n" else 3)
_, status = os.waitpid(pid, 0)
if os.waitstatus_to_exitcode(status) != 0:
    raise SystemExit("the child did not read the greeting (%d)" % status)
s.sendall(b"request\n")
f = s.makefile("rb")
answer = f.readline()
if answer != b"ANSWER\n":
    raise SystemExit("parent got %r" % answer)
s.close()
print("OK client")
