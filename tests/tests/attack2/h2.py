# A hostile guest's raw HTTP/2 client for attack_streams: its own frames (HPACK literals, no
# Huffman), so it can send what curl will not: DATA split where it likes, trailers, extended
# CONNECT (RFC 8441), `:path` forms. Runs in a sandbox; prints one JSON line per case:
# {"case", "text": the DATA payloads received, "rst": RST_STREAM codes, "goaway": …,
#  "status": the first :status seen when it could be read, "error"}.
# Usage: python3 h2.py CASES.json; a case: {"case", "dial", "sni", "headers": [[n, v], …],
#  "data": [str, …] (each one DATA frame; "{{PAD:n}}" is n bytes of "a"), "trailers": [[n, v]],
#  "wait": seconds}.
import json
import re
import socket
import ssl
import struct
import sys
import time


def resolve(name):
    return socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]


def hpack_int(value, prefix_bits, first):
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def hpack(headers):
    """Literal header fields without indexing, new names, no Huffman."""
    out = b""
    for name, value in headers:
        n, v = name.encode("latin-1"), value.encode("latin-1")
        out += b"\x00" + hpack_int(len(n), 7, 0) + n + hpack_int(len(v), 7, 0) + v
    return out


def frame(kind, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


STATIC_STATUS = {8: 200, 9: 204, 10: 206, 11: 304, 12: 400, 13: 404, 14: 500}


def first_status(block):
    """The :status of a response header block when it is a static entry or a plain literal."""
    if not block:
        return 0
    b = block[0]
    if b & 0x80:
        return STATIC_STATUS.get(b & 0x7F, 0)
    if b & 0xF0 in (0x00, 0x10) or b & 0xC0 == 0x40:
        i = 1
        if len(block) > 2 and not block[i] & 0x80:
            n = block[i] & 0x7F
            v = block[i + 1:i + 1 + n]
            if v.isdigit():
                return int(v)
    return -1


class Conn:
    def __init__(self, case):
        addr = case.get("addr") or resolve(case["dial"])
        sock = socket.create_connection((addr, case.get("port", 443)), timeout=8)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        self.s = ctx.wrap_socket(sock, server_hostname=case.get("sni", case["dial"]))
        self.alpn = self.s.selected_alpn_protocol()
        self.buf = b""
        self.window = 65535
        self.stream_window = 65535
        self.text = b""
        self.rst = []
        self.goaway = None
        self.status = 0
        self.closed = False
        self.s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b""))

    def pump(self, wait):
        self.s.settimeout(wait)
        try:
            chunk = self.s.recv(65536)
        except (socket.timeout, TimeoutError):
            return False
        except (ssl.SSLError, OSError):
            self.closed = True
            return False
        if not chunk:
            self.closed = True
            return False
        self.buf += chunk
        while len(self.buf) >= 9:
            n = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + n:
                break
            kind, flags = self.buf[3], self.buf[4]
            stream = int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
            payload = self.buf[9:9 + n]
            self.buf = self.buf[9 + n:]
            self.on(kind, flags, stream, payload)
        return True

    def on(self, kind, flags, stream, payload):
        if kind == 4 and not flags & 1:
            for i in range(0, len(payload), 6):
                ident, value = struct.unpack(">HI", payload[i:i + 6])
                if ident == 4:
                    self.stream_window += value - 65535
            self.s.sendall(frame(4, 1, 0, b""))
        elif kind == 8:
            inc = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            if stream == 0:
                self.window += inc
            else:
                self.stream_window += inc
        elif kind == 0:
            self.text += payload
        elif kind == 1 and stream == 1 and not self.status:
            block = payload
            if flags & 0x8:
                block = block[1:len(block) - block[0]]
            if flags & 0x20:
                block = block[5:]
            self.status = first_status(block)
        elif kind == 3:
            self.rst.append(int.from_bytes(payload[:4], "big"))
        elif kind == 7:
            self.goaway = int.from_bytes(payload[4:8], "big")
        elif kind == 6 and not flags & 1:
            self.s.sendall(frame(6, 1, 0, payload))

    def data(self, chunk, end):
        while len(chunk) > min(self.window, self.stream_window):
            if self.closed or self.rst or not self.pump(3):
                raise ConnectionError("no window to send in")
        self.window -= len(chunk)
        self.stream_window -= len(chunk)
        self.s.sendall(frame(0, 1 if end else 0, 1, chunk))


def run(case):
    out = {"case": case["case"]}
    try:
        c = Conn(case)
    except Exception as e:
        out.update(error="connect: %r" % (e,))
        return out
    out["alpn"] = c.alpn
    data = [re.sub(r"\{\{PAD:(\d+)\}\}", lambda m: "a" * int(m.group(1)), d).encode("latin-1")
            for d in case.get("data", [])]
    trailers = case.get("trailers")
    try:
        only_head = not data and not trailers
        c.s.sendall(frame(1, 0x4 | (1 if only_head else 0), 1, hpack(case["headers"])))
        for i, d in enumerate(data):
            for j in range(0, max(len(d), 1), 16384):
                last = i == len(data) - 1 and j + 16384 >= len(d) and not trailers
                c.data(d[j:j + 16384], last)
        if trailers:
            c.s.sendall(frame(1, 0x5, 1, hpack(trailers)))
    except Exception as e:
        out["error"] = "exchange: %r" % (e,)
    end = time.time() + case.get("wait", 3)
    while time.time() < end and not c.closed:
        c.pump(0.5)
    out.update(text=c.text.decode("latin-1")[:3000], rst=c.rst, goaway=c.goaway, status=c.status)
    return out


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    for case in cases:
        print(json.dumps(run(case)), flush=True)


main()
