"""empo2: EMPO² (memory-augmented hybrid on-/off-policy RL for LLM agents), reproducible on a laptop."""

from pathlib import Path

__version__ = "0.1.0"

ROOT = Path(__file__).resolve().parents[1]
"""The checkout the package runs from: notebooks/, results/ and README.md live here."""
