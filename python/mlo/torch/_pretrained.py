"""from_pretrained: a diffusers pipeline built empty (meta tensors) whose
every weight is declared from its range in the safetensors files, so torch
never reads one and the disk tier may leave any of them there."""
import importlib
import json
import os
import warnings
import weakref

import torch

from .. import parse_size
from ._api import enable_model_offload
from ._files import _Scratch, _read_range, _safetensors_header
from ._progress import _LazyBar, _NoBar
from ._tensors import _TORCH_DTYPES, _resolve, _set_tensor

_WEIGHT_NAMES = {"diffusers": "diffusion_pytorch_model", "transformers": "model"}


def _weight_files(folder, library, variant):
    """The safetensors files of a model folder (an index's shards, or one
    file), with the variant's when there are any: [paths]; [] with none."""
    base = _WEIGHT_NAMES[library]
    names = []
    if variant:
        names += [("%s.safetensors.index.%s.json" % (base, variant), True),
                  ("%s.%s.safetensors" % (base, variant), False)]
    names += [("%s.safetensors.index.json" % base, True), ("%s.safetensors" % base, False)]
    for i, (name, is_index) in enumerate(names):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        if variant and i >= 2:
            warnings.warn("mlo: %s has no %s weights; its %s are read" % (folder, variant, name),
                          stacklevel=4)
        if not is_index:
            return [path]
        with open(path) as f:
            weight_map = json.load(f)["weight_map"]
        return [os.path.join(folder, shard) for shard in sorted(set(weight_map.values()))]
    return []


def _target_dtype(library, cls, name, file_dtype, torch_dtype):
    """The dtype diffusers / transformers give a tensor loaded from a file
    of file_dtype: the file's without torch_dtype; else torch_dtype for a
    floating one, float32 in the class's _keep_in_fp32_modules (diffusers:
    always; transformers: for float16, and its _strict list for bfloat16)."""
    if torch_dtype is None or torch_dtype == "auto" or not file_dtype.is_floating_point:
        return file_dtype
    parts = name.split(".")
    keep = []
    if library == "diffusers":
        keep = list(getattr(cls, "_keep_in_fp32_modules", None) or [])
    else:
        if torch_dtype == torch.float16:
            keep += list(getattr(cls, "_keep_in_fp32_modules", None) or [])
        if torch_dtype in (torch.float16, torch.bfloat16):
            keep += list(getattr(cls, "_keep_in_fp32_modules_strict", None) or [])
    return torch.float32 if any(k in parts for k in keep) else torch_dtype


def _empty_module(library, cls, folder):
    """The model built from its config with its parameters on the meta
    device (accelerate's init_empty_weights; buffers computed at init are
    real)."""
    try:
        from accelerate import init_empty_weights
    except ImportError:
        raise ImportError("mlo.torch.from_pretrained builds the models empty with accelerate's "
                          "init_empty_weights: pip install accelerate") from None
    if library == "diffusers":
        config = cls.load_config(folder)
        with init_empty_weights():
            module = cls.from_config(config)
    else:
        config = cls.config_class.from_pretrained(folder)
        with init_empty_weights():
            module = cls._from_config(config)
        if hasattr(module, "tie_weights"):
            module.tie_weights()
    return module.eval()


def _declare_from_files(module, library, files, torch_dtype, scratch, what, bar=_NoBar()):
    """Every parameter and buffer of module as a meta tensor of the dtype
    diffusers would give it, and module._mlo_files {name: (path, offset)}
    for each of its names: its range in the checkpoint files, or in the
    scratch file where the file's bytes are not what the module holds (a
    conversion) or no file holds it (a buffer computed at init).  A
    parameter in no file is refused, as diffusers refuses it.  Returns
    (converted names, computed names)."""
    ranges = {}
    for path in files:
        ranges.update({k: (path,) + v for k, v in _safetensors_header(path).items()})
    prefix = getattr(module, "base_model_prefix", "") or ""
    names, places = {}, {}  # id(tensor) -> its names; each name -> (owner, attr, is_param)
    for is_param, named in ((True, module.named_parameters(remove_duplicate=False)),
                            (False, module.named_buffers(remove_duplicate=False))):
        for qname, t in named:
            if t is None:
                continue
            names.setdefault(id(t), (t, is_param, []))[2].append(qname)
            places[qname] = _resolve(module, qname) + (is_param,)
    out, converted, computed, missing = {}, [], [], []
    for t, is_param, qnames in names.values():
        found = None
        for q in qnames:
            for key in (q, prefix + "." + q if prefix else q,
                        q[len(prefix) + 1:] if prefix and q.startswith(prefix + ".") else q):
                if key in ranges:
                    found = (key, ranges[key])
                    break
            if found:
                break
        if found is None:
            if t.is_meta:
                missing.append(qnames[0])
                continue
            source, target = scratch.add(t), t.dtype  # computed at init (a rope table)
            computed.append(qnames[0])
        else:
            key, (path, code, shape, offset, nbytes) = found
            file_dtype = _TORCH_DTYPES.get(code)
            if file_dtype is None:
                raise ValueError("%s: %s holds %s as %s, which mlo does not move" %
                                 (what, path, key, code))
            if tuple(shape) != tuple(t.shape):
                raise ValueError("%s: %s is %s in %s, but the model built from its config has "
                                 "%s" % (what, key, list(shape), path, list(t.shape)))
            target = _target_dtype(library, type(module), qnames[0], file_dtype, torch_dtype)
            if target == file_dtype:
                source = (path, offset)
            else:  # materialized once, converted, into the scratch file
                raw = _read_range(path, offset, torch.empty(shape, dtype=file_dtype))
                source = scratch.add(raw.to(target))
                del raw
                converted.append(qnames[0])
                bar.update(nbytes)
        meta = torch.empty(t.shape, dtype=target, device="meta")
        for q in qnames:
            out[q] = source
            owner, attr, p = places[q]
            if p:
                getattr(owner, attr).data = meta
            else:
                owner._buffers[attr] = meta
    if missing:
        raise ValueError("%s: %d tensor(s) are in no weight file (%s): %s" %
                         (what, len(missing), ", ".join(os.path.basename(f) for f in files),
                          ", ".join(missing[:8]) + (", ..." if len(missing) > 8 else "")))
    module._mlo_files = out
    return converted, computed


