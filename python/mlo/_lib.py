"""_lib.py — the ctypes declarations of libmlo's C API (include/mlo/mlo.h).

Only what the Python package calls is declared; every structure mirrors its
C definition field for field (the tests check the sizes the C headers'
_INIT macros carry, through the library's own size checks: a wrong size is
refused with MLO_EINVAL).  Nothing here implements anything libmlo does.
"""
import ctypes
import ctypes.util
import os

MAX_DIMS = 8

# status codes
OK, EINVAL, ENOMEM, ENOMEM_DEVICE, EBUSY, ESTATE = 0, -1, -2, -3, -4, -5

# dtypes (mlo_dtype, in header order)
DTYPES = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16", "BF16",
          "I32", "U32", "F32", "F64", "I64", "U64", "C64"]
DTYPE = {name: i for i, name in enumerate(DTYPES)}

ROLE_DIT, ROLE_ENCODER, ROLE_VAE, ROLE_OTHER, ROLE_AUTO = range(5)
SYNC_EVENT = 0
POLICY_STRICT, POLICY_BUDGET = 0, 1
TENSOR_BUFFER = 1 << 0
TRACE_EVICT = 2


class TensorDesc(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("name", ctypes.c_char_p), ("dtype", ctypes.c_int),
                ("ndim", ctypes.c_int), ("shape", ctypes.c_int64 * MAX_DIMS),
                ("flags", ctypes.c_uint), ("data", ctypes.c_void_p), ("file", ctypes.c_char_p),
                ("file_offset", ctypes.c_uint64)]


class PipelineOptions(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("platform", ctypes.c_void_p),
                ("pin_host", ctypes.c_bool), ("slab_alignment", ctypes.c_size_t),
                ("comm", ctypes.c_void_p), ("sharded_loads", ctypes.c_bool),
                ("shard_resident", ctypes.c_bool),
                # since 0.7: several devices (mlo.h's "Several devices")
                ("devices", ctypes.POINTER(ctypes.c_void_p)), ("ndevices", ctypes.c_size_t)]


MAX_DEVICES = 16  # mlo_placement's room_bytes[]
DEVICE_ANY = -1  # MLO_DEVICE_ANY


class Placement(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("devices", ctypes.c_size_t),
                ("moved_bytes", ctypes.c_uint64), ("one_device_bytes", ctypes.c_uint64),
                ("room_bytes", ctypes.c_uint64 * MAX_DEVICES)]


class DeviceStats(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t)] + [(n, ctypes.c_uint64) for n in (
        "device_bytes", "peak_device_bytes", "budget_bytes")]


class OffloadSettings(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("sync", ctypes.c_int), ("pin_host", ctypes.c_bool),
                ("distributed", ctypes.c_bool), ("per_tensor_copies", ctypes.c_bool),
                ("copy_back", ctypes.c_bool), ("policy", ctypes.c_int),
                ("budget_bytes", ctypes.c_uint64), ("reserve_bytes", ctypes.c_uint64),
                ("prefetch", ctypes.c_bool), ("host_budget_bytes", ctypes.c_uint64)]


class ComponentStats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "loads", "evictions", "forwards", "h2d_bytes", "d2h_bytes", "copy_calls",
        "platform_calls", "wait_ns", "forward_ns", "prefetches", "block_loads", "block_wait_ns",
        "disk_loads", "disk_read_bytes", "disk_wait_ns", "joined_loads")]


class StatsField(ctypes.Structure):
    """mlo_stats_field: one counter of mlo_component_stats, as libmlo lists them."""
    _fields_ = [("name", ctypes.c_char_p), ("offset", ctypes.c_size_t),
                ("seconds", ctypes.c_char_p)]


class PipelineStats(ctypes.Structure):
    _fields_ = [("total", ComponentStats)] + [(n, ctypes.c_uint64) for n in (
        "device_bytes", "peak_device_bytes", "host_slab_bytes", "pinned_bytes", "budget_bytes",
        "host_budget_bytes", "disk_bytes", "staging_bytes")]


