#!/usr/bin/env python3
"""Cross-checks mlo's GGUF reader against PyPI's `gguf` package, both ways.

  gguf_crosscheck.py GGUF_DUMP

1. gguf writes, mlo reads: files written by gguf.GGUFWriter (every GGML
   type the package can size, random shapes, default and custom alignments,
   metadata of every value type, arrays of strings and of arrays) must read
   in mlo exactly as gguf.GGUFReader reads them: names, types, dimensions,
   absolute data offsets, byte sizes, keys, alignment, architecture.
2. mlo's verdicts against gguf's: thousands of mutations of those files
   (bytes flipped, counts and lengths bent, files cut).  Whatever mlo
   accepts, gguf must accept with the same tensor table (mlo is never more
   lenient).  Where gguf accepts what mlo refuses, mlo's reason must be one
   of its documented stricter rules (overlapping tensors, a bool that is not
   0/1, a duplicate key or tensor name, big-endian files, a tensor past the
   end that gguf maps lazily, ...); any other disagreement fails.

GGUF_DUMP is tests/format/gguf_dump (mlo's view as JSON lines).  Exit codes:
0 agreed, 1 disagreed, 77 package missing and MLO_SKIP_PYTHON=1.
"""
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
except ImportError as e:  # pragma: no cover - depends on the machine
    if os.environ.get("MLO_SKIP_PYTHON") == "1":
        print(f"gguf_crosscheck: skipped ({e})")
        sys.exit(77)
    print(f"gguf_crosscheck: FAIL: {e}; run scripts/bootstrap.sh or set MLO_SKIP_PYTHON=1")
    sys.exit(1)

DUMP = sys.argv[1]
Q = gguf.GGMLQuantizationType
# mlo's documented refusals that gguf's reader does not make (docs/formats.md)
STRICTER = ("overlap", "bool", "duplicate", "big-endian", "run past the end", "not valid UTF-8",
            "is empty", "not a power of two", "not a u32", "not a string", "over the cap",
            "nested more than", "not whole", "more than the file could hold", "truncated",
            "unknown GGML type", "unknown value type", "unknown element type", "could hold",
            "dimensions multiply", "passes 2^64", "over 2^63", "not a multiple of")


def mlo_view(paths):
    out = subprocess.run([DUMP, *paths], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"gguf_dump failed: {out.stderr}")
    return [json.loads(line) for line in out.stdout.splitlines()]


def gguf_view(path):
    """gguf's reading, or None where it raises."""
    try:
        r = gguf.GGUFReader(path)
        tensors = [{"name": t.name, "type": int(t.tensor_type),
                    "ne": [int(x) for x in t.shape], "offset": int(t.data_offset),
                    "nbytes": int(t.n_bytes)} for t in r.tensors]
        keys = [k for k in r.fields if not k.startswith("GGUF.")]
        arch = r.fields.get("general.architecture")
        return {"tensors": tensors, "kv": keys, "alignment": int(r.alignment),
                "architecture": str(bytes(arch.parts[-1]), "utf-8") if arch else None,
                "big_endian": r.byte_order != "I"}
    except Exception as e:  # noqa: BLE001 - any refusal counts
        return {"error": f"{type(e).__name__}: {e}"}


def same_table(m, g):
    by_name = sorted(m["tensors"], key=lambda t: t["name"])
    return by_name == sorted(g["tensors"], key=lambda t: t["name"])


def write_random(path, rng):
    arch = rng.choice(["wan", "flux", "t5encoder", "sd3", "qwen_image"])
    w = gguf.GGUFWriter(path, arch)
    if rng.random() < 0.5:
        w.add_custom_alignment(rng.choice([8, 16, 64, 128, 256]))
    w.add_string("general.name", "x" * rng.randint(0, 40))
    w.add_uint8("t.u8", 7)
    w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 700)
    w.add_int16("t.i16", -700)
    w.add_uint32("t.u32", 70000)
    w.add_int32("t.i32", -70000)
    w.add_float32("t.f32", 1.25)
    w.add_uint64("t.u64", 1 << 40)
    w.add_int64("t.i64", -(1 << 40))
    w.add_float64("t.f64", 2.5)
    w.add_bool("t.bool", True)
    w.add_array("t.strings", ["a", "bc", "", "déjà"])
    w.add_array("t.ints", list(range(rng.randint(0, 50))))
    types = [t for t in gguf.GGML_QUANT_SIZES if t not in (Q.Q8_1, Q.Q8_K)] \
        if hasattr(Q, "Q8_K") else list(gguf.GGML_QUANT_SIZES)
    for i in range(rng.randint(0, 7)):
        t = rng.choice(types)
        block, tsize = gguf.GGML_QUANT_SIZES[t]
        ndim = rng.randint(1, 4)
        shape = [rng.randint(1, 3) for _ in range(ndim - 1)] + [block * rng.randint(1, 3)]
        if t in (Q.F32, Q.F16):
            arr = np.zeros(shape, dtype=np.float32 if t == Q.F32 else np.float16)
            w.add_tensor(f"blk.{i}.w", arr)
        else:
            row = shape[-1] // block * tsize
            raw = np.zeros((*shape[:-1], row), dtype=np.uint8)
            w.add_tensor(f"blk.{i}.w", raw, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def mutate(data, rng):
    b = bytearray(data)
    kind = rng.randrange(5)
    if kind == 0 and b:  # flip bytes
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == 1 and len(b) > 24:  # bend a 64-bit count or length
        at = rng.randrange(8, len(b) - 8)
        struct.pack_into("<Q", b, at, rng.choice([0, 1, 2, 255, 1 << 32, (1 << 63) + 1,
                                                  struct.unpack_from("<Q", b, at)[0] + 1]))
    elif kind == 2:  # cut
        del b[rng.randrange(len(b) + 1):]
    elif kind == 3 and len(b) > 8:  # bend a 32-bit type or dimension count
        at = rng.randrange(4, len(b) - 4)
        struct.pack_into("<I", b, at, rng.choice([0, 1, 4, 5, 9, 12, 13, 31, 99]))
    else:  # append junk
        b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    return bytes(b)


def write_one(path, ggml_type, ne):
    """A file of one tensor of this type and these dimensions, with no
    bytes behind it when it has no element."""
    name = b"t"
    body = b"GGUF" + struct.pack("<IQQ", 3, 1, 0)
    body += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(ne))
    body += b"".join(struct.pack("<Q", d) for d in ne) + struct.pack("<IQ", ggml_type, 0)
    body += b"\0" * (-len(body) % 32)
    with open(path, "wb") as f:
        f.write(body)


