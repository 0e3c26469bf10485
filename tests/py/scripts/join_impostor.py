"""The impostor of issue 18, as a new user would write it: connect to node 0's port and send
a well-formed node link hello for node 1, before the real node 1 arrives. It prints what node
0 answered (the frame kind) and exits."""
import socket
import struct
import sys
import time

MAGIC, HELLO = 0x31464841, 1


def fields(**kv):
    out = b""
    for k, v in kv.items():
        out += struct.pack("<I", len(k)) + k.encode() + struct.pack("<Q", len(v)) + v.encode()
    return out


port = int(sys.argv[1])
host = sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1"
payload = fields(version="1", node_rank="1", nnodes="2", nprocs="2", host="impostor")
for _ in range(200):
    try:
        s = socket.create_connection((host, port))
        break
    except OSError:
        time.sleep(0.05)
s.sendall(struct.pack("<IHHQ", MAGIC, HELLO, 0, len(payload)) + payload)
s.settimeout(10)
header = s.recv(16)
print("answer kind", struct.unpack("<IHHQ", header)[1] if len(header) == 16 else "none", flush=True)
