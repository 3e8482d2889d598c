"""A run's workdir: orbax checkpoints, config.json and the tokenizer, restored parameters, metrics logs."""
