"""The Llama 2/3/3.x family on nxd's parallel layers, with Hugging Face import/export."""

__version__ = "0.1.0"
