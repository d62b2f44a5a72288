# A hostile guest's HTTP client for the attack_* tests: raw bytes over TLS (its own
# ClientHello framing when asked) or plain TCP, to the address the guard answered. Runs inside a
# sandbox (python3 of the base image); prints one JSON line per case:
# {"case", "status", "head", "body"} (status 0: no HTTP answer; "error" when the connection
# failed). Usage: python3 guest.py CASES.json  (a list of case objects, see `run`).
import json
import re
import socket
import ssl
import sys
import time


def resolve(name):
    """The guard's IPv4 answer for name (this also opens the fence for it)."""
    infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    return infos[0][4][0]


def context(alpn=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


class Bio:
    """TLS over a socket through memory BIOs, so the ClientHello's bytes can be sent as the
    case says (split in TCP segments or re-framed in several TLS records)."""

    def __init__(self, sock, sni, hello):
        self.sock = sock
        self.inc = ssl.MemoryBIO()
        self.out = ssl.MemoryBIO()
        self.obj = context().wrap_bio(self.inc, self.out, server_hostname=sni)
        first = True
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                pass
            data = self.out.read()
            if data:
                if first:
                    send_hello(sock, data, hello)
                    first = False
                else:
                    sock.sendall(data)
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed during the handshake")
            self.inc.write(chunk)
        self.flush()

    def flush(self):
        data = self.out.read()
        if data:
            self.sock.sendall(data)

    def sendall(self, data):
        self.obj.write(data)
        self.flush()

    def recv(self, n):
        while True:
            try:
                return self.obj.read(n)
            except ssl.SSLWantReadError:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return b""
                self.inc.write(chunk)
            except ssl.SSLZeroReturnError:
                return b""


def send_hello(sock, data, how):
    """The first flight (one TLS record holding the ClientHello) as `how` says."""
    if how == "bytes":
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(0, len(data), 7):
            sock.sendall(data[i:i + 7])
            time.sleep(0.002)
        return
    if how == "records":
        kind, version, body = data[0:1], data[1:3], data[5:]
        cut = len(body) // 3
        out = b""
        for piece in (body[:cut], body[cut:2 * cut], body[2 * cut:]):
            out += kind + version + len(piece).to_bytes(2, "big") + piece
        sock.sendall(out)
        return
    sock.sendall(data)


def connect(case):
    for name in case.get("resolve", []):
        resolve(name)
    addr = case.get("addr") or resolve(case["dial"])
    port = case.get("port", 443 if case.get("tls", True) else 80)
    sock = socket.create_connection((addr, port), timeout=8)
    if not case.get("tls", True):
        return sock
    sni = case.get("sni", case.get("dial"))
    if case.get("hello"):
        return Bio(sock, sni, case["hello"])
    return context(case.get("alpn")).wrap_socket(sock, server_hostname=sni)


def read_answer(conn, wait):
    """Everything until the peer closes or `wait` seconds of silence."""
    conn.settimeout(wait) if hasattr(conn, "settimeout") else None
    if isinstance(conn, Bio):
        conn.sock.settimeout(wait)
    got = b""
    while True:
        try:
            chunk = conn.recv(65536)
        except (socket.timeout, TimeoutError):
            break
        except (ssl.SSLError, ConnectionError, OSError):
            break
        if not chunk:
            break
        got += chunk
    return got


def dns_flood(count):
    """`count` A questions for names no sandbox may ask (each refused, and audited) to the
    resolver, as fast as they go; answers are not waited for."""
    server = "10.0.0.1"
    with open("/etc/resolv.conf") as f:
        for line in f:
            if line.startswith("nameserver"):
                server = line.split()[1]
                break
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    sent = 0
    for i in range(count):
        name = b"".join(bytes([len(p)]) + p for p in [b"q%d" % i, b"flood", b"test"]) + b"\0"
        packet = (i & 0xFFFF).to_bytes(2, "big") + b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" \
            + name + b"\x00\x01\x00\x01"
        try:
            sock.sendto(packet, (server, 53))
            sent += 1
        except BlockingIOError:
            time.sleep(0.001)
        try:
            while sock.recv(512):
                pass
        except (BlockingIOError, OSError):
            pass
    return sent


def parallel(case):
    """`case` (a flood) run by `parallel` processes at once, each on its own connection."""
    import os
    kids = []
    for _ in range(case["parallel"]):
        pid = os.fork()
        if pid == 0:
            one = dict(case)
            one.pop("parallel")
            run(one)
            os._exit(0)
        kids.append(pid)
    if case.get("detach"):
        DETACHED.extend(kids)
    else:
        for pid in kids:
            os.waitpid(pid, 0)
    return {"case": case["case"], "status": 0, "statuses": [], "answer": ""}


# Children of detached cases, waited for at the end.
DETACHED = []


def run(case):
    if case.get("parallel"):
        return parallel(case)
    if case.get("sleep"):
        time.sleep(case["sleep"])
        return {"case": case["case"], "status": 0, "statuses": [], "answer": ""}
    out = {"case": case["case"]}
    if case.get("dns_flood"):
        out.update(status=0, sent=dns_flood(case["dns_flood"]), statuses=[], answer="")
        return out
    try:
        conn = connect(case)
    except Exception as e:  # the gate refusing is an answer too
        out.update(status=0, error="connect: %r" % (e,))
        return out
    answers = b""
    if case.get("repeat"):
        return flood(conn, case, out)
    try:
        for raw in case["send"]:
            # Padding is no hex digit: the outside world looks for placeholder-shaped runs.
            raw = re.sub(r"\{\{PAD:(\d+)\}\}", lambda m: "z" * int(m.group(1)), raw)
            conn.sendall(raw.encode("latin-1"))
            answers += read_answer(conn, case.get("wait", 2))
    except Exception as e:
        out["error"] = "exchange: %r" % (e,)
    text = answers.decode("latin-1")
    statuses = statuses_of(text)
    out["status"] = statuses[0] if statuses else 0
    out["statuses"] = statuses
    out["answer"] = text[:3000]
    return out


STATUS_LINE = re.compile(r"HTTP/1\.[01] (\d{3}) ")
NEXT_STATUS_LINE = re.compile(r"\nHTTP/1\.[01] \d{3} ")


def statuses_of(text):
    """The status of each response in `text`, walking them by their Content-Length (a
    response may follow a JSON body with no newline between); one of unknown length is
    followed by the next status line at the start of a line."""
    statuses, i = [], 0
    while i < len(text):
        m = STATUS_LINE.match(text, i)
        if not m:
            n = NEXT_STATUS_LINE.search(text, i)
            if not n:
                break
            i = n.start() + 1
            continue
        code = int(m.group(1))
        statuses.append(code)
        end = text.find("\r\n\r\n", i)
        if end < 0:
            break
        cl = re.search(r"(?im)^content-length:\s*(\d+)\s*$", text[i:end])
        has_body = code >= 200 and code not in (204, 304)
        i = end + 4 + (int(cl.group(1)) if cl and has_body else 0)
    return statuses


def flood(conn, case, out):
    """`send[0]` `repeat` times on one kept-alive connection, `batch` pipelined at a time; the
    count of answers by status."""
    raw = case["send"][0].encode("latin-1")
    total, batch = case["repeat"], case.get("batch", 100)
    counts = {}
    sent = 0
    if isinstance(conn, Bio):
        conn.sock.settimeout(5)
    else:
        conn.settimeout(5)
    pending = b""
    while sent < total:
        n = min(batch, total - sent)
        conn.sendall(raw * n)
        sent += n
        got = 0
        while got < n:
            try:
                chunk = conn.recv(65536)
            except (socket.timeout, TimeoutError, ssl.SSLError, OSError):
                chunk = b""
            if not chunk:
                out.update(status=0, sent=sent, counts=counts, error="closed early")
                return out
            pending += chunk
            while True:
                i = pending.find(b"HTTP/1.1 ")
                if i < 0 or len(pending) < i + 12:
                    break
                status = pending[i + 9:i + 12].decode("latin-1")
                counts[status] = counts.get(status, 0) + 1
                got += 1
                pending = pending[i + 12:]
    out.update(status=int(max(counts, key=counts.get)) if counts else 0, sent=sent,
               counts=counts, statuses=[], answer="")
    return out


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    for case in cases:
        print(json.dumps(run(case)), flush=True)
    import os
    for pid in DETACHED:
        os.waitpid(pid, 0)


main()
