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
import contextlib
import ctypes
import gc
import os
import threading
import weakref

from . import _lib

__all__ = ["MloError", "MloInvalidError", "MloOutOfMemoryError", "MloDeviceOutOfMemoryError",
           "MloBusyError", "MloStateError", "MloUnsupportedError", "MloIOError", "MloFormatError",
           "MloNotFoundError", "MloExistsError", "MloPlatformError", "MloNoDeviceError",
           "MloOwnedError", "MloDeadlockError", "MloCallbackError", "Platform", "Pipeline",
           "Component", "Tensor", "version", "role_from_class", "role_guess", "parse_size", "DIT",
           "ENCODER", "VAE", "OTHER"]

DIT, ENCODER, VAE, OTHER = _lib.ROLE_DIT, _lib.ROLE_ENCODER, _lib.ROLE_VAE, _lib.ROLE_OTHER
BLOCK_PROLOGUE, BLOCK_EPILOGUE, BLOCK_MAX = -1, -2, 100000000  # mlo.h's MLO_BLOCK_*
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


def parse_size(value, what="size", allow_zero=False):
    """Bytes from a size as libmlo reads one (mlo_parse_size: "24G",
    "512M", "1.5GiB", "8e9"; K/M/G/T are 1024-based), or an int of bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0 or value >= _U64 or (value == 0 and not allow_zero):
            raise ValueError("%s: %d is not a size in bytes" % (what, value))
        return value
    if not isinstance(value, str) or "\0" in value:
        raise ValueError("%s: %r is not a size (\"24G\", \"512M\", or bytes)" % (what, value))
    out = ctypes.c_uint64()
    if lib().mlo_parse_size(value.encode(), bool(allow_zero), ctypes.byref(out)):
        raise ValueError("%s: %r is not a size (\"24G\", \"512M\", \"1.5GiB\", or bytes)"
                         % (what, value))
    return out.value


def platform_spec_parts(spec):
    """(name, index) of a platform spec as libmlo reads it ("cuda:1:pinned=0"
    gives ("cuda", 1); index None where none is given; a fault: wrapper's are
    its inner platform's); ValueError for a spec of no platform it knows."""
    name, index = ctypes.create_string_buffer(64), ctypes.c_int(-1)
    rc = lib().mlo_platform_spec_parts(_c_name(spec, "platform spec"), name, len(name),
                                       ctypes.byref(index))
    if rc:
        raise ValueError("platform spec %r: %s" % (spec, lib().mlo_strerror(rc).decode()))
    return name.value.decode(), (index.value if index.value >= 0 else None)


def platform_spec_get(spec, key):
    """Option key's value in a platform spec ("stream" of
    "cuda:0:stream=94" is "94"), None where it is not given."""
    out = ctypes.create_string_buffer(1024)
    rc = lib().mlo_platform_spec_get(_c_name(spec, "platform spec"), _c_name(key, "option"), out,
                                     len(out))
    if rc == -9:  # MLO_ENOTFOUND
        return None
    if rc:
        raise ValueError("platform spec %r: %s" % (spec, lib().mlo_strerror(rc).decode()))
    return out.value.decode()


def platform_spec_compose(spec, index=None, key=None, value=None):
    """The spec again with the device index set (None: as given) and option
    key=value set (replacing a value given), as libmlo composes it:
    platform_spec_compose("cuda:pinned=0", 1, "stream", "94") is
    "cuda:1:pinned=0,stream=94"."""
    out = ctypes.create_string_buffer(2048)
    rc = lib().mlo_platform_spec_compose(
        _c_name(spec, "platform spec"), -1 if index is None else _c_uint(index, "index", 31),
        None if key is None else _c_name(key, "option"),
        None if value is None else _c_name(str(value), "option value"), out, len(out))
    if rc:
        raise ValueError("platform spec %r with index %r, %s=%s: %s" %
                         (spec, index, key, value, lib().mlo_strerror(rc).decode()))
    return out.value.decode()


class MloError(RuntimeError):
    """A libmlo status: .code (negative MLO_E*), .name ("MLO_ENOMEM_DEVICE").
    MloError(code, message) is an instance of the code's own subclass
    (MloStateError for MLO_ESTATE, ...), so a caller catches the failures
    it can act on by class, and `except MloError` still catches them all."""

    code_value = None  # the MLO_E* status a subclass stands for

    def __new__(cls, *args):
        if cls is MloError and args:
            cls = _ERROR_CLASSES.get(args[0], MloError)
        return super().__new__(cls, *args)

    def __init__(self, code, message=None):
        if message is None:  # a subclass, given its message alone
            if self.code_value is None:
                raise TypeError("MloError(code, message): the status code is missing")
            code, message = self.code_value, code
        self.code = code
        self.message = message
        self.name = lib().mlo_err_name(code).decode()
        super().__init__("%s (%s)" % (message, self.name))

    def __reduce__(self):  # pickled (multiprocessing) as its code and message
        return (MloError, (self.code, self.message))


def _error_class(name, code, doc):
    return type(name, (MloError,), {"__doc__": doc, "code_value": code,
                                    "__module__": __name__})


# mlo.h's statuses, each an MloError subclass
MloInvalidError = _error_class("MloInvalidError", -1, "MLO_EINVAL: an argument or option is "
                               "invalid.")
MloOutOfMemoryError = _error_class("MloOutOfMemoryError", -2, "MLO_ENOMEM: host memory "
                                   "exhausted (or a host budget too small for what must stay).")
MloDeviceOutOfMemoryError = _error_class("MloDeviceOutOfMemoryError", -3, "MLO_ENOMEM_DEVICE: "
                                         "device memory exhausted (state rolled back).")
MloBusyError = _error_class("MloBusyError", -4, "MLO_EBUSY: a component or pipeline is in use.")
MloStateError = _error_class("MloStateError", -5, "MLO_ESTATE: not valid in the current state.")
MloUnsupportedError = _error_class("MloUnsupportedError", -6, "MLO_EUNSUPPORTED: refused "
                                   "before anything changed.")
MloIOError = _error_class("MloIOError", -7, "MLO_EIO: a file could not be read or written.")
MloFormatError = _error_class("MloFormatError", -8, "MLO_EFORMAT: a file is malformed.")
MloNotFoundError = _error_class("MloNotFoundError", -9, "MLO_ENOTFOUND: no such thing.")
MloExistsError = _error_class("MloExistsError", -10, "MLO_EEXIST: the name is taken.")
MloPlatformError = _error_class("MloPlatformError", -11, "MLO_EPLATFORM: the device API "
                                "reported an error.")
MloNoDeviceError = _error_class("MloNoDeviceError", -12, "MLO_ENODEV: no such device, or its "
                                "platform is not built in.")
MloOwnedError = _error_class("MloOwnedError", -13, "MLO_EOWNED: another offload owns the "
                             "hooks, or offload is on with other settings (C16).")
MloDeadlockError = _error_class("MloDeadlockError", -14, "MLO_EDEADLK: the calling thread holds "
                                "a conflicting component, or a callback called back in.")
MloCallbackError = _error_class("MloCallbackError", -15, "MLO_ECALLBACK: a user callback "
                                "returned a failure.")
_ERROR_CLASSES = {c.code_value: c for c in (
    MloInvalidError, MloOutOfMemoryError, MloDeviceOutOfMemoryError, MloBusyError,
    MloStateError, MloUnsupportedError, MloIOError, MloFormatError, MloNotFoundError,
    MloExistsError, MloPlatformError, MloNoDeviceError, MloOwnedError, MloDeadlockError,
    MloCallbackError)}

_EINVAL, _EBUSY, _ESTATE = -1, -4, -5  # mlo.h's MLO_EINVAL, MLO_EBUSY, MLO_ESTATE

# Every value that crosses into C is checked here, never wrapped by ctypes
# (2**64 + 5 is not 5) nor cut short (a name with NUL in it).
_U64 = 1 << 64


def _c_name(value, what):
    if not isinstance(value, str):
        raise ValueError("%s: a name must be a str, not %s" % (what, type(value).__name__))
    if "\0" in value:
        raise ValueError("%s: %r has a NUL character in it" % (what, value))
    return value.encode()


def _c_uint(value, what, bits=64):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("%s: %r is not an integer" % (what, value))
    if not 0 <= value < (1 << bits):
        raise ValueError("%s: %d is outside 0 .. 2**%d - 1" % (what, value, bits))
    return value


def _check(rc, what, pipe=None):
    if rc == 0:
        return
    detail = ""
    if pipe is not None:
        detail = lib().mlo_pipeline_errmsg(pipe).decode(errors="replace")
    msg = detail or lib().mlo_strerror(rc).decode()
    raise MloError(rc, "%s: %s" % (what, msg))


class _Handle:
    """A C handle that a finalizer frees once: the Python object that owns
    it may go without close()/free() (garbage), and a platform's handle must
    outlive its pipelines' (each pipeline frees before its platform closes,
    whatever order the collector finds them in)."""
    __slots__ = ("value", "children", "__weakref__")

    def __init__(self):
        self.value = ctypes.c_void_p()
        self.children = weakref.WeakSet()  # a platform's: its pipelines' handles


def _free_pipeline(h):
    p, h.value = h.value, ctypes.c_void_p()
    if p:
        lib().mlo_pipeline_free(p)


def _close_platform(h):
    for child in list(h.children):
        _free_pipeline(child)
    p, h.value = h.value, ctypes.c_void_p()
    if p:
        lib().mlo_platform_close(p)


class Platform:
    """A device: "host[:capacity=8G,...]", "cuda[:N][:stream=...]", "opencl[:N]".
    Closed by close(), a `with` block, or when it is garbage (after every
    pipeline on it)."""

    def __init__(self, spec="host"):
        self._h = _Handle()
        err = ctypes.create_string_buffer(512)
        rc = lib().mlo_platform_open(_c_name(spec, "platform"), ctypes.byref(self._h.value), err,
                                     len(err))
        if rc:
            raise MloError(rc, "platform '%s': %s" % (spec, err.value.decode(errors="replace")))
        self.spec = spec
        self._pipelines = weakref.WeakSet()  # freed before the platform closes
        self._framework_caches = []  # set_framework_cache's callbacks, kept alive
        weakref.finalize(self, _close_platform, self._h)

    @property
    def _p(self):
        return self._h.value

    @property
    def handle(self):
        """The C mlo_platform; MloError (MLO_ESTATE) once closed.  A raw
        handle kept past close() is the caller's not to use."""
        return self._handle("handle")

    @property
    def name(self):
        return lib().mlo_platform_name(self._handle("name")).decode()

    @property
    def description(self):
        return lib().mlo_platform_description(self._handle("description")).decode()

    def caps(self):
        c = _lib.PlatformCaps()
        lib().mlo_platform_get_caps(self._handle("caps"), ctypes.byref(c))
        return {f: getattr(c, f) for f, _ in c._fields_}

    def memory(self):
        m = _lib.PlatformMemory()
        _check(lib().mlo_platform_get_memory(self._handle("memory"), ctypes.byref(m)), "memory")
        return {f: getattr(m, f) for f, _ in m._fields_}

    def synchronize(self):
        _check(lib().mlo_platform_synchronize(self._handle("synchronize")), "synchronize")

    def set_framework_cache(self, reclaim=None, cached_bytes=None):
        """Device memory another allocator holds cached but unused (torch's
        caching allocator): reclaim() is called when an allocation fails,
        which is then tried again, and cached_bytes() counts as free memory
        (mlo_platform_set_framework_cache).  Both None: removed.  They run
        with libmlo's locks held: they must not call mlo."""
        def safe(fn, default):
            def call(_user):
                # libmlo's locks are held: no collection may run a finalizer
                # that frees an mlo object in here
                collecting = gc.isenabled()
                gc.disable()
                try:
                    return fn()
                except Exception:  # an exception cannot cross into C
                    return default
                finally:
                    if collecting:
                        gc.enable()
            return call
        if reclaim is None and cached_bytes is None:
            lib().mlo_platform_set_framework_cache(self._handle("set_framework_cache"), None)
            return
        c = _lib.FrameworkCache()
        c.reclaim = _lib.RECLAIM_FN(safe(reclaim, None)) if reclaim else _lib.RECLAIM_FN()
        c.cached_bytes = _lib.CACHED_FN(safe(lambda: max(0, int(cached_bytes())), 0)) \
            if cached_bytes else _lib.CACHED_FN()
        # the C side may call the callbacks it copied until it is closed,
        # even after another set: keep every one alive as long as the platform
        self._framework_caches.append(c)
        lib().mlo_platform_set_framework_cache(self._handle("set_framework_cache"),
                                               ctypes.byref(c))

    def close(self):
        """Frees the pipelines still open on it (they must go first), then
        the platform.  Later calls on either, or on their components and
        tensors, raise MloError (MLO_ESTATE: "platform closed", "pipeline
        freed (its platform closed)").  Refused (MLO_EBUSY, nothing
        closed) while another thread is inside a call on one of them."""
        pipes = list(self._pipelines)
        with contextlib.ExitStack() as held:  # all or none: no pipeline freed under a call
            for pipe in pipes:
                held.enter_context(pipe._lock)
            busy = sum(pipe._inflight for pipe in pipes if pipe._p)
            if busy:
                raise MloError(_EBUSY, "close: %d call(s) on its pipelines are in progress on "
                               "other threads; nothing closed" % busy)
            for pipe in pipes:
                pipe._free_locked(" (its platform closed)")
        for pipe in pipes:
            self._pipelines.discard(pipe)
        _close_platform(self._h)

    def _handle(self, what):
        if not self._p:
            raise MloError(_ESTATE, "%s: platform closed" % what)
        return self._p

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# Every Tensor given out, by its C address: a raw handle passed where a
# Tensor is taken (code written when add_tensor returned a c_void_p) is
# found here, or refused, never given to C unchecked.
_TENSORS = weakref.WeakValueDictionary()


def _tensor(value, what):
    """The Tensor a value names: a Tensor, or the raw handle (c_void_p or
    int address) of a tensor of a pipeline not yet collected."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, ctypes.c_void_p):
        address = value.value
    elif isinstance(value, int) and not isinstance(value, bool):
        address = value
    else:
        raise ValueError("%s: %r is not a tensor handle (Component.add_tensor gives them)" %
                         (what, value))
    t = _TENSORS.get(address) if address else None
    if t is None:
        raise ValueError("%s: no live tensor at %#x (its pipeline was collected, or "
                         "Component.add_tensor never gave it)" % (what, address or 0))
    return t


class Tensor:
    """A tensor of a Component, as Component.add_tensor gives it.  It keeps
    its component (so its pipeline and platform) alive; once the pipeline is
    freed (Pipeline.free(), Platform.close()) every call raises MloError
    (MLO_ESTATE, "pipeline freed") instead of reaching freed C memory.
    Given to a ctypes function it passes its C mlo_tensor, checked the
    same way."""
    __slots__ = ("component", "name", "_t", "__weakref__")

    def __init__(self, component, handle, name):
        self.component, self._t, self.name = component, handle, name

    def _call(self, what, fn, *args):
        pipe = self.component.pipeline
        pipe._enter("%s: tensor '%s' of '%s'" % (what, self.name, self.component.name))
        try:
            return fn(self._t, *args)
        finally:
            pipe._leave()

    @property
    def handle(self):
        """The C mlo_tensor (a c_void_p); MloError once the pipeline is
        freed.  A raw handle kept past that is the caller's not to use."""
        return self._call("handle", lambda t: ctypes.c_void_p(t.value))

    @property
    def _as_parameter_(self):  # ctypes: a Tensor passed to a C function
        return self._call("ctypes argument", lambda t: t)

    def host_data(self):
        """Its bytes in the slab (mlo_tensor_host_data): an address, or None
        before materialize."""
        return self._call("host_data", lib().mlo_tensor_host_data)

    def device_ptr(self):
        """Its device address (mlo_tensor_device_ptr), or None where it has
        none now."""
        return self._call("device_ptr", lib().mlo_tensor_device_ptr)

    def device_status(self):
        """mlo_tensor_device's status: 0 where it has a device address now,
        MLO_ESTATE (negative) where it has none (not resident, a streamed
        block outside its begin and end, a block whose memory a joined
        switch gave to the next component)."""
        off = ctypes.c_size_t()
        return self._call("device_status", lib().mlo_tensor_device, None, ctypes.byref(off))

    @property
    def nbytes(self):
        return self._call("nbytes", lib().mlo_tensor_nbytes)

    def file(self):
        """(path, offset) of the file range it was declared from, or None
        (mlo_tensor_file)."""
        off = ctypes.c_uint64()
        path = self._call("file", lib().mlo_tensor_file, ctypes.byref(off))
        return None if path is None else (path.decode(), off.value)

    @property
    def block(self):
        """The block it is laid out in: its index, or -1 (prologue) / -2
        (epilogue) (mlo_tensor_block)."""
        return self._call("block", lib().mlo_tensor_block)

    def set_block(self, block):
        """Declares the block of the forward it belongs to
        (mlo_tensor_set_block): 0 .. BLOCK_MAX in the order the blocks run,
        or BLOCK_PROLOGUE (-1) / BLOCK_EPILOGUE (-2); before materialize
        (MLO_ESTATE after).  Once one tensor of a component is declared,
        libmlo reads no names for it: the others are the prologue's."""
        if isinstance(block, bool) or not isinstance(block, int) or \
                not (BLOCK_EPILOGUE <= block <= BLOCK_MAX):
            raise ValueError("tensor %r: block %r is neither %d .. %d nor the prologue (-1) or "
                             "the epilogue (-2)" % (self.name, block, 0, BLOCK_MAX))
        pipe = self.component.pipeline
        with pipe._use("set_block") as p:
            _check(lib().mlo_tensor_set_block(self._t, block),
                   "tensor '%s': set_block" % self.name, p)

    def __repr__(self):
        return "<mlo.Tensor '%s' of '%s'>" % (self.name, self.component.name)


class Component:
    """A component of a Pipeline (owned by it).  Once the pipeline is freed,
    every call raises MloError (MLO_ESTATE) instead of reaching freed C
    state."""

    def __init__(self, pipeline, handle, name, role):
        self.pipeline, self._c, self.name, self.role = pipeline, handle, name, role
        self.tensors = []  # what add_tensor gave, in order (alive while the pipeline is)

    @property
    def handle(self):
        """The C mlo_component; MloError (MLO_ESTATE) once the pipeline is
        freed.  A raw handle kept past that is the caller's not to use."""
        with self._use("handle"):
            return self._c

    @contextlib.contextmanager
    def _use(self, what):
        with self.pipeline._use("%s '%s'" % (what, self.name)) as pipe:
            yield pipe

    def add_tensor(self, name, dtype, shape, data_ptr=None, buffer=False, file=None,
                   file_offset=0):
        """Declares a tensor whose bytes are at data_ptr (copied into the
        component's slab at materialization), or in `file` at file_offset
        (read at materialization, or at each load where the disk tier keeps
        the component in its files: host_budget), or zero-filled without
        either.  Returns its Tensor (host_data(), device_ptr(), ...)."""
        what = "%s: tensor %r" % (self.name, name)
        d = _lib.TensorDesc()
        d.size = ctypes.sizeof(d)
        d.name = _c_name(name, what)
        if dtype not in _lib.DTYPE:
            raise ValueError("%s: unknown dtype %r (known: %s)" % (what, dtype,
                                                                ", ".join(_lib.DTYPES)))
        d.dtype = _lib.DTYPE[dtype]
        shape = list(shape)
        if len(shape) > _lib.MAX_DIMS:
            raise ValueError("%s: %d dimensions (at most %d)" % (what, len(shape), _lib.MAX_DIMS))
        d.ndim = len(shape)
        for i, n in enumerate(shape):
            d.shape[i] = _c_uint(n, "%s: dimension %d" % (what, i), 63)
        d.flags = _lib.TENSOR_BUFFER if buffer else 0
        d.data = None if data_ptr is None else _c_uint(data_ptr, what + ": data_ptr")
        if file is not None:
            if data_ptr is not None:
                raise ValueError("%s: data_ptr and file both given (one source only)" % what)
            if not isinstance(file, (str, os.PathLike)):
                raise ValueError("%s: file must be a path, not %s" % (what, type(file).__name__))
            d.file = _c_name(os.fspath(file), what + ": file")
            d.file_offset = _c_uint(file_offset, what + ": file_offset", 63)
        elif file_offset:
            raise ValueError("%s: file_offset without a file" % what)
        t = ctypes.c_void_p()
        with self._use("add_tensor") as pipe:
            _check(lib().mlo_tensor_add(self._c, ctypes.byref(d), ctypes.byref(t)), what, pipe)
            tensor = Tensor(self, t, name)
            self.tensors.append(tensor)
            _TENSORS[t.value] = tensor
        return tensor

    # The Tensor's own methods, taking a Tensor or (as when add_tensor gave
    # a c_void_p) its raw handle or address: checked, never passed unchecked.
    @staticmethod
    def host_data(tensor):
        return _tensor(tensor, "host_data").host_data()

    @staticmethod
    def device_ptr(tensor):
        return _tensor(tensor, "device_ptr").device_ptr()

    @staticmethod
    def device_status(tensor):
        """Tensor.device_status: 0, or MLO_ESTATE where it has no device
        address now."""
        return _tensor(tensor, "device_status").device_status()

    @staticmethod
    def nbytes(tensor):
        return _tensor(tensor, "nbytes").nbytes

    @staticmethod
    def tensor_block(tensor):
        """Tensor.block: its block's index, or -1 (prologue) / -2
        (epilogue)."""
        return _tensor(tensor, "tensor_block").block

    @property
    def block_count(self):
        with self._use("block_count"):
            return lib().mlo_component_block_count(self._c)

    def stream_info(self):
        """How it moves under the policy in force (mlo_component_stream_info):
        slots > 0 when it streams."""
        s = _lib.StreamInfo()
        s.size = ctypes.sizeof(s)
        with self._use("stream_info") as pipe:
            _check(lib().mlo_component_stream_info(self._c, ctypes.byref(s)), "stream_info", pipe)
        return {f: getattr(s, f) for f, _ in s._fields_ if f != "size"}

    def set_progressive(self, on):
        """Its forward begins and ends every block, so its loads may go
        block by block (mlo_component_set_progressive): from its next load."""
        with self._use("set_progressive") as pipe:
            _check(lib().mlo_component_set_progressive(self._c, 1 if on else 0),
                   "set_progressive '%s'" % self.name, pipe)

    def block_begin(self, block):
        """Before block `block`'s compute (mlo_block_begin): its tensors have
        a device copy until block_end."""
        with self._use("block_begin") as pipe:
            _check(lib().mlo_block_begin(self._c, _c_uint(block, "block_begin")),
                   "block_begin '%s' %d" % (self.name, block), pipe)

    def block_end(self, block):
        with self._use("block_end") as pipe:
            _check(lib().mlo_block_end(self._c, _c_uint(block, "block_end")),
                   "block_end '%s' %d" % (self.name, block), pipe)

    @property
    def bytes(self):
        with self._use("bytes"):
            return lib().mlo_component_bytes(self._c)

    @property
    def device(self):
        """The index of the pipeline device it is on (mlo_component_device):
        0 until an enable places it, unless pinned."""
        with self._use("device"):
            return lib().mlo_component_device(self._c)

    def set_device(self, index):
        """Pins it to device `index` of its pipeline (placement leaves it
        there), or with None lets placement choose again
        (mlo_component_set_device; before enable).  MloInvalidError for an
        index past the devices."""
        if index is None:
            index = _lib.DEVICE_ANY
        elif isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise MloError(_EINVAL, "'%s': device %r is not a device index (0, 1, ...)"
                           % (self.name, index))
        elif index >= 1 << 31:
            raise MloError(_EINVAL, "'%s': device %d is not one of the pipeline's %d"
                           % (self.name, index, len(self.pipeline.devices)))
        with self._use("set_device") as pipe:
            _check(lib().mlo_component_set_device(self._c, index),
                   "set_device '%s'" % self.name, pipe)

    @property
    def resident(self):
        with self._use("resident"):
            return lib().mlo_component_is_resident(self._c)

    @property
    def load_done(self):
        """Resident with its load landed (mlo_component_load_done): its device
        bytes may be read, asked without waiting."""
        with self._use("load_done"):
            return lib().mlo_component_load_done(self._c)

    def disk_progress(self):
        """(bytes read, bytes in all) of its load from disk in flight, (0, 0)
        when none is (mlo_component_disk_progress): safe from another thread
        while one waits in acquire()."""
        done, total = ctypes.c_uint64(0), ctypes.c_uint64(0)
        with self._use("disk_progress") as pipe:
            _check(lib().mlo_component_disk_progress(self._c, ctypes.byref(done),
                                                     ctypes.byref(total)),
                   "disk_progress '%s'" % self.name, pipe)
        return done.value, total.value

    def evict(self):
        """Drops its device copy now (mlo_component_evict)."""
        with self._use("evict") as pipe:
            _check(lib().mlo_component_evict(self._c), "evict '%s'" % self.name, pipe)

    def acquire(self):
        with self._use("acquire") as pipe:
            _check(lib().mlo_component_acquire(self._c), "acquire '%s'" % self.name, pipe)

    def release(self):
        with self._use("release") as pipe:
            _check(lib().mlo_component_release(self._c), "release '%s'" % self.name, pipe)

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def stats(self):
        s = _lib.ComponentStats()
        with self._use("stats"):
            _check(lib().mlo_component_get_stats(self._c, ctypes.byref(s)), "stats")
        return {f: getattr(s, f) for f, _ in s._fields_}


class Pipeline:
    """Components on a platform, and the offload backend over them.

    free() (or the platform's close(), or leaving a `with` block) frees the
    C pipeline; every later call on it or its components raises MloError
    (MLO_ESTATE).  free() refuses (MLO_EBUSY) while other threads are inside
    a call on it, rather than freeing under them.  A pipeline that becomes
    garbage is freed then (its platform stays open while it lives)."""

    def __init__(self, platform, pin_host=True):
        """platform: a Platform, or a list of Platforms of one kind for a
        pipeline over several devices (mlo_pipeline_options.devices: each
        component placed on one of them at enable, or pinned with
        Component.set_device); the first is the pipeline's own."""
        devices = list(platform) if isinstance(platform, (list, tuple)) else [platform]
        if not devices or not all(isinstance(d, Platform) for d in devices):
            raise ValueError("pipeline: a Platform or a non-empty list of Platforms, not %r"
                             % (platform,))
        if len(devices) > _lib.MAX_DEVICES:
            raise ValueError("pipeline: %d devices (at most %d)" % (len(devices),
                                                                    _lib.MAX_DEVICES))
        if len({id(d) for d in devices}) != len(devices):
            raise ValueError("pipeline: a Platform is given twice (each device is its own "
                             "Platform)")
        o = _lib.PipelineOptions()
        o.size = ctypes.sizeof(o)
        o.platform = devices[0]._handle("pipeline")
        o.pin_host = bool(pin_host)
        o.slab_alignment = 256
        handles = (ctypes.c_void_p * len(devices))(*[d._handle("pipeline") for d in devices])
        if len(devices) > 1:
            o.devices = ctypes.cast(handles, ctypes.POINTER(ctypes.c_void_p))
            o.ndevices = len(devices)
        self._h = _Handle()
        self._lock = threading.Lock()
        self._inflight = 0
        self._freed_why = ""  # " (its platform closed)"
        _check(lib().mlo_pipeline_create(ctypes.byref(o), ctypes.byref(self._h.value)), "pipeline")
        self.platform = devices[0]
        self.devices = devices  # kept open as long as the pipeline lives
        self.components = []
        for d in devices:  # closing any of them frees the pipeline first
            d._pipelines.add(self)
            d._h.children.add(self._h)
        weakref.finalize(self, _free_pipeline, self._h)

    @property
    def _p(self):
        return self._h.value

    @property
    def handle(self):
        """The C mlo_pipeline; MloError (MLO_ESTATE) once freed.  A raw
        handle kept past free() is the caller's not to use."""
        with self._use("handle") as p:
            return p

    def _enter(self, what):
        """A call on it begins: free() refuses until _leave()."""
        with self._lock:
            if not self._p:
                raise MloError(_ESTATE, "%s: pipeline freed%s" % (what, self._freed_why))
            self._inflight += 1
            return self._p

    def _leave(self):
        with self._lock:
            self._inflight -= 1

    @contextlib.contextmanager
    def _use(self, what):
        p = self._enter(what)
        try:
            yield p
        finally:
            self._leave()

    def add_component(self, name, role):
        if isinstance(role, str):
            if role not in _ROLE_NAMES:
                raise ValueError("component %r: unknown role %r (known: %s)" %
                                 (name, role, ", ".join(_ROLE_NAMES)))
            role = _ROLE_NAMES[role]
        elif role not in _ROLE_NAMES.values():
            raise ValueError("component %r: unknown role %r" % (name, role))
        cname = _c_name(name, "component")
        c = ctypes.c_void_p()
        with self._use("add_component") as p:
            _check(lib().mlo_component_add(p, cname, role, ctypes.byref(c)),
                   "component '%s'" % name, p)
        comp = Component(self, c, name, role)
        self.components.append(comp)
        return comp

    def set_progress(self, fn):
        """fn(component, done, total) as a materialization reads a
        component's file-backed tensors into its slab, in bytes (at least
        once per component, with done == total at its end); None: none
        (mlo_pipeline_set_progress).  It may run on libmlo's threads, with
        the pipeline's lock held: it must not call mlo, and what it raises
        is dropped (it cannot cross into C)."""
        by_handle = {}
        me = weakref.ref(self)  # kept by the pipeline: no cycle through C

        def call(comp, done, total, _user):
            collecting = gc.isenabled()  # no finalizer may free an mlo object in here
            gc.disable()
            try:
                if comp not in by_handle and me() is not None:
                    by_handle.update({c._c.value: c for c in me().components})
                fn(by_handle.get(comp), done, total)
            except Exception:
                pass
            finally:
                if collecting:
                    gc.enable()

        c = _lib.PROGRESS_FN(call) if fn is not None else _lib.PROGRESS_FN()
        with self._use("set_progress") as p:
            lib().mlo_pipeline_set_progress(p, c, None)
        # a materialization already started may call the one it took until
        # it ends: every one stays alive as long as the pipeline
        self._progress_fns = getattr(self, "_progress_fns", []) + [c]

    def materialize(self):
        with self._use("materialize") as p:
            _check(lib().mlo_pipeline_materialize(p), "materialize", p)

    def enable(self, policy="strict", budget=0, reserve=0, prefetch=True, host_budget=0):
        """mlo_offload_enable.  host_budget: host memory the slabs may keep
        (bytes, 0 = all of them); components declared from files that do
        not fit stay there and each load reads them (docs/disk.md)."""
        pol = ctypes.c_int()
        if not isinstance(policy, str) or "\0" in policy or \
                lib().mlo_policy_from_name(policy.encode(), ctypes.byref(pol)):
            raise ValueError("enable: unknown policy %r (strict or budget)" % (policy,))
        s = _lib.OffloadSettings()
        s.size = ctypes.sizeof(s)
        s.sync = _lib.SYNC_EVENT
        s.pin_host = True
        s.policy = pol.value
        s.budget_bytes = _c_uint(budget, "enable: budget")
        s.reserve_bytes = _c_uint(reserve, "enable: reserve")
        s.prefetch = bool(prefetch)
        s.host_budget_bytes = _c_uint(host_budget, "enable: host_budget")
        with self._use("enable") as p:
            _check(lib().mlo_offload_enable(p, ctypes.byref(s)), "enable", p)

    def disable(self):
        with self._use("disable") as p:
            _check(lib().mlo_offload_disable(p), "disable", p)

    @property
    def enabled(self):
        with self._use("enabled") as p:
            return lib().mlo_offload_is_enabled(p)

    def set_schedule(self, runs):
        """runs: [(Component, repeat), ...], one request (docs/planner.md)."""
        arr = (_lib.ScheduleEntry * max(1, len(runs)))()
        for i, (c, n) in enumerate(runs):
            if not isinstance(c, Component) or c.pipeline is not self:
                raise ValueError("schedule entry %d: not a component of this pipeline" % i)
            arr[i].comp, arr[i].repeat = c._c, _c_uint(n, "schedule entry %d: repeat" % i, 32)
        with self._use("set_schedule") as p:
            _check(lib().mlo_pipeline_set_schedule(p, arr, len(runs)), "schedule", p)

    def learn_schedule(self, learn=True):
        """Learns the schedule from the calls (mlo_pipeline_learn_schedule):
        the budget policy prefetches from the second request on."""
        with self._use("learn_schedule") as p:
            _check(lib().mlo_pipeline_learn_schedule(p, bool(learn)), "learn_schedule", p)

    def schedule(self):
        """The schedule in force, declared or learned: [(Component, repeat)]."""
        by_handle = {c._c.value: c for c in self.components}
        with self._use("schedule") as p:
            n = ctypes.c_size_t()
            _check(lib().mlo_pipeline_get_schedule(p, None, 0, ctypes.byref(n)), "schedule", p)
            cap = n.value
            arr = (_lib.ScheduleEntry * max(1, cap))()
            _check(lib().mlo_pipeline_get_schedule(p, arr, cap, ctypes.byref(n)), "schedule", p)
        # another thread may have learned a longer one in between: what fit
        return [(by_handle.get(arr[i].comp), arr[i].repeat) for i in range(min(cap, n.value))]

    def audit(self):
        with self._use("audit") as p:
            _check(lib().mlo_pipeline_audit(p), "audit", p)

    def synchronize(self):
        """Waits until every load this pipeline issued is on the device (a
        streamed load's kept blocks issued first, a held component's too:
        mlo_pipeline_synchronize)."""
        with self._use("synchronize") as p:
            _check(lib().mlo_pipeline_synchronize(p), "synchronize", p)

    def stats(self):
        s = _lib.PipelineStats()
        with self._use("stats") as p:
            _check(lib().mlo_pipeline_get_stats(p, ctypes.byref(s)), "stats")
        out = {f: getattr(s, f) for f, _ in s._fields_ if f != "total"}
        out.update({f: getattr(s.total, f) for f, _ in s.total._fields_})
        return out

    def reset_stats(self):
        with self._use("reset_stats") as p:
            lib().mlo_pipeline_reset_stats(p)

    @property
    def device_count(self):
        """Its devices (mlo_pipeline_device_count): 1 unless given several."""
        with self._use("device_count") as p:
            return lib().mlo_pipeline_device_count(p)

    def device_stats(self, index):
        """Device `index`'s bytes resident now and at most since the last
        reset_stats, and the budget kept there (0: none):
        mlo_pipeline_get_device_stats."""
        s = _lib.DeviceStats()
        s.size = ctypes.sizeof(s)
        with self._use("device_stats") as p:
            _check(lib().mlo_pipeline_get_device_stats(p, _c_uint(index, "device_stats"),
                                                       ctypes.byref(s)),
                   "device_stats %d (of %d devices)" % (index, len(self.devices)), p)
        return {f: getattr(s, f) for f, _ in s._fields_ if f != "size"}

    def placement(self):
        """The placement the last enable made (mlo_pipeline_get_placement):
        moved_bytes per request as libmlo's model counts them over every
        device, one_device_bytes what every component on device 0 would
        move (both 0 before a placement: one device, or not enabled yet),
        room_bytes each device's room as placement saw it."""
        s = _lib.Placement()
        s.size = ctypes.sizeof(s)
        with self._use("placement") as p:
            _check(lib().mlo_pipeline_get_placement(p, ctypes.byref(s)), "placement", p)
        return {"devices": s.devices, "moved_bytes": s.moved_bytes,
                "one_device_bytes": s.one_device_bytes,
                "room_bytes": [s.room_bytes[i] for i in range(min(s.devices, _lib.MAX_DEVICES))]}

    def free(self):
        """Frees the C pipeline (outstanding acquires go with it, as
        mlo_pipeline_free says).  Idempotent."""
        with self._lock:
            if self._p and self._inflight:
                raise MloError(_EBUSY, "free: %d call(s) on this pipeline are in progress on "
                               "other threads" % self._inflight)
            self._free_locked("")
        for d in self.devices:
            d._pipelines.discard(self)

    def _free_locked(self, why):
        if self._p:
            self._freed_why = why
            _free_pipeline(self._h)  # later calls raise from here on

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()
        return False
