"""What enable_model_offload was asked for, in one value (compared as a
whole: enabling again with the same settings is a no-op, C11, with others
MLO_EOWNED, C16), and the libmlo platform a torch device names."""
import dataclasses
import warnings

import torch

from .. import platform_spec_compose, platform_spec_get, platform_spec_parts


@dataclasses.dataclass(frozen=True)
class OffloadSettings:
    """enable_model_offload's arguments, host_memory in bytes (0: none)."""
    device: object = None
    policy: str = "strict"
    budget: int = 0
    reserve: int = 0
    prefetch: bool = True
    host_budget: int = 0
    check_writes: bool = True
    progressive: bool = True
    place: tuple = ()  # ((component name, device index or as given), ...), sorted


def _device_list(device):
    """device as a tuple of what the user named, one per device: a list or
    tuple of devices (several), anything else one."""
    if isinstance(device, (list, tuple)):
        if not device:
            raise ValueError("device: an empty list (give one device or several)")
        if len(device) > 16:
            raise ValueError("device: %d devices (a pipeline takes at most 16)" % len(device))
        if any(d is None or isinstance(d, (list, tuple)) for d in device):
            raise ValueError("device: %r: each device of a list is named (\"cuda:1\", "
                             "\"host:capacity=4G\", a torch.device)" % (device,))
        return tuple(device)
    return (device,)


def _platform_specs(device):
    """The libmlo platform of each device a user names (_platform_spec),
    checked to make one pipeline: all of one kind, no GPU twice."""
    devices = _device_list(device)
    if len(devices) > 1:  # before any is opened (a cuda one needs a GPU)
        kinds = {_kind(d) for d in devices}
        if len(kinds) > 1:
            raise ValueError("device: %r mixes %s; a pipeline's devices are of one kind "
                             "(several GPUs, or several host stand-ins)" %
                             (list(devices), " and ".join(sorted(kinds))))
    specs = [_platform_spec(d) for d in devices]
    if len(specs) > 1:
        cuda = [platform_spec_parts(s)[1] for s in specs if s.startswith("cuda:")]
        twice = sorted({i for i in cuda if cuda.count(i) > 1})
        if twice:
            raise ValueError("device: cuda:%d is named twice; each device of a pipeline is "
                             "another GPU" % twice[0])
    return specs


def _kind(device):
    """The platform a device names, before it is opened: "host" (cpu
    included), "cuda", or a libmlo spec's own name."""
    if isinstance(device, torch.device):
        return "host" if device.type == "cpu" else device.type
    if isinstance(device, str):
        return "host" if device == "cpu" else device.split(":", 1)[0]
    return repr(device)


def _place_items(place):
    """place= as a sorted tuple of (name, device) (a dict or pairs), checked
    for shape only: the names and devices are checked against the pipeline
    at enable (_backend.Offload.pin)."""
    if place is None:
        return ()
    items = place.items() if isinstance(place, dict) else place
    try:
        out = [(name, dev) for name, dev in items]
    except (TypeError, ValueError):
        raise ValueError("place: %r is not a {component name: device} dict" % (place,)) from None
    for name, _ in out:
        if not isinstance(name, str):
            raise ValueError("place: %r is not a component name" % (name,))
    if len({n for n, _ in out}) != len(out):
        raise ValueError("place: a component is pinned twice: %r" % (place,))
    return tuple(sorted(((n, str(d) if isinstance(d, torch.device) else d) for n, d in out),
                        key=lambda x: x[0]))


def _platform_spec(device):
    """The libmlo platform for what a torch user passes: None (the GPU torch
    sees, else the host stand-in, with a warning), "cpu" / torch.device
    ("cpu"), "cuda", "cuda:N", torch.device("cuda", N), or a libmlo spec
    ("host:capacity=4G", "cuda:0:stream=...")."""
    if device is None:
        if torch.cuda.is_available():
            device = "cuda"
        else:
            warnings.warn("mlo: torch sees no GPU: the weights go to libmlo's host platform, a "
                          "stand-in device in host memory (pass device= to choose)", stacklevel=4)
            return "host"
    if isinstance(device, torch.device):
        if device.type == "cpu":
            return "host"
        if device.type != "cuda":
            raise ValueError("device %s: mlo runs on cuda or the host platform" % device)
        device = "cuda" if device.index is None else "cuda:%d" % device.index
    if not isinstance(device, str):
        raise ValueError("device: %r is neither a str nor a torch.device" % (device,))
    if device == "cpu":
        return "host"
    if device.split(":", 1)[0] == "cuda":
        try:  # libmlo's own grammar (mlo_platform_spec_*), not a split of ours
            _, index = platform_spec_parts(device)
        except ValueError:
            raise ValueError("device %r: expected cuda, cuda:N or cuda[:N]:options" %
                             device) from None
        if platform_spec_get(device, "stream") is None:
            # compute is torch's current stream: loads are ordered against it
            # (C8); the spec's other options (capacity=, ...) are kept
            index = torch.cuda.current_device() if index is None else index
            stream = torch.cuda.current_stream(index).cuda_stream
            return platform_spec_compose(device, index, "stream", stream)
    return device
