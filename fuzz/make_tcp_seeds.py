#!/usr/bin/env python3
"""Writes the seed corpus for tcp_frame_fuzzer (fuzz/corpus/tcp_frame/).

Frame layout as in src/providers/tcp/tcp_wire.hpp. rkey 0..2 and addresses
below 64 KiB are patched by the harness to the real test regions.
"""
import os
import struct
import sys

OPS = dict(SEND=0x10, SEND_IMM=0x11, WRITE=0x12, WRITE_IMM=0x13, READ=0x14,
           CAS=0x15, FADD=0x16, ACK=0x20, NAK=0x21, READ_RESP=0x22,
           ATOMIC_RESP=0x23, HEARTBEAT=0x30)
REMOTE_ACCESS_ERROR = 8


def frame(op, length=0, seq=0, addr=0, rkey=0, imm=0, arg0=0, arg1=0,
          status=0, payload=b""):
    hdr = struct.pack("<BBHIQQIIQQ", OPS[op], status, 0, length, seq, addr,
                      rkey, imm, arg0, arg1)
    return hdr + payload


def pay(n, seed=1):
    return bytes((i * 31 + seed) & 0xFF for i in range(n))


SEEDS = {
    "send_into_recv": (2, frame("SEND", 16, 0, payload=pay(16))),
    "send_imm_heartbeat": (2, frame("HEARTBEAT") + frame("SEND_IMM", 40, 0, imm=7, payload=pay(40))),
    "send_too_long": (2, frame("SEND", 5000, 0, payload=pay(5000))),
    "send_no_recv": (0, frame("SEND", 8, 0, payload=pay(8))),
    "write_ok": (0, frame("WRITE", 256, 0, addr=128, rkey=0, payload=pay(256))),
    "write_big_direct": (0, frame("WRITE", 30000, 0, addr=0, rkey=0, payload=pay(30000))),
    "write_readonly": (0, frame("WRITE", 64, 0, addr=0, rkey=1, payload=pay(64)) +
                       frame("WRITE", 8, 1, addr=0, rkey=0, payload=pay(8))),
    "write_out_of_range": (0, frame("WRITE", 64, 0, addr=32760, rkey=0, payload=pay(64))),
    "write_imm": (2, frame("WRITE_IMM", 32, 0, addr=512, rkey=0, imm=9, payload=pay(32)) +
                  frame("WRITE_IMM", 0, 1, imm=10)),
    "read_ok": (0, frame("READ", 0, 0, addr=0, rkey=0, arg0=1024) +
                frame("READ", 0, 1, addr=100, rkey=1, arg0=100)),
    "read_bad_key": (0, frame("READ", 0, 0, addr=0, rkey=77, arg0=16)),
    "atomics": (0, frame("FADD", 0, 0, addr=64, rkey=0, arg0=5) +
                frame("CAS", 0, 1, addr=64, rkey=0, arg0=5, arg1=9) +
                frame("CAS", 0, 2, addr=65, rkey=0)),
    "responses_all": (3, frame("READ_RESP", 64, 0, payload=pay(64)) + frame("ACK", 0, 1) +
                      frame("ATOMIC_RESP", 0, 2, arg0=41) + frame("ACK", 0, 3) +
                      frame("READ_RESP", 8192, 4, payload=pay(8192)) +
                      frame("ATOMIC_RESP", 0, 5, arg0=1)),
    "response_nak": (3, frame("READ_RESP", 64, 0, payload=pay(64)) +
                     frame("NAK", 0, 1, status=REMOTE_ACCESS_ERROR) + frame("ACK", 0, 3)),
    "response_out_of_order": (3, frame("ACK", 0, 4)),
    "mixed": (3, frame("WRITE", 16, 0, addr=0, rkey=0, payload=pay(16)) +
              frame("READ_RESP", 64, 0, payload=pay(64)) + frame("SEND", 8, 1, payload=pay(8)) +
              frame("ACK", 0, 1)),
    "garbage": (1, bytes(range(256)) * 2),
    "hello_body": (0, struct.pack("<IHHIIIII", 0x43544B52, 1, 0, 16, 16, 100, 1000, 4) + b"abcd"),
    # flags bit 2: the QP receives through a shared receive queue.
    "srq_sends": (6, frame("SEND", 16, 0, payload=pay(16)) +
                  frame("SEND_IMM", 40, 1, imm=7, payload=pay(40)) +
                  frame("WRITE_IMM", 32, 2, addr=512, rkey=0, imm=9, payload=pay(32))),
    "srq_send_too_long": (6, frame("SEND", 5000, 0, payload=pay(5000)) +
                          frame("SEND", 8, 1, payload=pay(8))),
    "srq_write_imm_bad_key": (6, frame("WRITE_IMM", 32, 0, addr=0, rkey=77, payload=pay(32))),
    "srq_empty": (4, frame("SEND", 8, 0, payload=pay(8))),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "corpus", "tcp_frame")
    os.makedirs(out, exist_ok=True)
    for name, (flags, data) in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes([flags]) + data)
    print(f"wrote {len(SEEDS)} seeds to {out}")


if __name__ == "__main__":
    main()
