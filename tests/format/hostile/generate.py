#!/usr/bin/env python3
"""Generates the hostile safetensors corpus (this directory) and the valid
seed files of the fuzz corpus (fuzz/corpus/).

Each hostile file breaks exactly one rule of docs/formats.md, so the reader's
test (tests/format/test_safetensors_hostile.c) can assert one specific
message per file.  The files are checked in; rerun this after changing a
case:  python3 tests/format/hostile/generate.py
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS = os.path.join(HERE, "..", "..", "..", "fuzz", "corpus")


def st(header, data=b"", hlen=None):
    """A file: length prefix, header text (str/bytes/dict), data bytes."""
    if isinstance(header, dict):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode()
    n = len(header) if hlen is None else hlen
    return struct.pack("<Q", n) + header + data


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


HOSTILE = {
    "truncated": b"\x10\x00\x00\x00\x00",
    "header_past_file": st("{}", hlen=1000),
    "header_over_cap": st("{}", hlen=200_000_000),
    "not_json": st('{"a": {"dtype": '),
    "json_trailing_text": st('{} x'),
    "not_object": st("[1, 2]"),
    "bad_utf8": st(b'{"\xff": 1}'),
    "entry_not_object": st('{"a": 3}'),
    "dtype_not_string": st({"a": {"dtype": 1, "shape": [], "data_offsets": [0, 4]}}, b"\0" * 4),
    "missing_offsets": st({"a": {"dtype": "F32", "shape": [1]}}, b"\0" * 4),
    "offsets_not_pair": st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, b"\0" * 4),
    "shape_not_array": st({"a": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}}, b"\0" * 4),
    "dim_not_whole": st({"a": t("F32", [1.5], 0, 4)}, b"\0" * 4),
    "unknown_dtype": st({"a": t("F128", [1], 0, 16)}, b"\0" * 16),
    "negative_dim": st({"a": t("F32", [-2], 0, 8)}, b"\0" * 8),
    "too_many_dims": st({"a": t("U8", [1] * 9, 0, 1)}, b"\0"),
    "end_before_begin": st({"a": t("U8", [0], 4, 0)}, b""),
    "size_mismatch": st({"blocks.0.w": t("F32", [2, 3], 0, 10)}, b"\0" * 10),
    "shape_overflow": st({"a": t("F32", [2**32, 2**32, 2**32], 0, 4)}, b"\0" * 4),
    "bytes_overflow": st({"a": t("U64", [2**31, 2**31], 0, 8)}, b"\0" * 8),
    "subbyte_fraction": st({"a": t("F4", [3], 0, 2)}, b"\0" * 2),
    "offsets_past_end": st({"a": t("F32", [4], 0, 16)}, b"\0" * 8),
    "offsets_overlap": st({"a": t("F32", [2], 0, 8), "b": t("F32", [2], 4, 12)}, b"\0" * 12),
    "offsets_gap": st({"a": t("F32", [1], 0, 4), "b": t("F32", [1], 8, 12)}, b"\0" * 12),
    "offsets_not_from_zero": st({"a": t("F32", [1], 4, 8)}, b"\0" * 8),
    "trailing_bytes": st({"a": t("F32", [1], 0, 4)}, b"\0" * 8),
    "duplicate_name": st('{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
                         '"a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}', b"\0\0"),
    "duplicate_metadata": st('{"__metadata__": {}, "__metadata__": {}}'),
    "metadata_duplicate_key": st('{"__metadata__": {"k": "1", "k": "2"}}'),
    "metadata_not_object": st({"__metadata__": [1]}),
    "metadata_not_string": st({"__metadata__": {"format": "pt", "step": 1}}),
}


def pad8(header):
    text = json.dumps(header, separators=(",", ":"))
    return text + " " * (-len(text) % 8)


SEED = {
    "empty": st(pad8({})),
    "one_f32": st(pad8({"w": t("F32", [2], 0, 8)}), struct.pack("<2f", 1.0, -2.5)),
    "scalar_and_empty": st(pad8({"s": t("BF16", [], 0, 2), "e": t("F16", [0, 4], 2, 2)}),
                           b"\x80\x3f"),
    "subbyte": st(pad8({"a": t("F4", [4], 0, 2), "b": t("F6_E2M3", [4], 2, 5)}), b"\1\2\3\4\5"),
    "metadata": st(pad8({"__metadata__": {"format": "pt"}, "x": t("I8", [3], 0, 3)}), b"abc"),
    "mixed": st(pad8({"a": t("U8", [1], 0, 1), "b": t("C64", [1], 1, 9),
                      "c": t("F8_E4M3", [2, 1], 9, 11)}), bytes(range(11))),
}


def main():
    for name, blob in HOSTILE.items():
        with open(os.path.join(HERE, name + ".safetensors"), "wb") as f:
            f.write(blob)
    os.makedirs(SEEDS, exist_ok=True)
    for name, blob in SEED.items():
        with open(os.path.join(SEEDS, name + ".safetensors"), "wb") as f:
            f.write(blob)


if __name__ == "__main__":
    main()
