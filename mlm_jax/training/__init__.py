"""Training: resolve (config -> checked, frozen), provision, the trainer, optim, the one loop, AOT."""