# Empty tensors with huge dimensions, both sides of numpy's 2^63 - 1 byte
# bound on the reference's view (F32, F16, I8: themselves; BF16 and Q4_0:
# bytes, the row as its blocks' bytes).  The verdicts must be the same.
HUGE_EMPTY = [(t, ne) for t in (0, 1, 24, 30) for ne in (
    [0, 2**62], [0, 2**61], [0, 2**61 - 1], [0, 2**60], [2**31, 2**31, 0], [2**30, 2**30, 0],
    [0, 2**32, 2**32], [1, 0, 2**63 - 1], [2, 0, 2**62])] + [
    (2, [0, 2**62]), (2, [32, 2**59, 0]), (2, [32, 2**58, 0]), (2, [0, 2**63 - 1])]


def main():
    rng = random.Random(20261201)
    tmp = tempfile.mkdtemp(prefix="mlo_gguf_xcheck_")
    failures = []
    try:
        # 1. gguf writes, mlo reads
        files = []
        for i in range(60):
            p = os.path.join(tmp, f"w{i}.gguf")
            write_random(p, rng)
            files.append(p)
        for p, m in zip(files, mlo_view(files)):
            g = gguf_view(p)
            if not m["ok"]:
                failures.append(f"{p}: mlo refused a file gguf wrote: {m['error']}")
                continue
            if "error" in g:
                failures.append(f"{p}: gguf cannot read its own file: {g['error']}")
                continue
            if not same_table(m, g):
                failures.append(f"{p}: tensor tables differ\n mlo  {m['tensors']}\n gguf "
                                f"{g['tensors']}")
            if sorted(m["kv"]) != sorted(g["kv"]):
                failures.append(f"{p}: keys differ: {m['kv']} vs {g['kv']}")
            if m["alignment"] != g["alignment"] or m.get("architecture") != g["architecture"]:
                failures.append(f"{p}: alignment/architecture differ")
        print(f"gguf_crosscheck: {len(files)} files written by gguf read alike")
        # 2. verdicts on mutations
        seeds = [open(p, "rb").read() for p in files[:20]]
        muts = []
        for i in range(1500):
            p = os.path.join(tmp, f"m{i}.gguf")
            with open(p, "wb") as f:
                f.write(mutate(rng.choice(seeds), rng))
            muts.append(p)
        accepted = stricter = both_refuse = 0
        for p, m in zip(muts, mlo_view(muts)):
            g = gguf_view(p)
            if m["ok"]:
                accepted += 1
                if "error" in g:
                    failures.append(f"{p}: mlo accepted what gguf refuses ({g['error']})")
                elif not same_table(m, g):
                    failures.append(f"{p}: both accept, tables differ\n mlo  {m['tensors']}\n"
                                    f" gguf {g['tensors']}")
            elif "error" in g:
                both_refuse += 1
            elif g.get("big_endian") or any(w in m["error"] for w in STRICTER):
                stricter += 1
            else:
                failures.append(f"{p}: gguf accepts, mlo refuses for an undocumented reason: "
                                f"{m['error']}")
        print(f"gguf_crosscheck: {len(muts)} mutations: {accepted} accepted by both, "
              f"{both_refuse} refused by both, {stricter} refused by mlo's stricter rules")
        if accepted == 0 or both_refuse == 0:
            failures.append("the mutations did not exercise both verdicts")
        # 3. empty tensors with huge dimensions: the same verdict both ways
        huge = []
        for i, (t, ne) in enumerate(HUGE_EMPTY):
            p = os.path.join(tmp, f"h{i}.gguf")
            write_one(p, t, ne)
            huge.append(p)
        ok = refused = 0
        for (t, ne), p, m in zip(HUGE_EMPTY, huge, mlo_view(huge)):
            g = gguf_view(p)
            if m["ok"] != ("error" not in g):
                failures.append(f"type {t} ne={ne}: mlo {'accepts' if m['ok'] else 'refuses'}"
                                f" ({m.get('error', '')}), gguf {g.get('error', 'accepts')}")
            ok += m["ok"]
            refused += not m["ok"]
        print(f"gguf_crosscheck: {len(huge)} empty tensors with huge dimensions: {ok} accepted, "
              f"{refused} refused, by both")
        if not ok or not refused:
            failures.append("the huge empty tensors did not exercise both verdicts")
    finally:
        if not os.environ.get("MLO_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
    for f in failures[:20]:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