class PlatformMemory(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "total_bytes", "free_bytes", "used_bytes", "peak_bytes", "reserved_peak_bytes")]


class PlatformCaps(ctypes.Structure):
    _fields_ = [(n, ctypes.c_bool) for n in (
        "async_copy", "events", "pinned_host", "host_register", "blocking_d2h",
        "device_pointers", "host_addressable")] + [("max_block_bytes", ctypes.c_uint64)]


class StreamInfo(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t)] + [(n, ctypes.c_size_t) for n in (
        "blocks", "resident_blocks", "streamed_blocks", "slots")] + [
        (n, ctypes.c_uint64) for n in ("slot_bytes", "device_bytes", "streamed_bytes")] + [
        ("progressive", ctypes.c_int)]


RECLAIM_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
CACHED_FN = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p)
PROGRESS_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64,
                               ctypes.c_void_p)


class FrameworkCache(ctypes.Structure):
    _fields_ = [("reclaim", RECLAIM_FN), ("cached_bytes", CACHED_FN), ("user", ctypes.c_void_p)]


class ScheduleEntry(ctypes.Structure):
    _fields_ = [("comp", ctypes.c_void_p), ("repeat", ctypes.c_uint32)]


def _candidates():
    env = os.environ.get("MLO_LIBRARY")
    if env and os.path.isdir(env):  # a folder: the library in it (a build or lib folder)
        for name in ("libmlo.so.0.7", "libmlo.so"):
            yield os.path.join(env, name)
    elif env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("libmlo.so.0.7", "libmlo.so"):
        yield os.path.join(here, name)
    # a source checkout: python/mlo -> build/
    yield os.path.join(here, "..", "..", "build", "libmlo.so")
    found = ctypes.util.find_library("mlo")
    if found:
        yield found


def _check_stats(lib, path):
    """ComponentStats against the library's own list of its counters
    (mlo_component_stats_fields): the same names at the same offsets, or a
    library of another layout was found."""
    table = ctypes.POINTER(StatsField)()
    n = lib.mlo_component_stats_fields(ctypes.byref(table))
    theirs = [(table[i].name.decode(), table[i].offset) for i in range(n)]
    ours = [(name, getattr(ComponentStats, name).offset) for name, _ in ComponentStats._fields_]
    if theirs != ours:
        raise OSError("%s: its component counters %s differ from this binding's %s: the "
                      "package and the library are of two versions" %
                      (path, [t[0] for t in theirs], [o[0] for o in ours]))


def load():
    errors = []
    for path in _candidates():
        if not os.path.isabs(path) and os.sep in path:
            path = os.path.abspath(path)
        if os.sep in path and not os.path.exists(path):
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append("%s: %s" % (path, e))
            continue
        _declare(lib)
        _check_stats(lib, path)
        return lib
    raise OSError("libmlo not found (set MLO_LIBRARY to libmlo.so, or build the C library: "
                  "cmake -S . -B build && cmake --build build)%s" %
                  ("; tried " + "; ".join(errors) if errors else ""))


