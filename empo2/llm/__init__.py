"""The language model: loading the policy and the embedder, constrained decoding over admissible actions, sampling
with a reused cache, log-probs for the update, and the vLLM engine. Imports the shared modules and `envs` only."""
