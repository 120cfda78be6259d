#!/usr/bin/env python3
"""Writes the seed corpus of kv_request_fuzzer (fuzz/corpus/kv_request/):
well-formed and malformed kv requests (apps/kv/protocol.hpp) and the four
handshake messages (apps/kv/auth.hpp). Run from the repository root."""
import os
import struct

OUT = os.path.join(os.path.dirname(__file__), "corpus", "kv_request")
REQ_MAGIC, HELLO, CHALLENGE, PROOF, WELCOME = (
    0x3151564B, 0x3148564B, 0x3143564B, 0x3150564B, 0x3157564B)


def req(op, key, value=b"", rid=1, key_len=None, value_len=None, r1=0, r2=0):
    kl = len(key) if key_len is None else key_len
    vl = len(value) if value_len is None else value_len
    return struct.pack("<IBBHIIQ", REQ_MAGIC, op, r1, kl, vl, r2, rid) + key + value


def msg(magic, flag, body, tail=b""):
    return struct.pack("<IB3x", magic, flag) + body + tail


seeds = {
    "put": req(1, b"key", b"value"),
    "put_long": req(1, b"k" * 256, b"v" * 2000),
    "get": req(2, b"12345"),
    "del": req(3, b"k"),
    "table": req(4, b""),
    "short": req(2, b"k")[:10],
    "bad_magic": b"\x42" + req(2, b"k")[1:],
    "lengths_lie": req(1, b"key", b"value", key_len=200),
    "value_len_huge": req(1, b"key", b"v", value_len=0xFFFFFFFF),
    "unknown_op": req(77, b"k"),
    "empty_key": req(2, b""),
    "key_too_long": req(1, b"k" * 300, b"v"),
    "get_with_value": req(2, b"k", b"junk"),
    "table_with_key": req(4, b"k"),
    "reserved_set": req(2, b"k", r1=1),
    "hello": msg(HELLO, 0, bytes(range(32))),
    "challenge": msg(CHALLENGE, 1, bytes(range(32, 64))),
    "proof": msg(PROOF, 1, bytes(32)),
    "proof_no_secret": msg(PROOF, 0, bytes(32)),
    "welcome_ok": msg(WELCOME, 0, bytes(32), bytes(68)),
    "welcome_refused": msg(WELCOME, 2, bytes(32)),
}
# A slot whose key_hash and key the fuzzer probes for (table_layout.hpp).
slot = struct.pack("<QQQQIIIHH", 2, 0, 1, 0x1234, 3, 4, 0xFFFFFFFF, 1, 1)
seeds["slots"] = (slot + b"abcdata" + bytes(128 - len(slot) - 7)) * 4

os.makedirs(OUT, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print(f"wrote {len(seeds)} seeds to {OUT}")
