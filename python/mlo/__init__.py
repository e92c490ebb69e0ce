"""mlo — model-level offload, from Python, on libmlo.

A thin binding (ctypes) over the C library: every slab, load, eviction,
ordering and policy decision is libmlo's; this package only hands it memory
and calls it.  `mlo.torch` hooks PyTorch / diffusers pipelines onto it::

    import mlo.torch
    mlo.torch.enable_model_offload(pipe, device="host:capacity=2G")
    image = pipe(prompt).images[0]
    mlo.torch.disable_model_offload(pipe)

The C API's reference manual is include/mlo/mlo.h; docs/python.md says how
the PyTorch adapter maps modules onto components.
"""
import ctypes

from . import _lib

__all__ = ["MloError", "Platform", "Pipeline", "Component", "version", "role_from_class",
           "role_guess", "DIT", "ENCODER", "VAE", "OTHER"]

DIT, ENCODER, VAE, OTHER = _lib.ROLE_DIT, _lib.ROLE_ENCODER, _lib.ROLE_VAE, _lib.ROLE_OTHER
_ROLE_NAMES = {"dit": DIT, "encoder": ENCODER, "vae": VAE, "other": OTHER}

_L = None


def lib():
    """The loaded libmlo (MLO_LIBRARY, next to this package, a source
    checkout's build/, or the system's)."""
    global _L
    if _L is None:
        _L = _lib.load()
    return _L


def version():
    return lib().mlo_version().decode()


def role_from_class(class_name):
    """The role a model class declares ("dit", "encoder", "vae", "other"), as
    libmlo reads it from a checkpoint (mlo_role_from_class); None for a
    class libmlo does not know."""
    role = ctypes.c_int()
    if lib().mlo_role_from_class(class_name.encode(), ctypes.byref(role)):
        return None
    return lib().mlo_role_name(role.value).decode()


def role_guess(name, class_name=None):
    """libmlo's name heuristic (mlo_role_guess): "dit", "encoder", "vae" or
    "other"."""
    role = lib().mlo_role_guess(name.encode(), class_name.encode() if class_name else None)
    return lib().mlo_role_name(role).decode()


class MloError(RuntimeError):
    """A libmlo status: .code (negative MLO_E*), .name ("MLO_ENOMEM_DEVICE")."""

    def __init__(self, code, message):
        self.code = code
        self.name = lib().mlo_err_name(code).decode()
        super().__init__("%s (%s)" % (message, self.name))


def _check(rc, what, pipe=None):
    if rc == 0:
        return
    detail = ""
    if pipe is not None:
        detail = lib().mlo_pipeline_errmsg(pipe).decode(errors="replace")
    msg = detail or lib().mlo_strerror(rc).decode()
    raise MloError(rc, "%s: %s" % (what, msg))


class Platform:
    """A device: "host[:capacity=8G,...]", "cuda[:N][:stream=...]", "opencl[:N]"."""

    def __init__(self, spec="host"):
        self._p = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        rc = lib().mlo_platform_open(spec.encode(), ctypes.byref(self._p), err, len(err))
        if rc:
            raise MloError(rc, "platform '%s': %s" % (spec, err.value.decode(errors="replace")))
        self.spec = spec

    @property
    def handle(self):
        return self._p

    @property
    def name(self):
        return lib().mlo_platform_name(self._p).decode()

    @property
    def description(self):
        return lib().mlo_platform_description(self._p).decode()

    def caps(self):
        c = _lib.PlatformCaps()
        lib().mlo_platform_get_caps(self._p, ctypes.byref(c))
        return {f: getattr(c, f) for f, _ in c._fields_}

    def memory(self):
        m = _lib.PlatformMemory()
        _check(lib().mlo_platform_get_memory(self._p, ctypes.byref(m)), "memory")
        return {f: getattr(m, f) for f, _ in m._fields_}

    def synchronize(self):
        _check(lib().mlo_platform_synchronize(self._p), "synchronize")

    def close(self):
        if self._p:
            lib().mlo_platform_close(self._p)
            self._p = ctypes.c_void_p()


