#!/usr/bin/env python3
"""Two Soft-RoCE guests joined by an emulated wire (make test-rdma-wire; tests/rdma/README.md).

Boots guest A (10.99.0.1) and guest B (10.99.0.2) from the same kernel and initramfs, each
with rdma_rxe on a virtio NIC, joined by qemu's `-netdev dgram`: over unix datagram sockets (a
wire that never drops: a full receiver makes the sender wait, as on a lossless fabric) and over
UDP on 127.0.0.1 (a wire that drops). The guests run in agent mode (guest/init): this script
sends them commands on their consoles and drives faults through B's qemu monitor.

On each wire, with ferry_wire_probe in A writing and reading to a target in B (the faulty peer)
and to a target in A (the healthy peer) on one engine, it injects: kill -9 of B's target, B's
link down, B frozen (monitor `stop`, `cont` once the probe is done), B powered off (last). It
checks that the faulty peer's operations all fail, that the healthy peer sees no error, and
prints the fault table. On the lossless wire it also runs `ferry bench --listen/--connect`
across the guests beside perftest and prints the ratios (ratios.py).

usage: tests/rdma/two-guest.py --bin PATH... [--wires unix,udp] [--faults LIST] [--no-bench]
       [--rounds N] [--out DIR]
  --bin PATH  the ferry, ferry_test_target and ferry_wire_probe executables
Exit status 0 only if every step passed.
"""
import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PEER_TIMEOUT_MS = 2000
# A frozen guest is resumed after this long at most: freezes over ~100 s have crashed rxe's
# transmit path in the surviving guest's kernel (6.1).
FREEZE_LIMIT_S = 60


class Failure(Exception):
    pass


