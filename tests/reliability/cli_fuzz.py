#!/usr/bin/env python3
"""Junk at every edge of the `mlo` command: each flag of each command and
each environment variable the tool reads gets empty, huge, negative, NaN,
1e999, random-byte, very long and wrongly-suffixed values.

Usage: cli_fuzz.py MLO_BINARY [--all] [--seed N] [--budget SECONDS]

Flags are discovered from `mlo CMD --help`, so a flag added later is fuzzed
without touching this file.  What must hold for every invocation:
  * it ends with an exit code the tool documents (0-4): never a signal,
    never a sanitizer report (sanitizer builds abort, which is a signal);
    a hang is judged by progress, not by the clock (a loaded machine makes
    an invocation slow, not hung): STALL_S seconds without a tick of CPU
    time, or more than CPU_LIMIT_S seconds of CPU in all;
  * a non-zero exit comes with a message on stderr;
  * a value that cannot mean anything for a flag (empty, NaN, 1e999, random
    bytes, an unknown unit, a string where a number is due, a word outside
    the flag's list) exits 2 — bad usage, as docs/cli.md promises.
Values that may legitimately be accepted (a path, a number in range) only
have to satisfy the first two rules.  Prints "invocations: N" and a line per
failure; exit 1 if any.  Registered with ctest as `cli_fuzz` (label cli).
"""
import concurrent.futures
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

STALL_S = 60  # one invocation making no CPU progress this long is hung
CPU_LIMIT_S = 120  # or one that spends this much CPU (a runaway loop)
SCALE = "0.0002"  # a ~15 MiB pipeline

# Values that no number, size, choice or KEY=VALUE flag may accept.
NEVER_VALID = [
    "", "nan", "-inf", "1e999", "-1e999", "abc", "12Q", "1KiBB", "1.5.5", "0x10", "=",
    "%s%n%x%p", " ", "\u00e9\u00e8", "18446744073709551616", "-9223372036854775809",
    "9" * 5000, "A" * 100000,
]
# Values a flag may accept or refuse depending on what it means; either way
# no crash.  (No value here may start real work of unbounded size: "1" is
# left out because `synth --scale 1` writes a full-size 69 GB pipeline.)
MAYBE_VALID = {
    "number": ["0", "-0", "-1", "1e-999", "0.0", "1e308", "9223372036854775807",
               "-9223372036854775808", "4294967296", "8e9", "1G", "0B"],
    "pair": ["dit=1", "dit=0", "dit=-1", "dit=nan", "dit=1e999", "x=dit", "=dit", "dit=",
             "vae=vae", "text_encoder=vae"],
    # Paths are made inside the run's own temporary folder (special_paths):
    # no test hands a real device such as /dev/null to a flag that writes.
    "path": ["{missing}/dir/file", "{fifo}", "{node}", "{folder}", ".", "..",
             "x" * 4097 + "/y", "%s%n"],
    "platform": ["host:capacity=0", "host:capacity=-1", "host:jitter=2", "host:bw=nan",
                 "cuda:99", "opencl:-1", "host:" + "a" * 10000 + "=1",
                 "fault:kind=copy,nth=1,inner=host", "fault:inner=fault:inner=host",
                 "fault:kind=nope"],
    "choice": ["Event", "none ", "model,none"],
}
# How each --help metavariable is treated: its MAYBE_VALID list, and whether
# every NEVER_VALID value must be refused with exit 2.
METAVARS = {
    "N": ("number", True), "S": ("number", True), "F": ("number", True),
    "SIZE": ("number", True), "MODE": ("choice", True), "ROLE=T": ("pair", True),
    "NAME=ROLE": ("pair", True), "P": ("platform", True), "FILE": ("path", False),
    "FILE.svg": ("path", False), "DIR": ("path", False), "CKPT": ("path", False),
}


def random_junk(rng, n):
    out = []
    for _ in range(n):
        raw = bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 64)))
        out.append(raw)  # bytes: passed to exec as they are (no NUL possible)
    return out


def run(mlo, args, env=None, cwd=None):
    full_env = dict(os.environ)
    full_env["MLO_NO_PROGRESS"] = "1"
    full_env.setdefault("MLO_LOG", "warn")
    if env:
        full_env.update(env)
    argv = [os.fsencode(mlo)] + [a if isinstance(a, bytes) else os.fsencode(a) for a in args]
    env_b = {os.fsencode(k): v if isinstance(v, bytes) else os.fsencode(v)
             for k, v in full_env.items()}
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(argv, stdout=out, stderr=err, env=env_b, cwd=cwd)
        hung = None
        last_cpu, last_tick = -1.0, time.monotonic()
        while p.poll() is None:
            try:
                p.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                pass
            cpu = cpu_seconds(p.pid)
            now = time.monotonic()
            if cpu is None:
                continue
            if cpu > last_cpu:
                last_cpu, last_tick = cpu, now
            if now - last_tick > STALL_S:
                hung = f"no CPU progress for {STALL_S} s"
            elif cpu > CPU_LIMIT_S:
                hung = f"over {CPU_LIMIT_S} s of CPU"
            if hung:
                p.kill()
                p.wait()
                return None, hung, now - t0
        err.seek(0)
        return p.returncode, err.read().decode("utf-8", "replace"), time.monotonic() - t0


