"""enable_model_offload, disable_model_offload, close_model_offload."""
import warnings
import weakref

from .. import MloOwnedError, parse_size
from ._backend import Offload
from ._discovery import OffloadDelegate, _foreign_offload, discover
from ._files import _Scratch, _find_loaded_files, _give_back_freed_memory
from ._guards import _guard_pipeline, _unguard_pipeline
from ._settings import OffloadSettings, _device_list, _place_items


def enable_model_offload(pipe, device=None, policy="strict", budget=0, reserve=0,
                         prefetch=True, check_writes=True, progressive=True, host_memory=None,
                         scratch_dir=None, place=None):
    """Model-level offload of a diffusers (or any) pipeline through libmlo.

    device: where compute runs: None (the GPU torch sees; the host stand-in
    with a warning when there is none), "cuda", "cuda:1", a torch.device,
    "cpu" (the host platform), or a libmlo spec ("host:capacity=4G"); or
    a list of them, all of one kind, for one pipeline over several devices
    (["cuda:0", "cuda:1"]; host stand-ins ["host:capacity=1G",
    "host:capacity=1G"], each its own budget): libmlo places each component
    on one device at enable, to move the fewest bytes per request
    (docs/placement.md), and each forward runs there, its tensors moved to
    that device and its outputs back to the first, where the pipeline's
    own are (device_placement() says where each went).
    place: pins, {component name: device}, the device an index into the
    list or one of its entries as given ({"text_encoder": 1},
    {"vae": "cuda:1"}); placement leaves them there.  A name that is no
    component raises MloNotFoundError, a device not in the list
    MloInvalidError, a pin that cannot fit its device
    MloDeviceOutOfMemoryError (naming the sizes).
    policy: "strict" (the specification: a DiT's forward evicts encoders and
    the other DiTs, an encoder's evicts the DiTs; VAEs stay) or "budget"
    (keep what fits in `budget` bytes, evict by next use, prefetch from the
    schedule libmlo learns from the first generation's calls).
    check_writes: writes into the weights while offloaded (a LoRA fuse,
    load_state_dict, p.data.mul_()) reach mlo's memory before any eviction
    (a fingerprint of each resident block at each switch; False skips it).
    progressive: a component whose blocks each have a module of their own
    (`blocks.3`) loads block by block once a forward has been seen to run
    every block's hooks, each block's compute then ordered after its own
    copy, so a switch waits for the first block, not the whole component
    (docs/streaming.md); False loads each whole.
    host_memory: host memory the weights may keep ("24G", or bytes; None:
    all of them).  Components declared from files (from_pretrained) that
    do not fit stay there, and each load reads them through a small pinned
    staging ring (docs/disk.md).  A pipeline already loaded into torch
    memory may be sent there too: each tensor is found in the safetensors
    files its model was loaded from (compared byte for byte), or written
    once into a scratch file in scratch_dir (the system's temporary folder
    by default; removed with the offload), with a warning, and torch's
    copies are freed and given back to the OS once enable has succeeded.
    Idempotent with the same arguments (C11); different ones raise MloError
    (EOWNED, C16).  On failure the modules are left as they were (C15).
    Returns the backend (pipe._mlo_offload)."""
    current = getattr(pipe, "_mlo_offload", None)
    host_budget = 0 if host_memory is None else parse_size(host_memory, "host_memory")
    if isinstance(device, list):  # compared as a value (C11): a tuple
        device = tuple(device)
    _device_list(device)  # its shape, before anything is built
    settings = OffloadSettings(device, policy, budget, reserve, prefetch, host_budget,
                               check_writes, progressive, _place_items(place))
    if current is not None and current.closed:
        current = None
    if current is not None:
        if current.settings != settings:
            raise MloOwnedError("offload is already enabled with other settings")
        if not current.enabled:
            _reenable(pipe, current)
        return current
    backend = Offload(settings)
    backend.pipe_ref = weakref.ref(pipe)  # its progress bar settings
    scratch = None
    try:
        if isinstance(pipe, OffloadDelegate):
            pipe.mlo_enable_offload(backend)
            if not backend.enabled:
                backend.start()
        else:
            found = discover(pipe)
            foreign = _foreign_offload(pipe, [(n, mod) for n, mod, _ in found])
            if foreign:
                raise ValueError("the pipeline has another offload installed; remove it before "
                                 "mlo's: " + "; ".join(foreign))
            if host_budget:  # every tensor from a file, so any component may stay on disk
                scratch = _Scratch(scratch_dir)
                spilled, spilled_bytes = _find_loaded_files(backend, found, scratch, pipe)
                scratch.close()  # libmlo checks each range lies inside its file
                if spilled:
                    warnings.warn("mlo: host_memory: %d tensor(s), %.1f MiB, are in no file "
                                  "their model was loaded from (built in memory, or changed "
                                  "since: a fused LoRA; %s, ...): written once to %s for the "
                                  "disk tier to read" % (len(spilled), spilled_bytes / 2**20,
                                                         spilled[0], scratch.path),
                                  stacklevel=2)
            for name, module, role in found:
                backend.add_module(name, module, role)
            if not any(m.role == "dit" for m in backend.managed):
                raise ValueError("no DiT found (declare the components: "
                                 "SupportsComponentDiscovery)")
            backend.start()
            for m in backend.managed:
                backend.hook(m)
            _guard_pipeline(pipe, backend)
    except BaseException:
        for m in backend.managed:
            backend.unhook(m)
        backend.restore()
        if isinstance(pipe, OffloadDelegate) and backend.enabled:
            pipe.mlo_disable_offload(backend)
        if scratch is not None:
            scratch.remove()
        raise
    pipe._mlo_offload = backend
    backend.pipe_ref = weakref.ref(pipe)
    if scratch is not None:
        if scratch.path is not None:  # read by the libmlo pipeline as long as it lives
            weakref.finalize(backend.pipeline, scratch.remove)
        _give_back_freed_memory()  # torch's copies of what went to disk
    return backend


def _reenable(pipe, backend):
    backend.settle_and_check()  # writes made while disabled, before enable may evict
    for m in backend.managed:
        if m.streams and m.comp.resident:
            # its slots may hold blocks copied before a write into its slab
            # (made while disabled): drop them, the next forward reloads
            m.comp.evict()
            backend._bind(m, "host")
    backend.enable()
    if isinstance(pipe, OffloadDelegate):
        pipe.mlo_enable_offload(backend)
    else:
        for m in backend.managed:
            backend.hook(m)
        _guard_pipeline(pipe, backend)


def disable_model_offload(pipe):
    """Removes every hook and moves nothing (C14); idempotent (C11).  The
    weights stay in libmlo's memory, where the modules' tensors point: the
    backend stays on the pipeline, and enabling again reuses it."""
    backend = getattr(pipe, "_mlo_offload", None)
    if backend is None or not backend.enabled:
        return
    if isinstance(pipe, OffloadDelegate):
        pipe.mlo_disable_offload(backend)
    backend.settle_and_check()  # no copy in flight after disable, every write kept
    for m in backend.managed:
        backend.unhook(m)
    _unguard_pipeline(backend)
    backend.pipeline.disable()
    backend.enabled = False


def close_model_offload(pipe):
    """Ends mlo's hold on the pipeline: the weights go back to torch-owned
    CPU tensors (with every write made to them), the hooks go, and libmlo's
    pipeline and platform are freed at once.  The pipeline then runs as
    plain torch; enable_model_offload may be called again.  Idempotent."""
    backend = getattr(pipe, "_mlo_offload", None)
    if backend is not None:
        backend.close()