class Guest:
    """One qemu guest in agent mode: commands on its console, faults through its monitor."""

    def __init__(self, name, ip, mac, netdev, work, vmlinuz, initrd, log_path):
        self.name, self.ip, self.work = name, ip, work
        self.monitor_path = os.path.join(work, name + ".monitor")
        self.lines, self.cond = [], threading.Condition()
        self.log = open(log_path, "w")
        self.next_id = 0
        cmd = ["qemu-system-x86_64", "-machine", "pc", "-accel", "tcg,thread=multi", "-cpu", "max",
               # One vCPU each: two guests on a 2-core host ran faster than with two each.
               "-smp", "1", "-m", "1024M", "-display", "none", "-no-reboot",
               "-serial", "stdio", "-monitor", "unix:%s,server=on,wait=off" % self.monitor_path,
               "-netdev", netdev + ",id=wire",
               # event_idx=off: with it, qemu 7.2's virtio-net can stop receiving for good
               # (tests/rdma/README.md, "Pitfalls"); CI once lost the unix wire that way.
               "-device", "virtio-net-pci,netdev=wire,mac=%s,host_mtu=9000,event_idx=off" % mac,
               "-kernel", vmlinuz, "-initrd", initrd,
               "-append", "console=ttyS0 panic=-1 quiet clocksource=tsc tsc=reliable "
                          "rdma_guest.agent=1 rdma_guest.netdev=eth0 rdma_guest.ip=" + ip]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\r\n")
            self.log.write(line + "\n")
            self.log.flush()
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.lines.append(None)  # qemu exited
            self.cond.notify_all()

    def wait_line(self, pattern, timeout, start=0):
        """Index and match of the first line from `start` on matching `pattern`."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        i = start
        with self.cond:
            while True:
                while i < len(self.lines):
                    line = self.lines[i]
                    if line is None:
                        raise Failure("%s: qemu exited while waiting for /%s/" % (self.name, pattern))
                    m = rx.search(line)
                    if m:
                        return i, m
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Failure("%s: no line matching /%s/ within %ds" % (self.name, pattern, timeout))
                self.cond.wait(left)

    def command(self, verb, name="-", arg="-", cmd="", timeout=120):
        """Runs one agent command; returns (rc, the lines it printed)."""
        self.next_id += 1
        cid = self.next_id
        with self.cond:
            start = len(self.lines)
        self.proc.stdin.write(("%d %s %s %s %s\n" % (cid, verb, name, arg, cmd)).encode())
        self.proc.stdin.flush()
        end, m = self.wait_line(r"^DONE %d rc=(\d+)$" % cid, timeout + 30, start)
        with self.cond:
            out = [l for l in self.lines[start:end] if l is not None]
        return int(m.group(1)), out

    def monitor(self, text):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(self.monitor_path)
        reply = b""

        def until_prompt():
            nonlocal reply
            while not reply.endswith(b"(qemu) "):
                chunk = s.recv(4096)
                if not chunk:
                    break
                reply += chunk
        until_prompt()
        reply = b""
        s.sendall(text.encode() + b"\n")
        until_prompt()
        s.close()
        return reply.decode(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()


def netdevs(wire, work):
    """The -netdev arguments of A and B for one kind of wire."""
    if wire == "unix":
        a, b = os.path.join(work, "a.sock"), os.path.join(work, "b.sock")
        arg = "dgram,local.type=unix,local.path=%s,remote.type=unix,remote.path=%s"
        return arg % (a, b), arg % (b, a)
    ports = []
    for _ in range(2):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    arg = ("dgram,local.type=inet,local.host=127.0.0.1,local.port=%d,"
           "remote.type=inet,remote.host=127.0.0.1,remote.port=%d")
    return arg % (ports[0], ports[1]), arg % (ports[1], ports[0])


class Run:
    def __init__(self, args, vmlinuz, initrd, work):
        self.args, self.vmlinuz, self.initrd, self.work = args, vmlinuz, initrd, work
        self.failures, self.faults = [], []

    def boot(self, wire):
        net_a, net_b = netdevs(wire, self.work)
        logs = os.path.join(self.args.out, "two-guest-%s-%%s.log" % wire)
        a = Guest("A", "10.99.0.1", "52:54:00:00:00:01", net_a, self.work, self.vmlinuz,
                  self.initrd, logs % "a")
        b = Guest("B", "10.99.0.2", "52:54:00:00:00:02", net_b, self.work, self.vmlinuz,
                  self.initrd, logs % "b")
        for g in (a, b):
            _, m = g.wait_line(r"^RESULT setup rc=(\d+)", 300)
            if m.group(1) != "0":
                raise Failure("%s: rxe setup failed in the guest (see %s)" % (g.name, g.log.name))
            g.wait_line(r"^AGENT READY", 30)
        return a, b

    def target(self, guest, name):
        """Starts a target on `guest`; returns its address and descriptor."""
        # The target serves until its standard input closes: a FIFO it holds open itself. exec:
        # the agent's process for `name` is the target's, which `kill` then reaches.
        guest.command("start", name, "-", "mkfifo /tmp/%s.in && exec ferry_test_target 1048576 %s"
                      " <> /tmp/%s.in" % (name, guest.ip, name))
        rc, out = guest.command("until", name, 30, "^DESC ", timeout=30)
        if rc != 0:
            raise Failure("%s: target %s did not start: %s" % (guest.name, name, out[-5:]))
        _, out = guest.command("until", name, 5, "^(ADDR|DESC) ")
        text = "\n".join(out)
        addr = re.search(r"^LINE %s ADDR (\S+)" % name, text, re.M)
        desc = re.search(r"^LINE %s DESC (\S+)" % name, text, re.M)
        if addr is None or desc is None:
            raise Failure("%s: target %s printed no address or descriptor" % (guest.name, name))
        return addr.group(1), desc.group(1)

    def fault(self, wire, kind, a, b, healthy):
        name = "%s_%s" % (wire, kind)
        faulty = self.target(b, "tgt_" + kind)
        a.command("start", "probe_" + kind, "-",
                  "ferry_wire_probe --faulty %s %s --healthy %s %s --peer-timeout-ms %d"
                  % (faulty[0], faulty[1], healthy[0], healthy[1], PEER_TIMEOUT_MS))
        rc, out = a.command("until", "probe_" + kind, 60, "PROBE READY", timeout=60)
        if rc != 0:
            _, log = a.command("until", "healthy", 1, ".")
            raise Failure("%s: the probe did not get ready: %s; healthy target: %s"
                          % (name, out[-8:], log[-5:]))
        time.sleep(1)
        if kind == "kill":
            b.command("kill", "tgt_" + kind, 9)
        elif kind == "link_down":
            b.monitor("set_link wire off")
        elif kind == "freeze":
            b.monitor("stop")
        elif kind == "power_off":
            b.proc.kill()  # the guest's power cut: qemu gone, its end of the wire with it
        # Wait for PROBE DONE, not for the probe to exit: its exit may wait in the kernel for
        # the frozen wire to drain.
        rc, out = a.command("until", "probe_" + kind, FREEZE_LIMIT_S, "^PROBE DONE",
                            timeout=FREEZE_LIMIT_S)
        if kind == "link_down":
            b.monitor("set_link wire on")
        elif kind == "freeze":
            b.monitor("cont")
        rc, out = a.command("wait", "probe_" + kind, 60, timeout=60)
        text = "\n".join(out)
        metrics = dict((m.group(1), float(m.group(2)))
                       for m in re.finditer(r"^METRIC (\S+) (-?[0-9.e+]+)", text, re.M))
        error = re.search(r"^NOTE faulty peer error: (.*)$", text, re.M)
        self.faults.append((wire, kind, metrics, error.group(1) if error else "?"))
        if rc != 0:
            self.failures.append("%s: probe rc=%d (see %s)" % (name, rc, a.log.name))
        if kind != "power_off":
            b.command("kill", "tgt_" + kind, 9)

    def bench(self, a, b):
        """Ferry and perftest across the wire, the same sizes, interleaved (ratios.py names)."""
        dev = "-d rxe0 -x 1"
        pairs = [("write_lat_8", "ib_write_lat %s -s 8 -n 1000" % dev),
                 ("write_bw_64k", "ib_write_bw %s -s 65536 -n 1000" % dev),
                 ("read_bw_64k", "ib_read_bw %s -s 65536 -n 1000" % dev),
                 ("write_bw_1m", "ib_write_bw %s -s 1048576 -n 100" % dev),
                 ("read_bw_1m", "ib_read_bw %s -s 1048576 -n 100" % dev)]
        ferry = [("ferry_pingpong_8", "--op pingpong --sizes 8 --iters 1000 --wait-spin-us 5000",
                  "p50_us", "usec"),
                 ("ferry_write_bw_64k", "--op write --sizes 65536 --iters 1000 --concurrency 16"
                  " --same-area", "mb_per_s", "MB1e6/sec"),
                 ("ferry_read_bw_64k", "--op read --sizes 65536 --iters 1000 --concurrency 16"
                  " --same-area", "mb_per_s", "MB1e6/sec"),
                 ("ferry_write_bw_1m", "--op write --sizes 1048576 --iters 100 --concurrency 8"
                  " --same-area", "mb_per_s", "MB1e6/sec"),
                 ("ferry_read_bw_1m", "--op read --sizes 1048576 --iters 100 --concurrency 8"
                  " --same-area", "mb_per_s", "MB1e6/sec")]
        lines = []
        for r in range(1, self.args.rounds + 1):
            for (pname, pcmd), (fname, fargs, key, unit) in zip(pairs, ferry):
                b.command("start", "srv", "-", pcmd)
                b.command("listen", "srv", 30, "18515", timeout=30)
                rc, out = a.command("run", "%s_r%d" % (pname, r), 120, pcmd + " 10.99.0.2",
                                    timeout=120)
                b.command("wait", "srv", 30, timeout=30)
                if rc != 0:
                    self.failures.append("bench %s: rc=%d: %s" % (pname, rc, out[-3:]))
                lines += out
                b.command("start", "fsrv", "-", "ferry bench --listen 10.99.0.2:7000 --once")
                b.command("listen", "fsrv", 30, "7000", timeout=30)
                cmd = ("ferry bench --connect 10.99.0.2:7000 --transport verbs %s --json > /tmp/b.json"
                       " && cat /tmp/b.json && sed -n 's/.*\"%s\":\\([0-9.]*\\).*/METRIC %s_r%d \\1 %s/p'"
                       " /tmp/b.json" % (fargs, key, fname, r, unit.replace("/", "\\/")))
                rc, out = a.command("run", "%s_r%d" % (fname, r), 180, cmd, timeout=180)
                b.command("wait", "fsrv", 30, timeout=30)
                if rc != 0:
                    self.failures.append("bench %s: rc=%d: %s" % (fname, rc, out[-3:]))
                lines += out
        path = os.path.join(self.args.out, "two-guest-bench.log")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        print("two-guest: ferry across the wire vs perftest (unix datagram wire, one vCPU per guest):")
        sys.stdout.flush()
        subprocess.call([sys.executable, os.path.join(HERE, "ratios.py"), path, "--present"])

    def wire(self, wire, kinds, bench):
        print("two-guest: %s wire: booting A and B" % wire)
        sys.stdout.flush()
        t0 = time.monotonic()
        a, b = self.boot(wire)
        print("two-guest: %s wire: both guests up in %.1fs" % (wire, time.monotonic() - t0))
        try:
            healthy = self.target(a, "healthy")
            if bench:
                self.bench(a, b)
            for kind in kinds:
                t = time.monotonic()
                self.fault(wire, kind, a, b, healthy)
                print("two-guest: %s wire: %s done in %.1fs" % (wire, kind, time.monotonic() - t))
                sys.stdout.flush()
            a.command("poweroff", timeout=30)
        finally:
            a.stop()
            b.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", action="append", required=True)
    p.add_argument("--wires", default="unix,udp")
    p.add_argument("--faults", default="kill,link_down,freeze,power_off")
    p.add_argument("--no-bench", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=os.path.join(REPO, "build", "rdma-guest"))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    bins = args.bin
    for path in bins:
        if not os.access(path, os.X_OK):
            sys.exit("two-guest: %s is not an executable (build it first)" % path)
    missing = {"ferry", "ferry_test_target", "ferry_wire_probe"} - {os.path.basename(b) for b in bins}
    if missing:
        sys.exit("two-guest: --bin needs %s too" % ", ".join(sorted(missing)))
    work = tempfile.mkdtemp(prefix=".two-guest.", dir=args.out)
    try:
        initrd = os.path.join(work, "initrd.img")
        cmd = ["bash", os.path.join(HERE, "pack-guest.sh"), "--initrd", initrd, "--out", args.out]
        for b in bins:
            cmd += ["--bin", b]
        packed = subprocess.run(cmd, stdout=subprocess.PIPE, check=False, text=True)
        if packed.returncode != 0:
            sys.exit("two-guest: pack-guest.sh failed")
        vmlinuz = packed.stdout.split()[0]
        run = Run(args, vmlinuz, initrd, work)
        start = time.monotonic()
        kinds = args.faults.split(",")
        for i, wire in enumerate(args.wires.split(",")):
            try:
                run.wire(wire, kinds, bench=(i == 0 and not args.no_bench))
            except Failure as e:
                run.failures.append("%s wire: %s" % (wire, e))
        print("two-guest: fault table (peer_timeout %d ms; fail: last success -> every operation"
              " failed; stall: the healthy peer's longest gap between completions)" % PEER_TIMEOUT_MS)
        print("  %-5s %-10s %8s %9s %8s %7s %9s %8s  %s" % (
            "wire", "fault", "fail ms", "stall ms", "healthy", "errors", "shutdown", "destroy",
            "error"))
        for wire, kind, m, error in run.faults:
            print("  %-5s %-10s %8.0f %9.0f %8.0f %7.0f %9.0f %8.0f  %s" % (
                wire, kind, m.get("fail_ms", -1), m.get("healthy_worst_stall_ms", -1),
                m.get("healthy_ops", -1), m.get("healthy_errors", -1), m.get("shutdown_ms", -1),
                m.get("destroy_ms", -1), error[:60]))
        print("  (shutdown: Engine::shutdown(); destroy: the engine's destructor, which waits up to"
              " 1 s for queue pairs the wire still holds)")
        elapsed = time.monotonic() - start
        if run.failures:
            print("two-guest: FAIL in %.0fs" % elapsed)
            for f in run.failures:
                print("two-guest:   " + f)
            return 1
        print("two-guest: PASS in %.0fs (logs: %s/two-guest-*.log)" % (elapsed, args.out))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
