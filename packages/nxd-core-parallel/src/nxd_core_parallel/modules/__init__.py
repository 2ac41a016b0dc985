"""Higher-level TP modules: fused GQA QKV projection, RMSNorm."""
