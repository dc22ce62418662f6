# Every second: processes that used > 0.05 CPU-s in it (pid, name, cmd head), to a log.
import psutil, time, sys
prev = {}
out = open(sys.argv[1], "w")
while True:
    cur = {}
    for p in psutil.process_iter():
        try:
            t = p.cpu_times(); cur[p.pid] = (t.user + t.system, p.name(), " ".join(p.cmdline()[:6])[:120])
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess): pass
    stamp = time.strftime("%H:%M:%S")
    for pid, (c, name, cmd) in cur.items():
        d = c - prev.get(pid, (c,))[0]
        if d > 0.05: out.write(f"{stamp} {pid} {d:.2f} {name} {cmd}\n")
    out.flush(); prev = cur; time.sleep(1)
