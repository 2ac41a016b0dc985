"""torchtitan interop: checkpoints (``nxd ckpt convert --from/--to torchtitan``) and model configs of
the families nxd and torchtitan share (Llama 3, Qwen3), both ways. docs/torchtitan.md."""
