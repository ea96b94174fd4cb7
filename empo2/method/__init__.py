"""The method: rollouts in the three modes, the memory of tips, the novelty bonus, advantages, the loss and the
update, and the trainer that runs them. Imports `llm`, `envs` and the shared modules, never `analysis`."""
