#!/usr/bin/env python3
"""Writes the hostile GGUF corpus: one file per rule of the reader
(src/format/gguf.c), each breaking exactly that rule, built byte by byte
with struct (the gguf package would refuse to write most of them).
test_gguf_hostile.c says which message each must get; every file here must
have a row there.  Run from anywhere; it rewrites this folder's *.gguf.

    python3 tests/format/hostile_gguf/generate.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)


def s(text):
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return s(key) + struct.pack("<I", vtype) + payload


def tinfo(name, dims, ggml_type, offset):
    return (s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", ggml_type, offset))


def gguf(kvs=(), tensors=(), data=b"", version=3, align=32, counts=None):
    nt, nkv = counts if counts else (len(tensors), len(kvs))
    head = b"GGUF" + struct.pack("<IQQ", version, nt, nkv) + b"".join(kvs) + b"".join(tensors)
    pad = (-len(head)) % align
    return head + b"\0" * pad + data


ARCH = kv("general.architecture", STR, s("wan"))
F32_4 = tinfo("w", [4], 0, 0)  # 16 bytes of F32

cases = {
    "not_gguf": b"GGML" + b"\0" * 20,
    "truncated_magic": b"GG",
    "version1": b"GGUF" + struct.pack("<III", 1, 0, 0),
    "version_big_endian": b"GGUF" + struct.pack(">I", 3) + struct.pack("<QQ", 0, 0),
    "version4": gguf(version=4),
    "truncated_counts": b"GGUF" + struct.pack("<I", 3) + b"\0" * 5,
    "too_many_tensors": gguf(counts=(1 << 40, 0)),
    "too_many_kv": gguf(counts=(0, 1 << 40)),
    "key_too_long": gguf([kv("k" * 70000, U8, b"\1")]),
    "key_empty": gguf([kv("", U8, b"\1")]),
    "key_bad_utf8": gguf([kv(b"k\xff", U8, b"\1")]),
    "string_past_end": b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1000) + b"a" * 40,
    "value_type_unknown": gguf([kv("k", 13, b"\1")]),
    "array_type_unknown": gguf([kv("k", ARR, struct.pack("<IQ", 14, 1) + b"\1")]),
    "array_count_huge": gguf([kv("k", ARR, struct.pack("<IQ", U32, 1 << 60))]),
    "array_too_deep": gguf([kv("k", ARR, struct.pack("<IQ", ARR, 1) + struct.pack("<IQ", ARR, 1)
                               + struct.pack("<IQ", ARR, 1) + struct.pack("<IQ", ARR, 1)
                               + struct.pack("<IQ", U8, 1) + b"\1")]),
    "bool_not_0_1": gguf([kv("k", BOOL, b"\2")]),
    "duplicate_key": gguf([kv("k", U8, b"\1"), kv("k", U8, b"\2")]),
    "alignment_not_u32": gguf([kv("general.alignment", U64, struct.pack("<Q", 64))]),
    "alignment_not_pow2": gguf([kv("general.alignment", U32, struct.pack("<I", 48))]),
    "arch_not_string": gguf([kv("general.architecture", U32, struct.pack("<I", 7))]),
    "tensor_name_empty": gguf([ARCH], [tinfo("", [4], 0, 0)], b"\0" * 16),
    "tensor_name_duplicate": gguf([ARCH], [tinfo("w", [4], 0, 0), tinfo("w", [4], 0, 32)],
                                  b"\0" * 48),
    "tensor_too_many_dims": gguf([ARCH], [tinfo("w", [1, 1, 1, 1, 1], 0, 0)], b"\0" * 4),
    "tensor_dim_over_2_63": gguf([ARCH], [tinfo("w", [1 << 63], 0, 0)]),
    "tensor_dims_overflow": gguf([ARCH], [tinfo("w", [1 << 32, 1 << 32, 1 << 32], 0, 0)]),
    "tensor_bytes_overflow": gguf([ARCH], [tinfo("w", [1 << 31, 1 << 31, 2], 28, 0)]),
    "tensor_type_unknown": gguf([ARCH], [tinfo("w", [4], 99, 0)], b"\0" * 16),
    "tensor_block_rows": gguf([ARCH], [tinfo("w", [33, 2], 2, 0)], b"\0" * 64),
    "tensor_offset_unaligned": gguf([ARCH], [tinfo("w", [4], 0, 4)], b"\0" * 32),
    "tensor_past_end": gguf([ARCH], [tinfo("w", [64], 0, 0)], b"\0" * 16),
    "tensor_overlap": gguf([ARCH], [tinfo("a", [16], 0, 0), tinfo("b", [4], 0, 32)],
                           b"\0" * 64),
    "tensor_info_truncated": (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + s("w")
                              + struct.pack("<IQ", 2, 4) + b"\0" * 4),
}

# valid seeds for the fuzzer and the replay (every value type, an array of
# strings, an array of arrays, quantized and plain tensors, an alignment)
seeds = {
    "seed_minimal": gguf([ARCH], [F32_4], b"\0" * 16),
    "seed_every_type": gguf(
        [ARCH, kv("general.alignment", U32, struct.pack("<I", 64)),
         kv("u8", U8, b"\1"), kv("i8", I8, b"\xff"), kv("u16", U16, b"\1\0"),
         kv("i16", I16, b"\xff\xff"), kv("u32", U32, b"\1\0\0\0"), kv("i32", I32, b"\xff" * 4),
         kv("f32", F32, struct.pack("<f", 1.5)), kv("bool", BOOL, b"\1"),
         kv("u64", U64, struct.pack("<Q", 7)), kv("i64", I64, struct.pack("<q", -7)),
         kv("f64", F64, struct.pack("<d", 2.5)),
         kv("strings", ARR, struct.pack("<IQ", STR, 3) + s("a") + s("bc") + s("")),
         kv("nested", ARR, struct.pack("<IQ", ARR, 2) + struct.pack("<IQ", U8, 2) + b"\1\2"
            + struct.pack("<IQ", U8, 0))],
        [tinfo("q", [64, 2], 2, 0), tinfo("f", [4], 1, 128), tinfo("empty", [0], 0, 192)],
        b"\7" * 200, align=64),
}

for old in os.listdir(HERE):
    if old.endswith(".gguf"):
        os.remove(os.path.join(HERE, old))
for name, data in cases.items():
    with open(os.path.join(HERE, name + ".gguf"), "wb") as f:
        f.write(data)
seed_dir = os.path.join(HERE, "..", "..", "..", "fuzz", "corpus_gguf")
os.makedirs(seed_dir, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(seed_dir, name + ".gguf"), "wb") as f:
        f.write(data)
print(f"{len(cases)} hostile files, {len(seeds)} seeds")
