#!/usr/bin/env python3
"""Cross-checks mlo's safetensors files against the reference `safetensors`
package (driven by test_st_crosscheck.c).

  st_crosscheck.py probe                 the package is importable?
  st_crosscheck.py read FILE MANIFEST    the reference reads FILE (written by
                                         mlo) as MANIFEST says
  st_crosscheck.py write FILE MANIFEST   the reference writes FILE; MANIFEST
                                         says what mlo must read back
  st_crosscheck.py verdicts DIR OUT      for every DIR/*.safetensors, whether
                                         the reference opens it: OUT gets
                                         {"name": true|false, ...}

A manifest is JSON: {"metadata": {k: v}, "tensors": [{"name", "dtype",
"shape", "hex"}]}, dtype spelled as in safetensors ("BF16").

Exit codes: 0 agreed, 1 disagreed, 77 package missing and MLO_SKIP_PYTHON=1
(any other missing-package case is a failure: the check must not pass
silently on a machine that cannot run it).
"""
import json
import os
import sys

try:
    import numpy as np
    import safetensors
    from safetensors import deserialize, safe_open
except ImportError as e:  # pragma: no cover - depends on the machine
    if os.environ.get("MLO_SKIP_PYTHON") == "1":
        print(f"st_crosscheck: skipped ({e})")
        sys.exit(77)
    print(f"st_crosscheck: FAIL: {e}; run scripts/bootstrap.sh or set MLO_SKIP_PYTHON=1")
    sys.exit(1)

# safetensors names of the dtypes numpy can hold, for safe_open(framework="numpy").
NUMPY_OF = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
    "F16": np.float16, "I32": np.int32, "U32": np.uint32, "F32": np.float32,
    "F64": np.float64, "I64": np.int64, "U64": np.uint64, "C64": np.complex64,
}
# TensorSpec names of the dtypes numpy cannot hold (written from raw bytes).
SPEC_OF = {
    "BF16": "bfloat16", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn",
    "F8_E8M0": "float8_e8m0fnu", "F4": "float4_e2m1fn_x2",
}

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def read(path, manifest_path):
    with open(manifest_path) as f:
        man = json.load(f)
    want = {t["name"]: t for t in man["tensors"]}
    with open(path, "rb") as f:
        blob = f.read()
    # 1. the Rust core: every dtype, raw bytes
    got = {name: info for name, info in deserialize(blob)}
    check(set(got) == set(want), f"names differ: {sorted(got)} vs {sorted(want)}")
    for name, t in want.items():
        if name not in got:
            continue
        g = got[name]
        check(g["dtype"] == t["dtype"], f"{name}: dtype {g['dtype']} != {t['dtype']}")
        check(list(g["shape"]) == t["shape"], f"{name}: shape {g['shape']} != {t['shape']}")
        check(bytes(g["data"]) == bytes.fromhex(t["hex"]), f"{name}: bytes differ")
    # 2. the Python front end: metadata, and numpy arrays where numpy can
    with safe_open(path, framework="numpy") as f:
        check((f.metadata() or {}) == man["metadata"],
              f"metadata {f.metadata()} != {man['metadata']}")
        check(set(f.keys()) == set(want), "safe_open keys differ")
        for name, t in want.items():
            if t["dtype"] not in NUMPY_OF:
                continue
            a = f.get_tensor(name)
            check(a.dtype == NUMPY_OF[t["dtype"]], f"{name}: numpy dtype {a.dtype}")
            check(list(a.shape) == t["shape"], f"{name}: numpy shape {a.shape}")
            check(a.tobytes() == bytes.fromhex(t["hex"]), f"{name}: numpy bytes differ")
    # 3. the layout rule the reference writer follows and mlo promises
    hlen = int.from_bytes(blob[:8], "little")
    check((8 + hlen) % 8 == 0, f"data section starts at {8 + hlen}, not a multiple of 8")


def write(path, manifest_path):
    rng = np.random.RandomState(1234)
    arrays = {}
    shapes = {"": [2, 3], ".scalar": [], ".empty": [0, 5]}
    for st_name, np_type in NUMPY_OF.items():
        for suffix, shape in shapes.items():
            if np_type is np.bool_:
                a = rng.randint(0, 2, size=shape).astype(np.bool_)
            else:
                raw = rng.bytes(int(np.prod(shape)) * np.dtype(np_type).itemsize)
                a = np.frombuffer(raw, dtype=np.uint8).view(np_type).reshape(shape)
                if np_type in (np.float16, np.float32, np.float64, np.complex64):
                    a = np.nan_to_num(a)  # NaN payloads are not a layout question
            arrays[f"np.{st_name}{suffix}"] = np.ascontiguousarray(a)
    meta = {"format": "np", "written_by": f"safetensors {safetensors.__version__}"}
    tensors = [{"name": n, "dtype": next(k for k, v in NUMPY_OF.items() if v == a.dtype.type),
                "shape": list(a.shape), "hex": a.tobytes().hex()} for n, a in arrays.items()]

    # dtypes numpy lacks, from raw bytes through the package's TensorSpec
    specs, keep = {}, []
    try:
        from safetensors import TensorSpec
    except ImportError:
        TensorSpec = None
    if TensorSpec is not None:
        from safetensors import serialize_file
        for st_name, spec_name in SPEC_OF.items():
            logical = [3, 4]
            nbytes = {"BF16": 24, "F4": 6}.get(st_name, 12)
            storage = [3, 2] if st_name == "F4" else logical  # two F4 per byte
            buf = np.frombuffer(rng.bytes(nbytes), dtype=np.uint8).copy()
            keep.append(buf)
            specs[f"raw.{st_name}"] = TensorSpec(dtype=spec_name, shape=storage,
                                                 data_ptr=buf.ctypes.data, data_len=nbytes)
            tensors.append({"name": f"raw.{st_name}", "dtype": st_name, "shape": logical,
                            "hex": buf.tobytes().hex()})
        for n, a in arrays.items():  # little-endian machines only, as the C side
            specs[n] = TensorSpec(dtype=a.dtype.name, shape=list(a.shape),
                                  data_ptr=a.ctypes.data, data_len=a.nbytes)
        serialize_file(specs, path, metadata=meta)
    else:
        from safetensors.numpy import save_file
        save_file(arrays, path, metadata=meta)
    with open(manifest_path, "w") as f:
        json.dump({"metadata": meta, "tensors": tensors}, f)


def verdicts(folder, out_path):
    """Header-grammar cases (test_st_crosscheck.c): open each with the
    reference and record whether it was accepted."""
    result = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".safetensors"):
            continue
        try:
            with safe_open(os.path.join(folder, name), "np") as f:
                list(f.keys())
            result[name[:-len(".safetensors")]] = True
        except Exception:  # the reference refused it: that is the datum
            result[name[:-len(".safetensors")]] = False
    with open(out_path, "w") as f:
        json.dump(result, f)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "verdicts":
        verdicts(sys.argv[2], sys.argv[3])
        return 0
    if len(sys.argv) == 2 and sys.argv[1] == "probe":
        print(f"st_crosscheck: safetensors {safetensors.__version__}, numpy {np.__version__}")
        return 0
    if len(sys.argv) != 4 or sys.argv[1] not in ("read", "write"):
        print(__doc__)
        return 2
    (read if sys.argv[1] == "read" else write)(sys.argv[2], sys.argv[3])
    for f in failures:
        print(f"st_crosscheck: FAIL: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
