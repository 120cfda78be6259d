"""Client of tests/preload/shapes/server.py: CONNS connections, one at a
time, each sending SIZE bytes; checks the digest and the echo, prints who
served each one (and a parent's last word, when the shape has one).
An optional SOURCE_PORT binds the client end (one connection then).
CLIENT_FORK in the environment forks after each connect, before any use,
and splits the request between parent and child: "child-first", the child
sends the length and stays until the parent has the answer; "parent-first",
the parent sends the length and the child the bytes (it only writes);
"child-exits", the child sends the whole request and exits at once, and the
parent reads the answer only once it has reaped the child (perlipc's
forking client); "parent-closes", the parent settles it (an empty send)
and closes its copy, and the child, 100 ms after the fork, makes the whole
exchange."""
import hashlib, os, socket, struct, sys, time


def answer(s, i, data):
    """Reads and checks the server's answer to data; its line's last fields."""
    f = s.makefile("rb")
    line = f.readline().decode().split()
    if len(line) != 2 or line[0] != hashlib.sha256(data).hexdigest():
        raise SystemExit("connection %d: bad digest line %r" % (i, line))
    back = f.read(len(data))
    if back != data:
        raise SystemExit("connection %d: echo differs (%d bytes back)" % (i, len(back)))
    rest = f.read().decode().strip()
    f.close()
    return line[1], rest


port, conns, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
source = ("127.0.0.1", int(sys.argv[4])) if len(sys.argv) > 4 else None
for i in range(conns):
    data = os.urandom(size)
    s = socket.create_connection(("127.0.0.1", port), source_address=source)
    split = os.environ.get("CLIENT_FORK")
    if split:
        child_r, parent_w = os.pipe()  # parent -> child
        parent_r, child_w = os.pipe()  # child -> parent
        child = os.fork()
        if child == 0:
            os.close(parent_w); os.close(parent_r)
            if split == "child-exits":
                s.sendall(struct.pack("!I", size) + data)
                os._exit(0)
            if split == "parent-closes":
                time.sleep(0.1)  # after the parent closed its copy
                s.sendall(struct.pack("!I", size) + data)
                print(*answer(s, i, data), flush=True)
                os._exit(0)
            if split == "child-first":
                s.sendall(struct.pack("!I", size)); os.write(child_w, b"x")
                os.read(child_r, 1)  # the parent has its answer
            else:
                os.read(child_r, 1); s.sendall(data); os.write(child_w, b"x")
                os.read(child_r, 1)
            os._exit(0)
        os.close(child_r); os.close(child_w)
        if split == "parent-closes":
            s.send(b"")  # a use: the parent settles it (and carries it)
            s.close()
            _, status = os.waitpid(child, 0)
            if status != 0:
                raise SystemExit("connection %d: the child failed (%d)" % (i, status))
            os.close(parent_w); os.close(parent_r)
            continue
        if split == "child-exits":
            _, status = os.waitpid(child, 0)
            if status != 0:
                raise SystemExit("connection %d: the child failed (%d)" % (i, status))
        elif split == "child-first":
            os.read(parent_r, 1); s.sendall(data)
        else:
            s.sendall(struct.pack("!I", size)); os.write(parent_w, b"x"); os.read(parent_r, 1)
    else:
        s.sendall(struct.pack("!I", size) + data)
    served, rest = answer(s, i, data)
    s.close()  # before the next connect: a server may wait for this end
    if split == "child-exits":
        os.close(parent_w); os.close(parent_r)
    elif split:
        os.write(parent_w, b"x"); os.close(parent_w); os.close(parent_r)
        os.waitpid(child, 0)
    print(served, rest)
print("OK")
