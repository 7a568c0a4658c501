"""Drop-ins that put a profile's candidates under a real model, and a rollout engine on the same candidates.

- ``qwen3``: swaps every chain node of Hugging Face transformers' ``Qwen3ForCausalLM`` (embedding, norms,
  QK-norm, RoPE, attention, the projections, SwiGLU, lm_head, logprob) for a profile's candidates.
- ``rollout``: continuous batching, chunked prefill, decode against a KV cache, and a sampler keyed by
  (request id, position).

transformers is an optional extra (``pip install ws1-kernels[transformers]``): importing ``ws1_kernels`` or this
package never imports it; only the functions that build a transformers model do. See docs/chain.md.
"""