def from_pretrained(pipeline_class, path, *, device=None, host_memory=None, policy="strict",
                    budget=0, reserve=0, scratch_dir=None, **kwargs):
    """pipeline_class.from_pretrained(path, **kwargs), offloaded by mlo,
    with no weight ever read into a torch tensor: each model with
    safetensors weights is built from its config on the meta device, each
    of its parameters and buffers is declared from its range in the files
    (a diffusers folder, sharded or not, `variant=`), and offload is
    enabled (enable_model_offload's device, policy, budget, reserve,
    host_memory).  With host_memory ("24G", bytes) the components that do
    not fit stay in their files and each load reads them (docs/disk.md);
    without it every slab is read into host memory once, at enable.

    `dtype=` (or its older name `torch_dtype=`) gives the dtypes diffusers
    would; a tensor whose file holds another dtype (a conversion), or that
    no file holds (a buffer computed at init), is materialized once into a
    scratch file in
    scratch_dir (the system's temporary folder by default; removed with the
    offload), with a warning naming how many and how large.  Models without
    safetensors weights, and the other components (tokenizers,
    schedulers), are loaded by diffusers.  The other keywords pass through
    to diffusers.  Returns the pipeline (its backend: pipe._mlo_offload)."""
    if not os.path.isdir(path):
        raise ValueError("mlo.torch.from_pretrained reads a local diffusers folder; %r is not "
                         "one (download it first: huggingface_hub.snapshot_download)" % (path,))
    if host_memory is not None:
        parse_size(host_memory, "host_memory")  # refused before anything is built
    index_path = os.path.join(path, "model_index.json")
    if not os.path.isfile(index_path):
        raise ValueError("%s has no model_index.json: not a diffusers pipeline folder" % path)
    with open(index_path) as f:
        index = json.load(f)
    variant = kwargs.get("variant")
    if "dtype" in kwargs and "torch_dtype" in kwargs:
        raise ValueError("from_pretrained: give dtype= or torch_dtype= (its older name), not both")
    # dtype= is diffusers' name now; torch_dtype= (deprecated there) still works
    torch_dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
    if isinstance(torch_dtype, dict):
        raise ValueError("from_pretrained: a dtype per component is not supported by mlo yet;"
                         " give one dtype")
    scratch = _Scratch(scratch_dir)
    built, notes = {}, []
    # the pipeline does not exist yet: diffusers' own switch alone turns it off
    bar = _LazyBar(None, "mlo: converting weights to %s" % str(torch_dtype).replace(
        "torch.", ""))
    try:
        for name, spec in index.items():
            if name.startswith("_") or name in kwargs or not isinstance(spec, list) or \
                    len(spec) != 2 or spec[0] not in _WEIGHT_NAMES:
                continue
            library, class_name = spec
            cls = getattr(importlib.import_module(library), class_name, None)
            if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
                continue
            folder = os.path.join(path, name)
            files = _weight_files(folder, library, variant)
            if not files:
                notes.append("%s has no safetensors weights: diffusers loads it into memory"
                             % name)
                continue
            module = _empty_module(library, cls, folder)
            converted, computed = _declare_from_files(module, library, files, torch_dtype,
                                                      scratch, name, bar)
            if converted:
                notes.append("%s: %d tensor(s) converted from their files' dtype (%s, ...)"
                             % (name, len(converted), converted[0]))
            if computed:
                notes.append("%s: %d buffer(s) computed at init, in no file (%s, ...)"
                             % (name, len(computed), computed[0]))
            built[name] = module
        scratch.close()
        bar.close()
        if scratch.bytes:
            notes.append("%.1f MiB materialized once into %s" % (scratch.bytes / 2**20,
                                                                 scratch.path))
        if notes:
            warnings.warn("mlo: from_pretrained: " + "; ".join(notes), stacklevel=2)
        pipe = pipeline_class.from_pretrained(path, **built, **kwargs)
        backend = enable_model_offload(pipe, device=device, policy=policy, budget=budget,
                                       reserve=reserve, host_memory=host_memory)
        unmanaged = [n for n, mod in built.items() if all(m.module is not mod
                                                          for m in backend.managed)]
        for n in unmanaged:  # mlo does not move it (role "other"): torch holds its weights
            _load_from_files(built[n])
        if unmanaged:
            warnings.warn("mlo: from_pretrained: %s not offloaded (no DiT, encoder or VAE "
                          "role): read into torch memory" % ", ".join(unmanaged), stacklevel=2)
    except BaseException:
        bar.close()
        scratch.remove()
        raise
    if scratch.path is not None:
        # the libmlo pipeline reads it as long as it lives (a view of its
        # memory keeps it past close_model_offload)
        weakref.finalize(backend.pipeline, scratch.remove)
    return pipe


def _load_from_files(module):
    """Every meta tensor of module read from its range into torch memory."""
    files = module._mlo_files
    for is_param, named in ((True, module.named_parameters()), (False, module.named_buffers())):
        for qname, t in named:
            if t is not None and t.is_meta:
                own = _read_range(*files[qname], torch.empty(t.shape, dtype=t.dtype))
                owner, attr = _resolve(module, qname)
                _set_tensor(owner, attr, is_param, own)
