"""Point-to-point bandwidth between two emulated hosts, with plain TCP sockets.

A receiver runs in the destination host's namespace and a sender in the source's,
each started with ``ip netns exec`` as a separate Python process running this file.
The receiver measures: it sees the bytes that actually crossed the links, whereas a
sender's clock also counts bytes still sitting in its socket buffer.

Standard library only at import time, so that this file also runs as a script
(``python probe.py recv|send ...``) inside a namespace, without hvdx installed there.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from typing import Any, Dict

__all__ = ["measure", "measure_bandwidth", "probe_command"]

_CHUNK = 1 << 16


def probe_command(*args: str) -> list:
    """The argv that runs this file as a script with ``args``."""
    return [sys.executable, "-u", __file__, *map(str, args)]


def measure_bandwidth(cluster: Any, src: Any, dst: Any, seconds: float = 2.0,
                      warmup: float = 0.3, timeout: float = 60.0) -> float:
    """Measures TCP throughput from host ``src`` to host ``dst`` over the data network.

    Args:
        cluster: a running :class:`~hvdx.cluster.netns.EmulatedCluster`.
        src: sending host (index, name such as ``"h0"``, or address).
        dst: receiving host.
        seconds: how long the sender sends.
        warmup: seconds, from the first byte received, left out of the rate, so that
            the token buckets' initial burst and TCP's slow start do not inflate or
            deflate it.
        timeout: seconds before the measurement is abandoned.

    Returns:
        Bytes per second received in steady state.

    Raises:
        RuntimeError: if either side fails or times out.
    """
    return measure(cluster, src, dst, seconds, warmup, timeout)["rate"]


def measure(cluster: Any, src: Any, dst: Any, seconds: float = 2.0, warmup: float = 0.3,
            timeout: float = 60.0) -> Dict[str, float]:
    """Like :func:`measure_bandwidth`, returning the receiver's full report
    (``rate``, ``bytes``, ``seconds``)."""
    src_host, dst_host = cluster.host(src), cluster.host(dst)
    receiver = subprocess.Popen(
        cluster.exec_prefix(dst_host) + probe_command("recv", dst_host.data_addr, warmup),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = receiver.stdout.readline().split()
        if len(ready) != 2 or ready[0] != "ready":
            raise RuntimeError(f"probe receiver on {dst_host.name} did not start: "
                               f"{receiver.stderr.read().strip()}")
        sender = subprocess.run(
            cluster.exec_prefix(src_host)
            + probe_command("send", dst_host.data_addr, ready[1], seconds),
            capture_output=True, text=True, timeout=timeout)
        if sender.returncode != 0:
            raise RuntimeError(f"probe sender on {src_host.name} failed: "
                               f"{sender.stderr.strip()}")
        out, err = receiver.communicate(timeout=timeout)
        if receiver.returncode != 0:
            raise RuntimeError(f"probe receiver on {dst_host.name} failed: {err.strip()}")
        return json.loads(out)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"probe {src_host.name} -> {dst_host.name} timed out after "
                           f"{timeout} s") from None
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()


def _recv(addr: str, warmup: float) -> None:
    with socket.create_server((addr, 0)) as server:
        print("ready", server.getsockname()[1], flush=True)
        server.settimeout(30)
        conn, _ = server.accept()
    buffer = bytearray(_CHUNK)
    total = mark_bytes = 0
    first = mark = None
    with conn:
        while True:
            n = conn.recv_into(buffer)
            now = time.perf_counter()
            if not n:
                break
            if first is None:
                first = now
            total += n
            if mark is None and now - first >= warmup:
                mark, mark_bytes = now, total
    end = time.perf_counter()
    if first is None:
        raise SystemExit("probe: no data received")
    if mark is None or end - mark <= 0:
        mark, mark_bytes = first, 0
    print(json.dumps({"rate": (total - mark_bytes) / (end - mark), "bytes": total,
                      "seconds": end - first}))


def _send(addr: str, port: int, seconds: float) -> None:
    payload = b"\0" * _CHUNK
    with socket.create_connection((addr, port), timeout=30) as conn:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)  # wait for the receiver's close: every byte has arrived


def main(argv: list) -> None:
    """Script entry: ``recv ADDR WARMUP`` or ``send ADDR PORT SECONDS``."""
    if argv[:1] == ["recv"] and len(argv) == 3:
        _recv(argv[1], float(argv[2]))
    elif argv[:1] == ["send"] and len(argv) == 4:
        _send(argv[1], int(argv[2]), float(argv[3]))
    else:
        raise SystemExit("usage: probe.py recv ADDR WARMUP | send ADDR PORT SECONDS")


if __name__ == "__main__":
    main(sys.argv[1:])