def _stat(pid):
    """(ppid, user + system ticks of its threads and its reaped children)
    from /proc/PID/stat; None once it has gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[1]), sum(int(x) for x in fields[11:15])
    except (OSError, IndexError, ValueError):
        return None


def cpu_seconds(pid):
    """CPU seconds of a running process and every process under it, from
    /proc; None once it has gone.  The tree, not the process: `mlo demo`
    waits while its ranks (child processes) work, and a wait is not a hang
    (its own counters move only when a child is reaped)."""
    top = _stat(pid)
    if top is None:
        return None
    children, ticks = {}, {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                children.setdefault(st[0], []).append(int(name))
                ticks[int(name)] = st[1]
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += ticks.get(p, top[1] if p == pid else 0)
        todo.extend(children.get(p, []))
    return total / os.sysconf("SC_CLK_TCK")


def discover(mlo, cmd):
    """(flag, metavar or None) for each flag listed by `mlo CMD --help`."""
    out = subprocess.run([mlo, cmd, "--help"], capture_output=True, text=True,
                         env={**os.environ, "MLO_NO_PROGRESS": "1"}).stdout
    flags = {}
    for m in re.finditer(r"^\s+(--[a-z][a-z0-9-]*)(?:[ =]([A-Z][A-Za-z0-9.=_]*))?", out, re.M):
        flags.setdefault(m.group(1), m.group(2))
    flags.pop("--help", None)
    return flags


def check(problems, what, rc, err, strict):
    if rc is None:
        problems.append(f"{what}: hung ({err})")
    elif rc < 0 or rc >= 128:
        problems.append(f"{what}: killed by signal / crashed (exit {rc}): {err[-800:]}")
    elif "Sanitizer" in err or "runtime error:" in err:
        problems.append(f"{what}: sanitizer report: {err[-800:]}")
    elif rc > 4:
        problems.append(f"{what}: undocumented exit code {rc}: {err[-300:]}")
    elif rc != 0 and not err.strip():
        problems.append(f"{what}: exit {rc} without a message")
    elif strict and rc != 2:
        problems.append(f"{what}: exit {rc}, expected 2 (bad usage): {err[-300:]}")


def short(v):
    s = v.decode("latin-1") if isinstance(v, bytes) else v
    return repr(s if len(s) <= 40 else s[:37] + "...")


def main():
    mlo = os.path.abspath(sys.argv[1])
    seed = 1
    budget = 240.0
    every = False
    argv = sys.argv[2:]
    while argv:
        if argv[0] == "--all":
            every = True
            argv = argv[1:]
            continue
        if argv[0] == "--seed":
            seed = int(argv[1])
        elif argv[0] == "--budget":
            budget = float(argv[1])
        argv = argv[2:]
    rng = random.Random(seed)
    tmp = tempfile.mkdtemp(prefix="mlo-cli-fuzz-")
    try:
        special_paths(tmp)
        ckpt = os.path.join(tmp, "wan")
        rc, err, _ = run(mlo, ["synth", "wan2.2-t2v", ckpt, "--scale", SCALE])
        if rc != 0:
            print(f"cannot generate the test pipeline: {err}")
            return 1
        return fuzz(mlo, ckpt, tmp, rng, budget, seed, every)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def special_paths(tmp):
    """Fills in the {placeholders} of MAYBE_VALID["path"] with things made in
    tmp: a FIFO, a device node like /dev/null (a socket when not root), a
    folder, and a path under a missing folder."""
    import socket
    import stat
    made = {"missing": os.path.join(tmp, "missing"), "fifo": os.path.join(tmp, "fifo"),
            "node": os.path.join(tmp, "node"), "folder": os.path.join(tmp, "folder")}
    os.mkfifo(made["fifo"])
    os.mkdir(made["folder"])
    try:
        os.mknod(made["node"], 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        s = socket.socket(socket.AF_UNIX)
        s.bind(made["node"])
        s.close()
    MAYBE_VALID["path"] = [v.format(**made) if "{" in v else v for v in MAYBE_VALID["path"]]
    return made


def pick(values, rng, every):
    """All values, or (the default) the first three — empty, NaN, 1e999 for
    the junk lists — and a seeded half of the rest: every start of the tool
    costs ~0.1 s (it maps the CUDA libraries), and the flags share their
    parsers, so the suite samples and `--all` (the slow variant) covers."""
    if every:
        return values
    rest = values[3:]
    return values[:3] + rng.sample(rest, (len(rest) + 1) // 2)


def cases(mlo, ckpt, tmp, rng, every):
    """(description, args, env, strict) for every invocation."""
    # Arguments that keep an accepted run small, placed before the junk flag
    # (a repeated flag takes the last value).
    base = {
        "demo": ["--scale", SCALE, "--steps", "1", "--device-memory", "64M"],
        "synth": ["wan2.2-t2v", os.path.join(tmp, "synth-out"), "--scale", SCALE],
        "inspect": [ckpt],
        "run": [ckpt, "--steps", "1"],
        "bench": ["--quick", "--max-size", "1M", "--path", ckpt],
    }
    out = []
    junk_bytes = random_junk(rng, 3)
    for cmd, rest in base.items():
        pre = [cmd] + rest
        flags = discover(mlo, cmd)
        if not flags:
            out.append((f"{cmd} --help lists no flags", None, None, False))
        for flag, metavar in sorted(flags.items()):
            if metavar is None:  # a switch: it takes no value
                out.append((f"{cmd} {flag}=x", pre + [f"{flag}=x"], None, True))
                continue
            kind, strict = METAVARS.get(metavar, ("path", False))
            for v in pick(NEVER_VALID + junk_bytes, rng, every):
                out.append((f"{cmd} {flag} {short(v)}", pre + [flag, v], None, strict))
            for v in pick(MAYBE_VALID[kind], rng, every):
                out.append((f"{cmd} {flag} {short(v)}", pre + [flag, v], None, False))
            out.append((f"{cmd} {flag} (no value)", pre + [flag], None, True))
        out.append((f"{cmd} --no-such-flag", pre + ["--no-such-flag"], None, True))
        out.append((f"{cmd} -", pre + ["-"], None, False))
    # Positional arguments.
    for v in pick(NEVER_VALID[:12] + MAYBE_VALID["path"] + junk_bytes, rng, every):
        out.append((f"inspect {short(v)}", ["inspect", v], None, False))
        out.append((f"run {short(v)}", ["run", v, "--steps", "1"], None, False))
        out.append((f"synth {short(v)} DIR", ["synth", v, os.path.join(tmp, "s2")], None, True))
        out.append((f"synth wan2.2-t2v {short(v)}",
                    ["synth", "wan2.2-t2v", v, "--scale", SCALE], None, False))
        out.append((f"mlo {short(v)}", [v], None, True))
    # Environment variables the library and the tool read.
    env_values = NEVER_VALID[:14] + ["debug", "DEBUG", "off", "1", "0", "-1",
                                     os.path.join(tmp, "missing", "x"), os.path.join(tmp, "fifo"),
                                     os.path.join(tmp, "node"), "x" * 4097] + junk_bytes
    for v in pick(env_values, rng, every):
        for var in ("MLO_LOG", "MLO_NO_PINNED", "MLO_NO_PROGRESS"):
            out.append((f"{var}={short(v)} run", ["run", ckpt, "--steps", "1"], {var: v}, False))
        out.append((f"MLO_CACHE={short(v)} demo", ["demo", "--scale", SCALE, "--steps", "1"],
                    {"MLO_CACHE": v}, False))
        out.append((f"TMPDIR={short(v)} bench", ["bench"] + base["bench"], {"TMPDIR": v}, False))
    return out


def fuzz(mlo, ckpt, tmp, rng, budget, seed, every):
    work = cases(mlo, ckpt, tmp, rng, every)
    problems = []
    codes = {}
    notes = []
    ran = 0
    deadline = time.monotonic() + budget
    cwd = os.path.join(tmp, "cwd")  # relative paths (MLO_CACHE=x) land here
    os.makedirs(cwd)

    def one(case):
        what, args, env, strict = case
        if args is None:
            return what, 0, "no flags", False
        if time.monotonic() > deadline:
            return what, "skipped", "", False
        rc, err, _ = run(mlo, args, env=env, cwd=cwd)
        return what, rc, err, strict

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for what, rc, err, strict in pool.map(one, work):
            if rc == "skipped":
                continue
            if err == "no flags":
                problems.append(what)
                continue
            ran += 1
            codes[rc] = codes.get(rc, 0) + 1
            if rc in (1, 3, 4):  # documented, but worth a look in the log
                notes.append(f"exit {rc}: {what}: {err.strip().splitlines()[-1][:200]}")
            check(problems, what, rc, err, strict)
    skipped = len(work) - ran
    print(f"invocations: {ran} of {len(work)} (seed {seed}), "
          f"{len(problems)} problem(s)" + (f", {skipped} left for lack of time" if skipped else ""))
    print("exit codes: " + ", ".join(f"{k}: {v}" for k, v in sorted(codes.items(), key=str)))
    for n in notes:
        print("note", n)
    for p in problems:
        print("FAIL", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
