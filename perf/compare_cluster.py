"""perf/compare --cluster: AllReduce across emulated clusters (scripts/cluster).

For each shape (hosts x ranks per host) and link rate, brings a cluster up
under a name of its own (always taken down again, also on failure or Ctrl-C),
measures each link with iperf3 (scripts/cluster bench) before and after,
runs AllReduce with the tuner's own pick, forced `hier` and the forced flat
ring (--all-algos: also halving_doubling and tree; perf/cluster_allreduce.sh,
which also reports the cost model's
prediction of each plan from rank 0's MESHCCL_DEBUG=INFO line), and Open
MPI's MPI_Allreduce with its default selection and with coll/han preferred
(perf/cluster_vs_mpi's mpirun across the same namespaces, TCP on each host's
eth0), then writes cluster.md (tables and the targets), cluster.csv and
cluster.png into --out.

Only the Python standard library is needed; matplotlib draws the plot when
the running interpreter or /usr/bin/python3 has it.
"""
import csv
import datetime
import importlib.machinery
import importlib.util
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CLUSTER = os.path.join(ROOT, "scripts", "cluster")
ALLREDUCE = os.path.join(HERE, "cluster_allreduce.sh")
KINDS = ["auto", "hier", "ring", "halving_doubling", "tree", "ompi", "ompi_han"]
KIND_TITLE = {"auto": "meshccl (tuner)", "hier": "meshccl hier", "ring": "meshccl flat ring",
              "halving_doubling": "meshccl halving-doubling", "tree": "meshccl tree",
              "ompi": "Open MPI", "ompi_han": "Open MPI han"}
# meshccl's plans, each with the model's prediction (--all-algos adds the last two).
MODELLED = ["auto", "hier", "ring", "halving_doubling", "tree"]
SHAPES = "2x2,2x4,4x2,4x1"
RATES = "0.1,0.2,1,10,25"
QUICK_SHAPES, QUICK_RATES, QUICK_MAX = "2x2,4x1", "0.2,1", 16 << 20
# A point whose ranks used more than this share of the machine's cores is
# CPU-bound: it counts neither for nor against a link target.
CPU_BOUND_SHARE = 0.5


def traffic_factor(algo, n, h):
    """TCP payload each host sends per AllReduce byte under `algo` (ranks
    placed host by host): the flat ring crosses each host's link once per
    direction with 2(n-1)/n of the data, hier's owners exchange 2(H-1)/H of
    it (ring or halving-doubling across hosts). None where no figure is
    derived (tree, the direct algorithms)."""
    if algo == "ring":
        return 2 * (n - 1) / n
    if algo == "hier":
        return 2 * (h - 1) / h
    return None


