"""What enable_model_offload was asked for, in one value (compared as a
whole: enabling again with the same settings is a no-op, C11, with others
MLO_EOWNED, C16), and the libmlo platform a torch device names."""
import dataclasses
import warnings

import torch


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
    parts = device.split(":", 2)
    if parts[0] == "cuda" and "stream=" not in device:
        # compute is torch's current stream: loads are ordered against it
        # (C8); the spec's other options (capacity=, ...) are kept
        if len(parts) > 1 and parts[1].isdigit():
            index, opts = parts[1], parts[2] if len(parts) > 2 else ""
        elif len(parts) > 1 and "=" not in parts[1]:
            raise ValueError("device %r: expected cuda, cuda:N or cuda[:N]:options" % device)
        else:
            index, opts = str(torch.cuda.current_device()), ":".join(parts[1:])
        stream = torch.cuda.current_stream(int(index)).cuda_stream
        return "cuda:%s:%sstream=%d" % (index, opts + "," if opts else "", stream)
    return device
