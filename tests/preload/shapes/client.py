"""Client of tests/preload/shapes/server.py: CONNS connections, one at a
time, each sending SIZE bytes; checks the digest and the echo, prints who
served each one (and a parent's last word, when the shape has one).
An optional SOURCE_PORT binds the client end (one connection then)."""
import hashlib, os, socket, struct, sys

port, conns, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
source = ("127.0.0.1", int(sys.argv[4])) if len(sys.argv) > 4 else None
for i in range(conns):
    data = os.urandom(size)
    s = socket.create_connection(("127.0.0.1", port), source_address=source)
    s.sendall(struct.pack("!I", size) + data)
    f = s.makefile("rb")
    line = f.readline().decode().split()
    if len(line) != 2 or line[0] != hashlib.sha256(data).hexdigest():
        raise SystemExit("connection %d: bad digest line %r" % (i, line))
    back = f.read(size)
    if back != data:
        raise SystemExit("connection %d: echo differs (%d bytes back)" % (i, len(back)))
    rest = f.read().decode().strip()
    print(line[1], rest)
print("OK")
