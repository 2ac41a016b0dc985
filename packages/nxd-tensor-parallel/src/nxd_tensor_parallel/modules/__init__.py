"""Higher-level modules: fused GQA QKV projection, RMSNorm, rotary embeddings, the attention mask."""
