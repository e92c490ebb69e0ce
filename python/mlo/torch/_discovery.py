"""Which modules of a pipeline are components, in which role: the
pipeline's own declaration, else diffusers' components read as libmlo
reads a checkpoint; and the other offloads on them that mlo refuses to
run beside (diffusers' casts it keeps)."""
import abc
import warnings

import torch

from .. import role_from_class, role_guess
from ._hooks import _ExecutionDevice


class SupportsComponentDiscovery:
    """A pipeline's own declaration of its components: subclass it and set
    the module attribute names per role (as vLLM-Omni's protocol of the
    same name).  A pipeline may instead set a ``mlo_components`` dict
    {"dit": [...], "encoder": [...], "vae": [...]} on itself."""
    _dit_modules = ()
    _encoder_modules = ()
    _vae_modules = ()


class OffloadDelegate(abc.ABC):
    """A pipeline whose mutually exclusive parts are nested inside one module
    (C10) provides its own pair: enable_model_offload calls
    ``mlo_enable_offload(backend)`` instead of installing the generic hooks
    (the delegate declares components with backend.add_module and hooks them
    with backend.hook), and disable calls ``mlo_disable_offload(backend)``,
    which must remove every hook it installed and move nothing."""

    @abc.abstractmethod
    def mlo_enable_offload(self, backend):
        ...

    @abc.abstractmethod
    def mlo_disable_offload(self, backend):
        ...


def discover(pipe):
    """[(name, module, role)] in the pipeline's order: its own declaration
    (SupportsComponentDiscovery, or a mlo_components dict), else diffusers'
    components by class and name, as libmlo reads a checkpoint's
    (mlo_role_from_class, then mlo_role_guess with one warning naming every
    guess)."""
    declared = getattr(pipe, "mlo_components", None)
    if declared is None and isinstance(pipe, SupportsComponentDiscovery):
        declared = {"dit": pipe._dit_modules, "encoder": pipe._encoder_modules,
                    "vae": pipe._vae_modules}
    out = []
    if declared is not None:
        for role in ("encoder", "dit", "vae"):
            for name in declared.get(role, ()):
                module = getattr(pipe, name, None)
                if module is None:
                    raise ValueError("the pipeline declares %s '%s', which it does not have"
                                     % (role, name))
                out.append((name, module, role))
        return out
    comps = getattr(pipe, "components", None)
    if comps is None:
        raise ValueError("cannot discover components: the pipeline has neither a declaration "
                         "(SupportsComponentDiscovery, mlo_components) nor diffusers' .components")
    guessed = []
    for name, module in comps.items():
        if not isinstance(module, torch.nn.Module):
            continue
        # as libmlo reads a checkpoint: the model class when it knows it,
        # else its name heuristic, which warns
        cls = type(module).__name__
        role = role_from_class(cls)
        if role is None:
            role = role_guess(name, cls)
            if role != "other":
                guessed.append("%s (%s)" % (name, role))
        if role != "other":
            out.append((name, module, role))
    if guessed:
        warnings.warn("mlo: roles guessed from diffusers' component names: " + ", ".join(guessed),
                      stacklevel=3)
    return out


_DIFFUSERS_OFFLOAD = ("enable_model_cpu_offload", "enable_sequential_cpu_offload",
                      "enable_group_offload")
# diffusers' hooks that cast, not offload (enable_layerwise_casting): the
# weights stay where they are, in their storage dtype, which mlo moves
_DIFFUSERS_CASTS = {"layerwise_casting", "peft_autocast_disable"}


def _foreign_offload(pipe, modules):
    """What offload hooks of diffusers' or accelerate's are on the pipeline's
    modules: a list of "name: how" strings."""
    found = []
    for name, module in modules:
        for sub in module.modules():
            hook = getattr(sub, "_hf_hook", None)
            if hook is not None and not isinstance(hook, _ExecutionDevice):
                kind = type(hook).__name__
                how = "enable_sequential_cpu_offload" if "AlignDevices" in kind or \
                    "Sequential" in kind else "enable_model_cpu_offload"
                found.append("%s: accelerate's %s (%s; pipe.remove_all_hooks() removes it)"
                             % (name, kind, how))
                break
            registry = getattr(sub, "_diffusers_hook", None)
            hooks = getattr(registry, "hooks", None) if registry is not None else None
            hooks = sorted(set(hooks or ()) - _DIFFUSERS_CASTS)
            if hooks:
                found.append("%s: diffusers' hooks %s (enable_group_offload; the model's "
                             "disable_group_offload() removes it)" % (name, ", ".join(hooks)))
                break
    return found
