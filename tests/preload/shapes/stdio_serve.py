"""An inetd-style service: the connection is fds 0 and 1 (server.py exec)."""
import hashlib, os, struct, sys

head = bytes.fromhex(sys.argv[1])


def exact(n):
    b = bytearray()
    while len(b) < n:
        d = os.read(0, n - len(b))
        if not d:
            raise SystemExit("short read")
        b += d
    return bytes(b)


def write_all(data):
    while data:
        data = data[os.write(1, data):]


n = struct.unpack("!I", head + exact(4 - len(head)))[0]
data = exact(n)
write_all(hashlib.sha256(data).hexdigest().encode() + b" exec:%d\n" % os.getpid())
write_all(data)
