"""LoRA on plain and tensor-parallel layers with PEFT-compatible safetensors adapters."""

__version__ = "0.1.0"
