"""Launching jobs beyond one process: the per-node ``torch.distributed.run`` command and its checks (:mod:`.nodes`).

The command-line scripts (``scripts/training/run_recipe.py``, ``scripts/performance/launch.py``) build their torchrun
command here; the training itself (``megatron_bridge.training``) knows nothing about nodes or schedulers. torch's own
launcher (its elastic agent) runs the processes, rendezvous and restarts: this package only chooses its flags and
checks them before anything starts. Importing it is free of torch.
"""