class Component:
    """A component of a Pipeline (owned by it)."""

    def __init__(self, pipeline, handle, name, role):
        self.pipeline, self._c, self.name, self.role = pipeline, handle, name, role

    @property
    def handle(self):
        return self._c

    def add_tensor(self, name, dtype, shape, data_ptr=None, buffer=False):
        """Declares a tensor whose bytes are at data_ptr (copied into the
        component's slab at materialization), or zero-filled without one.
        Returns its handle, for host_data() / device_ptr()."""
        d = _lib.TensorDesc()
        d.size = ctypes.sizeof(d)
        d.name = name.encode()
        d.dtype = _lib.DTYPE[dtype]
        d.ndim = len(shape)
        for i, n in enumerate(shape):
            d.shape[i] = n
        d.flags = _lib.TENSOR_BUFFER if buffer else 0
        d.data = data_ptr
        t = ctypes.c_void_p()
        _check(lib().mlo_tensor_add(self._c, ctypes.byref(d), ctypes.byref(t)),
               "%s: tensor '%s'" % (self.name, name), self.pipeline.handle)
        return t

    @staticmethod
    def host_data(tensor):
        return lib().mlo_tensor_host_data(tensor)

    @staticmethod
    def device_ptr(tensor):
        return lib().mlo_tensor_device_ptr(tensor)

    @staticmethod
    def nbytes(tensor):
        return lib().mlo_tensor_nbytes(tensor)

    @property
    def bytes(self):
        return lib().mlo_component_bytes(self._c)

    @property
    def resident(self):
        return lib().mlo_component_is_resident(self._c)

    def acquire(self):
        _check(lib().mlo_component_acquire(self._c), "acquire '%s'" % self.name,
               self.pipeline.handle)

    def release(self):
        _check(lib().mlo_component_release(self._c), "release '%s'" % self.name,
               self.pipeline.handle)

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def stats(self):
        s = _lib.ComponentStats()
        _check(lib().mlo_component_get_stats(self._c, ctypes.byref(s)), "stats")
        return {f: getattr(s, f) for f, _ in s._fields_}


class Pipeline:
    """Components on a platform, and the offload backend over them."""

    def __init__(self, platform, pin_host=True):
        o = _lib.PipelineOptions()
        o.size = ctypes.sizeof(o)
        o.platform = platform.handle
        o.pin_host = pin_host
        o.slab_alignment = 256
        self._p = ctypes.c_void_p()
        _check(lib().mlo_pipeline_create(ctypes.byref(o), ctypes.byref(self._p)), "pipeline")
        self.platform = platform
        self.components = []

    @property
    def handle(self):
        return self._p

    def add_component(self, name, role):
        if isinstance(role, str):
            role = _ROLE_NAMES[role]
        c = ctypes.c_void_p()
        _check(lib().mlo_component_add(self._p, name.encode(), role, ctypes.byref(c)),
               "component '%s'" % name, self._p)
        comp = Component(self, c, name, role)
        self.components.append(comp)
        return comp

    def materialize(self):
        _check(lib().mlo_pipeline_materialize(self._p), "materialize", self._p)

    def enable(self, policy="strict", budget=0, reserve=0, prefetch=True):
        s = _lib.OffloadSettings()
        s.size = ctypes.sizeof(s)
        s.sync = _lib.SYNC_EVENT
        s.pin_host = True
        s.policy = _lib.POLICY_BUDGET if policy == "budget" else _lib.POLICY_STRICT
        s.budget_bytes = budget
        s.reserve_bytes = reserve
        s.prefetch = prefetch
        _check(lib().mlo_offload_enable(self._p, ctypes.byref(s)), "enable", self._p)

    def disable(self):
        _check(lib().mlo_offload_disable(self._p), "disable", self._p)

    @property
    def enabled(self):
        return lib().mlo_offload_is_enabled(self._p)

    def set_schedule(self, runs):
        """runs: [(Component, repeat), ...], one request (docs/planner.md)."""
        arr = (_lib.ScheduleEntry * max(1, len(runs)))()
        for i, (c, n) in enumerate(runs):
            arr[i].comp, arr[i].repeat = c.handle, n
        _check(lib().mlo_pipeline_set_schedule(self._p, arr, len(runs)), "schedule", self._p)

    def audit(self):
        _check(lib().mlo_pipeline_audit(self._p), "audit", self._p)

    def stats(self):
        s = _lib.PipelineStats()
        _check(lib().mlo_pipeline_get_stats(self._p, ctypes.byref(s)), "stats")
        out = {f: getattr(s, f) for f, _ in s._fields_ if f != "total"}
        out.update({f: getattr(s.total, f) for f, _ in s.total._fields_})
        return out

    def reset_stats(self):
        lib().mlo_pipeline_reset_stats(self._p)

    def free(self):
        if self._p:
            lib().mlo_pipeline_free(self._p)
            self._p = ctypes.c_void_p()
