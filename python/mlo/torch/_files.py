"""Weights in files: safetensors headers and byte ranges, the scratch file
that holds what no checkpoint holds as a module wants it, and a loaded
pipeline's tensors found in the files they came from (enable's
host_memory)."""
import bisect
import ctypes
import gc
import json
import os
import struct
import tempfile

import numpy as np
import torch

from ._progress import _NoBar, _progress_bar
from ._tensors import _TORCH_DTYPES, _flatten, _is_wrapper, _stored_bytes


def _read_range(path, offset, out):
    """out's bytes from path at offset (a CPU tensor, filled in place)."""
    n = out.numel() * out.element_size()
    if not n:
        return out
    view = memoryview(out.view(-1).view(torch.uint8).numpy())
    with open(path, "rb") as f:
        f.seek(offset)
        got = f.readinto(view)
    if got != n:
        raise OSError("%s: %d bytes at %d, but the file ends after %d" % (path, n, offset, got))
    return out


def _safetensors_header(path):
    """{name: (dtype code, shape, absolute offset, nbytes)} of a
    .safetensors file: an 8-byte little-endian header length, the JSON
    header, then the data, which the offsets count from."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("%s: not a safetensors file (shorter than its header length)" % path)
        n = struct.unpack("<Q", head)[0]
        size = os.fstat(f.fileno()).st_size
        if n > min(size - 8, 256 << 20):
            raise ValueError("%s: not a safetensors file (header of %d bytes)" % (path, n))
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise ValueError("%s: not a safetensors file (%s)" % (path, e)) from None
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        begin, end = v["data_offsets"]
        if not 0 <= begin <= end or 8 + n + end > size:
            raise ValueError("%s: tensor %r lies outside the file" % (path, name))
        out[name] = (v["dtype"], tuple(v["shape"]), 8 + n + begin, end - begin)
    return out


class _Scratch:
    """A file holding the tensors no checkpoint file holds as the module
    wants them (a conversion, a buffer computed at init): written once,
    declared from like the checkpoint's, removed with the offload."""

    def __init__(self, folder):
        self.folder = folder
        self.path = None
        self.f = None
        self.bytes = 0

    def add(self, t):
        if self.f is None:
            fd, self.path = tempfile.mkstemp(prefix="mlo-materialized-", suffix=".bin",
                                             dir=self.folder)
            self.f = os.fdopen(fd, "wb")
        at = (self.f.tell() + 255) // 256 * 256
        self.f.seek(at)
        data = t.detach().contiguous().cpu()
        if data.numel():
            self.f.write(memoryview(data.view(-1).view(torch.uint8).numpy()))
        self.bytes += data.numel() * data.element_size()
        return self.path, at

    def close(self):
        if self.f is not None:
            self.f.close()

    def remove(self):
        self.close()
        if self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def _loaded_from(module):
    """The folder a loaded model was read from (diffusers' and
    transformers' config._name_or_path), or None."""
    config = getattr(module, "config", None)
    folder = getattr(config, "_name_or_path", None)
    if folder is None and isinstance(config, dict):
        folder = config.get("_name_or_path")
    return folder if isinstance(folder, str) and os.path.isdir(folder) else None


_COMPARE_CHUNK = 16 << 20  # bytes of a file compared with a tensor at once


def _file_holds(path, offset, data):
    """Whether the file has data's bytes (a contiguous CPU tensor) at offset."""
    want = np.frombuffer(memoryview(data.view(-1).view(torch.uint8).numpy()), dtype=np.uint8)
    buf = np.empty(min(len(want), _COMPARE_CHUNK), dtype=np.uint8)
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        for at in range(0, len(want), _COMPARE_CHUNK):
            n = min(_COMPARE_CHUNK, len(want) - at)
            if f.readinto(memoryview(buf)[:n]) != n or \
                    not np.array_equal(buf[:n], want[at:at + n]):
                return False
    return True


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _FileMappings:
    """The files mapped into this process (/proc/self/maps).  diffusers maps
    a safetensors file and points its parameters into the mapping: such a
    tensor whose pages were never written is its file's bytes, with no
    need to read the file to compare (_as_mapped)."""

    def __init__(self):
        self.maps = []  # (start, end, file offset, inode, path)
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    field = line.rstrip("\n").split(None, 5)
                    if len(field) == 6 and field[5].startswith("/"):
                        lo, hi = (int(x, 16) for x in field[0].split("-"))
                        self.maps.append((lo, hi, int(field[2], 16), int(field[4]), field[5]))
        except OSError:
            pass  # not Linux: every tensor is compared
        self.maps.sort()
        self.starts = [m[0] for m in self.maps]

    def holds(self, path, offset, data):
        """Whether data (a CPU tensor) is path's bytes at offset, mapped
        there and never written since."""
        ptr, nbytes = data.data_ptr(), data.numel() * data.element_size()
        i = bisect.bisect_right(self.starts, ptr) - 1  # the mapping that starts last before it
        if i < 0:
            return False
        lo, hi, at, inode, mapped = self.maps[i]
        if not (lo <= ptr and ptr + nbytes <= hi):
            return False
        try:
            same = mapped == os.path.realpath(path) and inode == os.stat(path).st_ino
        except OSError:
            return False
        return same and at + ptr - lo == offset and _unwritten(ptr, nbytes)


