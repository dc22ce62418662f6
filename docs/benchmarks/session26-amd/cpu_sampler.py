"""Every second, each process that used more than 0.05 CPU-seconds in it: time, pid, CPU-seconds, name and
the head of its command line, appended to the file named by the first argument. Runs until killed.

Run: python docs/benchmarks/session26-amd/cpu_sampler.py /tmp/cpu.log &   (beside a benchmark)"""

import sys
import time

import psutil

previous: dict[int, float] = {}
with open(sys.argv[1], "w") as log:
    while True:
        current: dict[int, float] = {}
        stamp = time.strftime("%H:%M:%S")
        for process in psutil.process_iter():
            try:
                times = process.cpu_times()
                current[process.pid] = times.user + times.system
                used = current[process.pid] - previous.get(process.pid, current[process.pid])
                if used > 0.05:
                    command = " ".join(process.cmdline()[:6])[:120]
                    log.write(f"{stamp} {process.pid} {used:.2f} {process.name()} {command}\n")
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        log.flush()
        previous = current
        time.sleep(1)
