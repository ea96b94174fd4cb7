"""empo2: EMPO² (memory-augmented hybrid on-/off-policy RL for LLM agents), reproducible on a laptop."""

__version__ = "0.1.0"