def _unwritten(ptr, nbytes):
    """Whether no page of [ptr, ptr+nbytes) of a file mapping was written
    since it was mapped (/proc/self/pagemap): each is either not present
    (read from the file when touched) or the file's own page, and none is
    swapped out (only a written, anonymous copy is)."""
    first, last = ptr // _PAGE, (ptr + nbytes - 1) // _PAGE
    try:
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(first * 8)
            raw = f.read((last - first + 1) * 8)
    except OSError:
        return False
    flags = np.frombuffer(raw, dtype=np.uint64)
    if len(flags) != last - first + 1:
        return False
    present, swapped, file_page = (flags >> 63) & 1, (flags >> 62) & 1, (flags >> 61) & 1
    return not swapped.any() and bool(np.all(file_page | (present ^ 1)))


def _find_loaded_files(backend, found, scratch, pipe=None):
    """For the disk tier over a pipeline already loaded into torch memory
    (enable_model_offload's host_memory): each tensor of each module, found
    in the safetensors files its model was loaded from (its name, dtype,
    shape and every byte the same: still the file's mapped pages, never
    written, or compared with the file), else written once into the scratch
    file, in backend.loaded_files, so that every component may be declared
    from files and the disk tier may leave any of them there.  Returns the
    names written to the scratch file and their bytes."""
    spilled, spilled_bytes, seen = [], 0, set()
    total = sum(_stored_bytes(t) for _, module, _ in found
                for named in (module.parameters(), module.buffers())
                for t in named if t is not None and not t.is_meta)
    # none where nothing is in torch memory (from_pretrained's meta modules)
    bar = _progress_bar(pipe, "mlo: finding the weights in their files", total) if total \
        else _NoBar()
    mappings = _FileMappings()
    try:
        for name, module, _ in found:
            got, names, nbytes = _find_module_files(name, module, scratch, seen, bar, mappings)
            backend.loaded_files[id(module)] = got
            spilled += names
            spilled_bytes += nbytes
    finally:
        bar.close()
    return spilled, spilled_bytes


def _find_module_files(name, module, scratch, seen, bar, mappings):
    """_find_loaded_files for one module: {name: (path, offset)}, the names
    written to the scratch file, their bytes."""
    ranges = {}
    folder = _loaded_from(module)
    if folder is not None:
        for f in sorted(os.listdir(folder)):
            if f.endswith(".safetensors"):
                path = os.path.join(folder, f)
                try:
                    header = _safetensors_header(path)
                except (OSError, ValueError, KeyError, TypeError):
                    continue  # a search, not a load: its tensors are compared or written out
                for k, v in header.items():
                    ranges.setdefault(k, []).append((path,) + v)
    prefix = getattr(module, "base_model_prefix", "") or ""
    out, spilled, spilled_bytes = {}, [], 0
    for named in (module.named_parameters(), module.named_buffers()):
        for qname, t in named:
            if t is not None and _is_wrapper(t):
                # a tensor subclass (torchao's): its inner tensors, which no
                # file holds as they are, named as add_module declares them
                for path, x in _flatten(t)[1]:
                    if x.numel() and x.data_ptr() not in seen:
                        seen.add(x.data_ptr())
                        inner = "%s.%s" % (qname, ".".join(path))
                        out[inner] = scratch.add(x)
                        spilled.append("%s.%s" % (name, inner))
                        spilled_bytes += x.numel() * x.element_size()
                        bar.update(x.numel() * x.element_size())
                continue
            if t is None or t.is_meta or not t.numel() or t.data_ptr() in seen:
                continue  # no bytes, or another component's (a reference: C6)
            seen.add(t.data_ptr())
            data = t.detach().contiguous()
            nbytes = data.numel() * data.element_size()
            keys = (qname, prefix + "." + qname if prefix else qname,
                    qname[len(prefix) + 1:] if prefix and qname.startswith(prefix + ".")
                    else qname)
            for path, code, shape, offset, _ in (c for k in dict.fromkeys(keys)
                                                 for c in ranges.get(k, ())):
                if _TORCH_DTYPES.get(code) == data.dtype and \
                        tuple(shape) == tuple(data.shape) and (
                            mappings.holds(path, offset, data) or
                            _file_holds(path, offset, data)):
                    out[qname] = (path, offset)
                    break
            else:
                out[qname] = scratch.add(data)
                spilled.append("%s.%s" % (name, qname))
                spilled_bytes += nbytes
            bar.update(nbytes)
    return out, spilled, spilled_bytes


def _give_back_freed_memory():
    """What torch freed goes back to the OS: glibc keeps freed chunks of its
    heap (torch's CPU allocations below its mmap threshold) until trimmed."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass  # not glibc: its allocator gives back what it gives back
