"""Accelerators the plan knows: memory, dense bf16 peak and link bandwidth (overridable with
``--device-memory`` / ``--peak-tflops`` / ``--link-gbps``). Public datasheet figures."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Device:
    name: str
    #: memory per device (one NeuronCore-v2 pair on trn1 = one XLA device, as NxDT counts them)
    memory_gib: float
    #: dense bf16 peak per device, TFLOP/s
    peak_tflops: float
    #: bandwidth between devices of a node (per device, one direction), GB/s
    intra_node_gbps: float
    #: bandwidth per device across nodes, GB/s
    inter_node_gbps: float
    devices_per_node: int


DEVICES: dict[str, Device] = {
    # trn1.32xlarge: 16 Trainium chips = 32 NeuronCores-v2 (NxDT's devices: 32), 16 GiB HBM and
    # ~95 TFLOP/s bf16 per core, NeuronLink-v2 ~ 384 GB/s per chip, 800 Gbps EFA per instance
    "trn1": Device("trn1", 16.0, 95.0, 96.0, 3.1, 32),
    # trn2.48xlarge: 16 Trainium2 chips, NxDT runs 4 logical cores per chip as 64 devices: 24 GiB
    # and ~167 TFLOP/s dense bf16 each, NeuronLink-v3, 3.2 Tbps EFA per instance
    "trn2": Device("trn2", 24.0, 167.0, 128.0, 6.25, 64),
    # H100 SXM: 80 GB HBM3, 989 TFLOP/s dense bf16, NVLink 450 GB/s per direction, 400 Gbps IB per GPU
    "h100": Device("h100", 80.0 * 1e9 / 2**30, 989.0, 450.0, 50.0, 8),
    # H200: 141 GB HBM3e, same compute and links as H100
    "h200": Device("h200", 141.0 * 1e9 / 2**30, 989.0, 450.0, 50.0, 8),
    # this machine's CPU: "memory" is unbounded for planning; a rough AVX2-FMA fp32 figure
    "cpu": Device("cpu", float("inf"), 0.1, 10.0, 1.0, 1),
}


def device_for(config, override: str | None = None) -> Device:
    """The device the config's trainer runs on: ``--device``, else from ``trainer.accelerator`` and
    the devices per node (32 -> trn1, 64 -> trn2, xla -> trn1, cuda/auto -> h100, cpu -> cpu)."""
    if override:
        key = override.lower()
        if key not in DEVICES:
            raise ValueError(f"--device {override!r}: known devices are {', '.join(DEVICES)}")
        return DEVICES[key]
    accel = (config.trainer.accelerator or "auto").lower()
    per_node = config.trainer.devices
    if accel == "cpu":
        return DEVICES["cpu"]
    if accel == "xla" or per_node in (32, 64):
        return DEVICES["trn2" if per_node == 64 else "trn1"]
    return DEVICES["h100"]


def with_overrides(device: Device, memory_gib: float | None, peak_tflops: float | None,
                   link_gbps: float | None) -> Device:
    changes = {}
    if memory_gib is not None:
        changes["memory_gib"] = float(memory_gib)
    if peak_tflops is not None:
        changes["peak_tflops"] = float(peak_tflops)
    if link_gbps is not None:
        changes["inter_node_gbps"] = float(link_gbps)
    return replace(device, **changes) if changes else device
