"""nxd-compat's stand-in for torch-neuronx (put on the path by ``nxd-compat-run`` with the torch_xla
one, only when torch-xla is absent): ``torch_neuronx.utils.get_platform_target`` answers that this
is not a Neuron platform; everything else torch-neuronx does (tracing, compiling, Neuron kernels)
needs Neuron hardware and raises saying so."""

from typing import Any

NXD_STAND_IN = True


def needs_neuron(name: str) -> RuntimeError:
    return RuntimeError(f"torch_neuronx.{name} needs Neuron hardware and torch-neuronx (XLA tracing/compilation for "
                        "Trainium/Inferentia); this run uses nxd-compat's stand-in on CPU/CUDA, which provides only "
                        "torch_neuronx.utils.get_platform_target")


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise needs_neuron(name)
