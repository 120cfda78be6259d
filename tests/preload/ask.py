"""Sends one line to 127.0.0.1:PORT and prints all the server answers until it
ends the connection (compat_test.sh): ask.py PORT LINE."""
import socket
import sys

s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.settimeout(10)
s.sendall(sys.argv[2].encode() + b"\n")
got = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    got += b
sys.stdout.write(got.decode())
