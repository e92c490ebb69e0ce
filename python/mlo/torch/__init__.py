"""mlo.torch — model-level offload for PyTorch / diffusers pipelines, on
libmlo (docs/python.md).

    import mlo.torch
    mlo.torch.enable_model_offload(pipe, device="cuda")      # or "host:capacity=4G"
    frames = pipe(prompt, num_inference_steps=40).frames
    mlo.torch.disable_model_offload(pipe)

Each DiT, encoder and VAE module becomes a component of a libmlo pipeline:
every parameter and buffer (a tied one once) is a tensor of it, copied once
into the component's host slab, and the module's tensors are rebound to
views of that slab; when libmlo makes a component resident its tensors are
rebound to views of the device block, and back to the slab when it is
evicted.  torch never copies, allocates or pins weights; libmlo decides
every load and eviction (the specification's exclusion rule, or the budget
policy) and orders compute after loads.  Forward pre/post hooks acquire and
release; a VAE's decode/encode are wrapped the same way (C17).

The package's modules, each one job: _api (enable, disable, close),
_backend (Offload: declaring, binding, acquire/release, blocks, life
cycle), _hooks (the hook objects on the modules), _writes (the write
check), _tensors (views, entries, tensor subclasses), _discovery
(components and roles, other offloads), _guards (pipe.to and diffusers'
entry points while offloaded), _settings (OffloadSettings, device specs),
_files and _pretrained (weights in files, from_pretrained), _progress
(progress bars, the logger).
"""
from ._api import close_model_offload, disable_model_offload, enable_model_offload
from ._backend import Offload
from ._discovery import OffloadDelegate, SupportsComponentDiscovery, discover
from ._hooks import BlockHooks, CastHooks, ComponentHooks
from ._pretrained import from_pretrained
from ._settings import OffloadSettings
from ._tensors import _DTYPES, _TORCH_DTYPES  # noqa: F401 (python/tests/record.py reads them)

__all__ = ["enable_model_offload", "disable_model_offload", "close_model_offload",
           "from_pretrained", "SupportsComponentDiscovery", "OffloadDelegate", "Offload",
           "OffloadSettings", "ComponentHooks", "BlockHooks", "CastHooks", "discover"]
