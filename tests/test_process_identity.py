"""A recorded pid is signalled only while it names the same process, and the pool host reaps its workers'
orphans (reliability review, finding 21)."""

from __future__ import annotations

import subprocess
import sys

from optuna_saturn.pools.process_identity import alive, kill_if_same, start_ticks


def test_a_pid_is_killed_only_while_it_names_the_process_that_was_recorded():
    """A worker's pid, reused by another process after the worker died, must not be killed: the start time
    recorded at the worker's hello tells them apart."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        recorded = start_ticks(process.pid)
        assert recorded is not None and alive(process.pid)
        kill_if_same(process.pid, recorded + 1)  # (another process's start: its pid was reused)
        assert process.poll() is None and alive(process.pid)
        kill_if_same(process.pid, recorded)
        assert process.wait(timeout=10) == -9
    finally:
        process.kill()
        process.wait()
    assert start_ticks(process.pid) is None or start_ticks(process.pid) != recorded


def test_a_subreaper_reaps_the_orphans_of_its_children():
    """A grandchild whose parent died is re-parented to the nearest subreaper (the pool host), not to PID 1."""
    script = """
import os, time
from optuna_saturn.pools.process_identity import become_subreaper
assert become_subreaper()
child = os.fork()
if child == 0:
    grandchild = os.fork()
    if grandchild == 0:
        time.sleep(30)
        os._exit(0)
    print(grandchild, flush=True)
    os._exit(0)
os.waitpid(child, 0)
def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[-1].split()[1])
orphans = []
for _ in range(100):  # (the re-parenting follows the child's exit)
    orphans = [int(p) for p in os.listdir("/proc") if p.isdigit() and parent_of(p) == os.getpid()]
    if orphans:
        break
    time.sleep(0.05)
print("adopted", len(orphans), flush=True)
for pid in orphans:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "adopted 1" in out.stdout, out.stdout
