"""An attacker of another user (tests/preload/other_users_test.sh): takes
the abstract offer name of a connection it predicts (client 127.0.0.1:CPORT
to 127.0.0.1:SPORT), accepts whoever connects and records what it gets.
Prints "fds=N bytes=M" when killed (SIGTERM) or after 30 s."""
import signal, socket, struct, sys, time

cport, sport, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
# The preload's tuple (rendezvous_wire.hpp): family, 3 pad, client and server
# addresses (16 bytes each, IPv4 in the first 4), ports in network order.
tup = struct.pack("!B3x16s16sHH", socket.AF_INET, socket.inet_aton("127.0.0.1"),
                  socket.inet_aton("127.0.0.1"), cport, sport)
h = 1469598103934665603
for b in tup:
    h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(b"\0rdmakit-o-%016x" % h)
s.listen(8)
fds = got = 0
stop = False


def done(*_):
    global stop
    stop = True


signal.signal(signal.SIGTERM, done)
open(ready, "w").write("ready\n")
s.settimeout(0.2)
deadline = time.time() + 30
while not stop and time.time() < deadline:
    try:
        c, _ = s.accept()
    except (socket.timeout, InterruptedError):
        continue
    c.settimeout(1)
    try:
        while True:
            data, anc, _, _ = c.recvmsg(4096, socket.CMSG_SPACE(64))
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds += len(payload) // 4
            if not data:
                break
            got += len(data)
    except (socket.timeout, OSError):
        pass
    c.close()
print("fds=%d bytes=%d" % (fds, got), flush=True)
