"""Training: config tree, the pretrain loop, the GPT forward step, optimizer and schedule."""