def load_vs_mpi():
    """perf/cluster_vs_mpi (no .py suffix) as a module: its mpirun command."""
    path = os.path.join(HERE, "cluster_vs_mpi")
    loader = importlib.machinery.SourceFileLoader("cluster_vs_mpi", path)
    spec = importlib.util.spec_from_loader("cluster_vs_mpi", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def human(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError):
        return -1.0


def parse_shapes(text):
    out = []
    for s in text.split(","):
        h, k = s.lower().split("x")
        h, k = int(h), int(k)
        if h < 2 or k < 1 or h * k > 16:
            raise ValueError(f"shape {s}: need 2 or more hosts and at most 16 ranks")
        out.append((h, k))
    return out


def parse_rates(text):
    out = [float(r) for r in text.split(",")]
    if any(r <= 0 or r > 100 for r in out):
        raise ValueError("rates are Gbit/s in (0, 100]")
    return out


class Interrupted(Exception):
    pass


def on_signal(signum, frame):
    raise Interrupted(f"signal {signum}")


class ClusterRun:
    def __init__(self, a, note):
        self.a = a
        self.note = note
        self.vs_mpi = load_vs_mpi()
        self.build = os.path.abspath(a.build)
        self.log = open(os.path.join(a.out, "cluster.log"), "a" if a.report_only else "w")
        self.results = []   # one dict per (shape, rate)
        self.failures = []
        self.up = set()

    def sh(self, cmd, timeout, env=None):
        t0 = time.time()
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=timeout, env=env)
            status, out = p.returncode, p.stdout
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            status = 124
        self.log.write(f"$ {' '.join(cmd)}\n{out}\n[exit {status}, {time.time() - t0:.0f} s]\n")
        self.log.flush()
        return status, out

    # ---- the cluster's life ------------------------------------------------
    def cluster_up(self, name, hosts, rate):
        rate_arg = f"{int(rate * 1000)}mbit"
        self.up.add(name)  # before: an interrupted `up` leaves namespaces to take down
        status, out = self.sh([CLUSTER, "up", "--hosts", str(hosts), "--rate", rate_arg, "--name", name], 120)
        if status != 0:
            raise RuntimeError(f"scripts/cluster up failed: {out.strip()[-300:]}")

    def cluster_down(self, name):
        if name in self.up:
            self.sh([CLUSTER, "down", "--name", name], 120)
            self.up.discard(name)

    def link_gbit(self, name):
        status, out = self.sh([CLUSTER, "bench", "--name", name, "--time", "2"], 120)
        for line in out.splitlines():
            if line.startswith("link_bps="):
                return float(line.split("=", 1)[1]) / 1e9
        return 0.0

    # ---- measurements ------------------------------------------------------
    def bands(self):
        """(lo, hi, iterations): many iterations for the small sizes, two
        for the large ones (one op of 256 MiB at 1 Gbit/s takes seconds)."""
        out = []
        if self.a.min < 64 << 10:
            out.append((self.a.min, min(self.a.max, 32 << 10), 20))
        if self.a.max >= 64 << 10:
            out.append((max(self.a.min, 64 << 10), self.a.max, 2))
        return [b for b in out if b[0] <= b[1]]

    def meshccl(self, name, hosts, per, rows):
        """cluster_allreduce.sh: auto, hier and ring, each with the model's
        prediction of the plan it ran."""
        env = dict(os.environ, CLUSTER_BENCH="0", CLUSTER_TIMEOUT=str(self.a.timeout),
                   CLUSTER_ALGOS="default hier ring" + (" halving_doubling tree" if self.a.all_algos else ""))
        for lo, hi, iters in self.bands():
            cmd = [ALLREDUCE, name, str(hosts * per), str(per), self.build, str(lo), str(hi), str(iters)]
            status, out = self.sh(cmd, 3 * self.a.timeout + 60, env)
            got = 0
            for line in out.splitlines():
                f = line.split()
                if line.startswith("run ") and "failed" in line:
                    self.failures.append(f"{name} {hosts}x{per}: meshccl {line}")
                if len(f) != 9 or not f[0].isdigit():
                    continue
                size, algo, pick, meas, pred = int(f[0]), f[1], f[2], float(f[3]), float(f[4])
                kind = "auto" if algo == "default" else algo
                self.keep(rows, kind, size, meas, pred, pick, float(f[6]), float(f[8]))
                got += 1
            if status != 0 or got == 0:
                self.failures.append(f"{name} {hosts}x{per} meshccl {human(lo)}..{human(hi)}: exit {status}, {got} rows")

    def mpi(self, name, hosts, per, rows):
        for kind, mca in (("ompi", []), ("ompi_han", ["--mca", "coll_han_priority", "100"])):
            for lo, hi, iters in self.bands():
                sweep = ["-b", str(lo), "-e", str(hi), "-f", "4", "-n", str(iters), "-w", "1", "-c", "0"]
                cmd = self.vs_mpi.mpi_command(name, hosts, per, self.build, sweep, mca)
                status, out = self.sh(cmd, self.a.timeout)
                res = self.vs_mpi.parse_mpi(out)
                if status != 0 or not res:
                    self.failures.append(f"{name} {hosts}x{per} {kind} {human(lo)}..{human(hi)}: exit {status}")
                for size, (t, _, _) in res.items():
                    self.keep(rows, kind, size, t, 0.0, "-", 0.0, 0.0)

    @staticmethod
    def keep(rows, kind, size, t, pred, pick, payload, cores):
        """Best (fastest) repetition of each point, with its prediction, the
        TCP payload each host sent per op and the ranks' cores."""
        if t <= 0:
            return
        old = rows.setdefault(kind, {}).get(size)
        if old is None or t < old[0]:
            rows[kind][size] = (t, pred, pick, payload, cores)

    @staticmethod
    def cpu_bound(point):
        return point is not None and point[4] > CPU_BOUND_SHARE * (os.cpu_count() or 1)

    @staticmethod
    def traffic(res, point, algo, size):
        """Measured / theoretical TCP payload per host, or None."""
        n, h = res["hosts"] * res["per"], res["hosts"]
        f = traffic_factor(algo, n, h)
        if point is None or f is None or point[3] <= 0 or size == 0:
            return None
        return point[3] / (f * size)

    def one(self, idx, hosts, per, rate):
        name = f"{self.a.cluster_prefix}{os.getpid() % 100000}{idx}"
        res = {"hosts": hosts, "per": per, "rate": rate, "name": name, "rows": {},
               "load": [loadavg()], "link": [], "started": datetime.datetime.utcnow().strftime("%H:%M")}
        self.results.append(res)
        self.note(f"[{hosts}x{per}, {rate:g} Gbit/s] cluster {name} (load {res['load'][0]:.1f})")
        try:
            self.cluster_up(name, hosts, rate)
            res["link"].append(self.link_gbit(name))
            for rep in range(self.a.reps):
                self.meshccl(name, hosts, per, res["rows"])
                self.mpi(name, hosts, per, res["rows"])
            res["link"].append(self.link_gbit(name))
        except RuntimeError as e:
            self.failures.append(f"{name} {hosts}x{per} {rate:g} Gbit/s: {e}")
            self.note(f"  ! {e}")
        finally:
            self.cluster_down(name)
            res["load"].append(loadavg())

    def run_all(self):
        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        t0 = time.time()
        idx = 0
        try:
            for hosts, per in self.a.shapes:
                for rate in self.a.rates:
                    if time.time() - t0 > self.a.budget:
                        self.failures.append(f"{hosts}x{per} {rate:g} Gbit/s: not run (--budget {self.a.budget} s spent)")
                        continue
                    self.one(idx, hosts, per, rate)
                    idx += 1
        except Interrupted as e:
            self.failures.append(f"interrupted ({e}); clusters taken down")
            self.note(f"interrupted ({e}); clusters taken down")
        finally:
            for name in list(self.up):
                self.cluster_down(name)
            for s, h in old.items():
                signal.signal(s, h)

    # ---- reporting ---------------------------------------------------------
    @staticmethod
    def limit_gbs(res):
        """Link limit of the algorithm bandwidth, B H / (2 (H-1)), GB/s,
        with B the better iperf3 figure of the run (bytes/s)."""
        b = max(res["link"] or [0]) / 8
        h = res["hosts"]
        return b * h / (2 * (h - 1))

    @staticmethod
    def traffic_ratio(res):
        n, h = res["hosts"] * res["per"], res["hosts"]
        return (2 * (n - 1) / n) / (2 * (h - 1) / h)

    def table(self, res):
        rows = res["rows"]
        lim = self.limit_gbs(res)
        link = " / ".join(f"{x:.2f}" for x in res["link"]) or "-"
        load = " / ".join(f"{x:.1f}" for x in res["load"])
        out = [f"#### {res['hosts']}x{res['per']}, tbf {res['rate']:g} Gbit/s\n",
               f"cluster {res['name']} from {res['started']} UTC; iperf3 link before / after: {link} Gbit/s; "
               f"link limit B H/(2(H-1)) = {1000 * lim:.1f} MB/s; load average before / after: {load}\n",
               "| size | tuner: pick | time (us) | predicted (us) | pred/meas | hier (us) | ring (us) | "
               "Open MPI (us) | Open MPI han (us) | hier algbw / limit | ring / hier | best Open MPI / tuner | "
               "hier pred/meas | pred/meas: ring, halving-doubling, tree (us measured) | "
               "bytes sent / theory: hier, ring | cores: tuner, hier, ring |",
               "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
               "| ---: |"]
        sizes = sorted(set().union(*[set(v) for v in rows.values()] or [set()]))
        for s in sizes:
            g = {k: rows.get(k, {}).get(s) for k in KINDS}
            auto, hier, ring = g["auto"], g["hier"], g["ring"]
            mpis = [g[k][0] for k in ("ompi", "ompi_han") if g[k]]
            cells = [human(s), auto[2] if auto else "-", f"{auto[0]:.1f}" if auto else "-",
                     f"{auto[1]:.1f}" if auto and s >= 64 << 10 and auto[1] > 0 else "-",
                     f"{auto[1] / auto[0]:.2f}" if auto and s >= 64 << 10 and auto[1] > 0 else "-"]
            cells += [f"{g[k][0]:.1f}" if g[k] else "-" for k in ("hier", "ring", "ompi", "ompi_han")]
            cells.append(f"{s / hier[0] / 1e3 / lim:.2f}" if hier and lim > 0 else "-")
            cells.append(f"{ring[0] / hier[0]:.2f}" if hier and ring else "-")
            cells.append(f"{min(mpis) / auto[0]:.2f}" if auto and mpis else "-")
            cells.append(f"{hier[1] / hier[0]:.2f}" if hier and s >= 64 << 10 and hier[1] > 0 else "-")
            cells.append(", ".join(f"{g[k][1] / g[k][0]:.2f}" + (f" ({g[k][0]:.0f})" if k != "ring" else "")
                                   + (" CPU-bound" if self.cpu_bound(g[k]) else "")
                                   if g.get(k) and s >= 64 << 10 and g[k][1] > 0 else "-"
                                   for k in ("ring", "halving_doubling", "tree")))
            tr = [self.traffic(res, g[k], k, s) for k in ("hier", "ring")]
            cells.append(", ".join(f"{x:.3f}" if x is not None else "-" for x in tr))
            cells.append(", ".join((f"{g[k][4]:.2f}" + (" CPU-bound" if self.cpu_bound(g[k]) else ""))
                                   if g[k] and g[k][4] > 0 else "-" for k in ("auto", "hier", "ring")))
            out.append("| " + " | ".join(cells) + " |")
        return "\n".join(out) + "\n"

    def verdicts(self, res):
        """The issue's four targets on one cluster: (text, met) each."""
        rows, lim = res["rows"], self.limit_gbs(res)
        hier, ring, auto = rows.get("hier", {}), rows.get("ring", {}), rows.get("auto", {})
        out = []
        big = [s for s in sorted(hier) if s >= 4 << 20 and not self.cpu_bound(hier[s])]
        if big and lim > 0:
            worst = min(s / hier[s][0] / 1e3 / lim for s in big)
            out.append((f"{worst:.2f}", worst >= 0.9))
        else:
            out.append(("-", None))
        r = self.traffic_ratio(res)
        both = [s for s in sorted(hier)
                if s >= 4 << 20 and s in ring and not self.cpu_bound(hier[s]) and not self.cpu_bound(ring[s])]
        if r > 1 and both:
            worst = min(ring[s][0] / hier[s][0] for s in both)
            out.append((f"{worst:.2f} (need {0.9 * r:.2f})", worst >= 0.9 * r))
        else:
            out.append((f"ratio {r:.2f}: n/a", None))
        mpi = {}
        for k in ("ompi", "ompi_han"):
            for s, v in rows.get(k, {}).items():
                mpi[s] = min(mpi.get(s, v[0]), v[0])
        shared = [s for s in sorted(auto) if s in mpi]
        large = [mpi[s] / auto[s][0] for s in shared if s >= 1 << 20]
        small = [mpi[s] / auto[s][0] for s in shared if s < 1 << 20]
        if large:
            ok = min(large) >= 1.5 and (not small or min(small) >= 1.0)
            out.append((f"{min(large):.2f} from 1 MiB; small sizes {min(small):.2f}" if small
                        else f"{min(large):.2f} from 1 MiB", ok))
        else:
            out.append(("-", None))
        pred = [auto[s][1] / auto[s][0] for s in auto if s >= 64 << 10 and auto[s][1] > 0]
        if pred:
            inside = sum(1 for p in pred if 0.85 <= p <= 1.15)
            out.append((f"{inside}/{len(pred)} within; {min(pred):.2f}..{max(pred):.2f}", inside == len(pred)))
        else:
            out.append(("-", None))
        every = [pt[1] / pt[0] for k in MODELLED for sz, pt in rows.get(k, {}).items()
                 if sz >= 64 << 10 and pt[1] > 0 and not self.cpu_bound(pt)]
        if every:
            inside = sum(1 for p in every if 0.85 <= p <= 1.15)
            out.append((f"{inside}/{len(every)} within; {min(every):.2f}..{max(every):.2f}", inside == len(every)))
        else:
            out.append(("-", None))
        tr = [x for k in ("hier", "ring") for sz, pt in rows.get(k, {}).items() if sz >= 64 << 10
              for x in [self.traffic(res, pt, k, sz)] if x is not None]
        if tr:
            out.append((f"{min(tr):.3f}..{max(tr):.3f}", all(0.95 <= x <= 1.05 for x in tr)))
        else:
            out.append(("-", None))
        return out

    def targets_md(self):
        names = ["hier algbw >= 0.9 x B H/(2(H-1)), from 4 MiB (lowest)",
                 "ring time / hier time >= 0.9 x (2(n-1)/n)/(2(H-1)/H) where > 1, from 4 MiB (lowest)",
                 "tuner >= 1.5x best Open MPI from 1 MiB, not slower below (lowest time ratio)",
                 "model within 15% of the tuner's plan from 64 KiB (pred/meas)",
                 "model within 15% of every plan run, not CPU-bound, from 64 KiB (pred/meas)",
                 "TCP bytes each host sent within 5% of theory, hier and ring from 64 KiB"]
        lines = ["### Targets\n", "| cluster | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
        for res in self.results:
            if not res["rows"]:
                continue
            cells = []
            for text, met in self.verdicts(res):
                mark = "" if met is None else (" **met**" if met else " not met")
                cells.append(text + mark)
            lines.append(f"| {res['hosts']}x{res['per']}, {res['rate']:g} Gbit/s | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def load_csv(self):
        """The results of an earlier run from --out/cluster.csv (--report-only)."""
        by = {}
        with open(os.path.join(self.a.out, "cluster.csv")) as f:
            for r in csv.DictReader(f):
                key = (int(r["hosts"]), int(r["ranks_per_host"]), float(r["rate_gbit"]))
                res = by.get(key)
                if res is None:
                    res = by[key] = {"hosts": key[0], "per": key[1], "rate": key[2], "name": "-", "started": "-",
                                     "rows": {}, "link": [float(r["link_gbit_before"]), float(r["link_gbit_after"])],
                                     "load": [float(r["load_before"]), float(r["load_after"])]}
                    self.results.append(res)
                res["rows"].setdefault(r["kind"], {})[int(r["bytes"])] = (
                    float(r["time_us"]), float(r["predicted_us"] or 0), r["pick"],
                    float(r.get("payload_per_host") or 0), float(r.get("cores") or 0))

    def write(self, argv):
        out = self.a.out
        with open(os.path.join(out, "cluster.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["hosts", "ranks_per_host", "rate_gbit", "link_gbit_before", "link_gbit_after",
                        "load_before", "load_after", "kind", "bytes", "time_us", "algbw_gbs", "predicted_us", "pick",
                        "payload_per_host", "cores"])
            for res in self.results:
                link = (res["link"] + [0, 0])[:2]
                load = (res["load"] + [0, 0])[:2]
                for kind in KINDS:
                    for s, (t, pred, pick, payload, cores) in sorted(res["rows"].get(kind, {}).items()):
                        w.writerow([res["hosts"], res["per"], res["rate"], link[0], link[1], load[0], load[1],
                                    kind, s, t, s / t / 1e3, pred or "", pick, payload or "", cores or ""])
        md = [f"## AllReduce across emulated clusters ({datetime.date.today()})\n",
              f"Command: `{' '.join(argv)}`. Times: best of {self.a.reps} run(s) per size, out of place, "
              "float32 sum. meshccl: perf/cluster_allreduce.sh (tuner's pick, forced hier, forced flat ring; "
              "predicted = rank 0's cost-model estimate of the plan it ran, from that run's own init "
              "measurement). Open MPI: perf/cluster_vs_mpi's mpirun (MPI_Allreduce, btl tcp,self on "
              "eth0: no shared memory, see perf/cluster_vs_mpi), default and `--mca coll_han_priority 100`. "
              "Bytes sent: the TCP payload of each host's eth0 per op over the timed loop (tx_bytes less 66 "
              "bytes of headers per packet), over the algorithm's own bytes per host (ring 2(n-1)/n, hier "
              "2(H-1)/H of the data). Cores: the ranks' user+system time over the loop's wall time; above "
              f"{CPU_BOUND_SHARE:g} of this machine's {os.cpu_count()} cores a point is CPU-bound and left out "
              "of the link targets.\n", self.targets_md()]
        md += [self.table(res) for res in self.results if res["rows"]]
        if self.failures:
            md.append("### Runs that failed or were left out\n\n" + "\n".join(f"- {x}" for x in self.failures) + "\n")
        with open(os.path.join(out, "cluster.md"), "w") as f:
            f.write("\n".join(md))
        plot(out, self.note)


def plot(out, note):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        system = "/usr/bin/python3"
        if os.path.realpath(sys.executable) != os.path.realpath(system) and os.access(system, os.X_OK):
            p = subprocess.run([system, os.path.abspath(__file__), "--plot", out], capture_output=True, text=True)
            if p.returncode == 0:
                return
            note(p.stdout + p.stderr)
        note("matplotlib not installed: no plot")
        return
    groups = {}
    with open(os.path.join(out, "cluster.csv")) as f:
        for r in csv.DictReader(f):
            key = (int(r["hosts"]), int(r["ranks_per_host"]), float(r["rate_gbit"]))
            g = groups.setdefault(key, {"link": max(float(r["link_gbit_before"]), float(r["link_gbit_after"]))})
            g.setdefault(r["kind"], []).append((int(r["bytes"]), float(r["algbw_gbs"]),
                                                float(r["predicted_us"] or 0)))
            if r["kind"] == "auto" and r.get("cores"):
                g.setdefault("cores", []).append((int(r["bytes"]), float(r["cores"])))
    if not groups:
        return
    keys = sorted(groups)
    cols = min(3, len(keys))
    rows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4 * rows), squeeze=False)
    for i, key in enumerate(keys):
        ax = axes[i // cols][i % cols]
        g = groups[key]
        for kind in KINDS:
            pts = sorted(g.get(kind, []))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=KIND_TITLE[kind])
        pred = [(s, s / p / 1e3) for s, _, p in sorted(g.get("auto", [])) if p > 0 and s >= 64 << 10]
        if pred:
            ax.plot([p[0] for p in pred], [p[1] for p in pred], linestyle=":", color="black", label="model (tuner's plan)")
        h = key[0]
        if g["link"] > 0:
            ax.axhline(g["link"] / 8 * h / (2 * (h - 1)), color="gray", linestyle="--", linewidth=1,
                       label="link limit B H/(2(H-1))")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"AllReduce {key[0]}x{key[1]}, {key[2]:g} Gbit/s")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("algbw (GB/s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        cores = sorted(g.get("cores", []))
        if cores:  # the tuner's CPU use on a second axis
            ax2 = ax.twinx()
            ax2.plot([c[0] for c in cores], [c[1] for c in cores], color="tab:red", linestyle=":", marker="x",
                     linewidth=1)
            ax2.set_ylabel("tuner's ranks: cores used", color="tab:red", fontsize=8)
            ax2.set_ylim(0, max(os.cpu_count() or 1, max(c[1] for c in cores)))
    fig.tight_layout()
    fig.savefig(os.path.join(out, "cluster.png"), dpi=80)


def main(a, note):
    """perf/compare's --cluster mode; a: its parsed arguments."""
    if os.geteuid() != 0 and not a.report_only:
        sys.exit("perf/compare --cluster: scripts/cluster needs root (network namespaces)")
    for exe in ("tools/meshrun/meshrun", "perf/all_reduce_perf", "perf/mpi_bench"):
        if not os.access(os.path.join(a.build, exe), os.X_OK):
            sys.exit(f"perf/compare --cluster: {a.build}/{exe} not built")
    try:
        a.shapes = parse_shapes(a.shapes or (QUICK_SHAPES if a.quick else SHAPES))
        a.rates = parse_rates(a.rates or (QUICK_RATES if a.quick else RATES))
    except ValueError as e:
        sys.exit(f"perf/compare --cluster: {e}")
    # scripts/cluster takes names of 1..12 of [a-z0-9]; the pid and index add up to 7.
    if not (1 <= len(a.cluster_prefix) <= 5 and all(c in "abcdefghijklmnopqrstuvwxyz0123456789" for c in a.cluster_prefix)):
        sys.exit("perf/compare --cluster: --cluster-prefix must be 1..5 of [a-z0-9]")
    if a.quick:
        a.max = min(a.max, QUICK_MAX)
    os.makedirs(a.out, exist_ok=True)
    run = ClusterRun(a, note)
    if a.report_only:
        run.load_csv()
        run.write(sys.argv)
        return 0
    run.run_all()
    run.write(sys.argv)
    note(f"wrote {a.out}/cluster.md, {a.out}/cluster.csv, {a.out}/cluster.png")
    return 0 if not run.failures else 1


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--plot":
    plot(sys.argv[2], print)
