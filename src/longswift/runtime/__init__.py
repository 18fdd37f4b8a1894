"""The model runtime: transformer, attention, rope, linears, KV caches, memory plan, loading (GGUF,
safetensors, transformers objects), tensor parallelism."""