def _declare(lib):
    P, I, U64, Z, C, B = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_size_t,
                          ctypes.c_char_p, ctypes.c_bool)
    sig = {
        "mlo_version": (C, []),
        "mlo_strerror": (C, [I]),
        "mlo_err_name": (C, [I]),
        "mlo_platform_open": (I, [C, ctypes.POINTER(P), ctypes.c_char_p, Z]),
        "mlo_platform_close": (None, [P]),
        "mlo_platform_spec_parts": (I, [C, ctypes.c_char_p, Z, ctypes.POINTER(I)]),
        "mlo_platform_spec_get": (I, [C, C, ctypes.c_char_p, Z]),
        "mlo_platform_spec_compose": (I, [C, I, C, C, ctypes.c_char_p, Z]),
        "mlo_platform_name": (C, [P]),
        "mlo_platform_description": (C, [P]),
        "mlo_platform_get_caps": (None, [P, ctypes.POINTER(PlatformCaps)]),
        "mlo_platform_get_memory": (I, [P, ctypes.POINTER(PlatformMemory)]),
        "mlo_platform_synchronize": (I, [P]),
        "mlo_platform_set_framework_cache": (None, [P, ctypes.POINTER(FrameworkCache)]),
        "mlo_pipeline_create": (I, [ctypes.POINTER(PipelineOptions), ctypes.POINTER(P)]),
        "mlo_pipeline_free": (None, [P]),
        "mlo_pipeline_errmsg": (C, [P]),
        "mlo_pipeline_device_count": (Z, [P]),
        "mlo_pipeline_get_placement": (I, [P, ctypes.POINTER(Placement)]),
        "mlo_pipeline_get_device_stats": (I, [P, Z, ctypes.POINTER(DeviceStats)]),
        "mlo_component_device": (Z, [P]),
        "mlo_component_set_device": (I, [P, I]),
        "mlo_pipeline_materialize": (I, [P]),
        "mlo_pipeline_audit": (I, [P]),
        "mlo_pipeline_synchronize": (I, [P]),
        "mlo_pipeline_get_stats": (I, [P, ctypes.POINTER(PipelineStats)]),
        "mlo_pipeline_reset_stats": (None, [P]),
        "mlo_pipeline_set_schedule": (I, [P, ctypes.POINTER(ScheduleEntry), Z]),
        "mlo_pipeline_get_schedule": (I, [P, ctypes.POINTER(ScheduleEntry), Z,
                                          ctypes.POINTER(Z)]),
        "mlo_pipeline_learn_schedule": (I, [P, B]),
        "mlo_pipeline_set_progress": (None, [P, PROGRESS_FN, P]),
        "mlo_role_name": (C, [I]),
        "mlo_role_guess": (I, [C, C]),
        "mlo_role_from_class": (I, [C, ctypes.POINTER(I)]),
        "mlo_component_add": (I, [P, C, I, ctypes.POINTER(P)]),
        "mlo_component_name": (C, [P]),
        "mlo_component_bytes": (U64, [P]),
        "mlo_component_is_resident": (B, [P]),
        "mlo_component_load_done": (B, [P]),
        "mlo_component_disk_progress": (I, [P, ctypes.POINTER(U64), ctypes.POINTER(U64)]),
        "mlo_component_acquire": (I, [P]),
        "mlo_component_evict": (I, [P]),
        "mlo_component_release": (I, [P]),
        "mlo_component_get_stats": (I, [P, ctypes.POINTER(ComponentStats)]),
        "mlo_tensor_add": (I, [P, ctypes.POINTER(TensorDesc), ctypes.POINTER(P)]),
        "mlo_tensor_host_data": (P, [P]),
        "mlo_tensor_device_ptr": (P, [P]),
        "mlo_tensor_device": (I, [P, ctypes.POINTER(P), ctypes.POINTER(ctypes.c_size_t)]),
        "mlo_tensor_nbytes": (U64, [P]),
        "mlo_tensor_block": (I, [P]),
        "mlo_tensor_set_block": (I, [P, I]),
        "mlo_component_block_count": (Z, [P]),
        "mlo_component_stream_info": (I, [P, ctypes.POINTER(StreamInfo)]),
        "mlo_component_set_progressive": (I, [P, I]),
        "mlo_block_begin": (I, [P, Z]),
        "mlo_block_end": (I, [P, Z]),
        "mlo_offload_enable": (I, [P, ctypes.POINTER(OffloadSettings)]),
        "mlo_offload_disable": (I, [P]),
        "mlo_offload_is_enabled": (B, [P]),
        "mlo_policy_from_name": (I, [C, ctypes.POINTER(I)]),
        "mlo_parse_size": (I, [C, B, ctypes.POINTER(U64)]),
        "mlo_tensor_file": (C, [P, ctypes.POINTER(U64)]),
        "mlo_component_stats_fields": (Z, [ctypes.POINTER(ctypes.POINTER(StatsField))]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
